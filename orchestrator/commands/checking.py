"""The body of ``orch check`` (no typer): ``check`` runs one health check and returns its
exit code. ``orchestrator/commands/views.py`` registers the typer command that calls it;
``orchestrator/commands/fastcheck.py`` calls it without typer for the argv it can parse.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.commands._base import load_inventory, print_json
from orchestrator.errors import OrchError


def check(
    targets: list[str],
    *,
    as_json: bool = False,
    notify: str | None = None,
    notify_cmd: str | None = None,
    renotify: float = 4.0,
    db: Path | None = None,
    timeout: float = 30.0,
    jobs: int = 32,
    critical: list[str] | tuple[str, ...] = (),
    heal: bool = False,
    perfdata: bool = True,
) -> int:
    """One health check of ``targets`` (all when empty), printed as lines or one JSON
    document; the Nagios exit code (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN). The options
    are ``orch check``'s (``--help``)."""
    import shlex

    from orchestrator.monitor import sweep
    from orchestrator.views import check

    opts = sweep.CheckOptions(
        names=list(targets),
        db_path=db,
        timeout_s=timeout,
        workers=jobs,
        renotify_h=renotify,
        webhook_url=notify,
        notify_cmd=shlex.split(notify_cmd) if notify_cmd else None,
        critical_kinds=[k for k in critical if k != "none"],
    )
    try:  # a check that cannot run is UNKNOWN (3) to Nagios, whatever the cause
        inventory = load_inventory()
        report = sweep.run_check(inventory, opts)
    except OrchError as exc:
        if as_json:
            print_json({"status": "UNKNOWN", "targets": [], "problems": [str(exc)]})
        else:
            print(f"ORCH UNKNOWN - {exc}")
        return sweep.UNKNOWN
    containers = [inventory.container(r.name) for r in report.targets]
    healed = _heal(inventory, report, opts) if heal else None
    if as_json:
        doc = check.to_json(report)
        if healed is not None:
            doc["heal"] = [e.to_dict() for e in healed[0]]
            doc["problems"] += healed[1]
        print_json(check.redact_report(doc, containers))
    else:
        lines = check.lines(report, sweep.playbook_titles())
        if healed is not None:
            lines += [f"HEAL {e.line()}" for e in healed[0]]
            lines += [f"UNKNOWN heal: {p}" for p in healed[1]]
        if perfdata:
            from orchestrator.views.perfdata import with_perfdata

            limits = {r.name: inventory.container(r.name).limits for r in report.targets}
            lines = with_perfdata(lines, report, limits)
        print(check.redact_report("\n".join(lines), containers), flush=True)
    return report.status


def _heal(inventory: Any, report: Any, opts: Any) -> tuple[list[Any], list[str]]:
    """``--heal``: decide for the checked targets, carry out the restarts (here, in turn), send
    the notices; the journal entries written and the problems."""
    from orchestrator.heal.healer import Healer, HealOptions, whoami

    entries: list[Any] = []
    healer = Healer(
        inventory,
        HealOptions(
            db_path=opts.db_path,
            by=whoami("orch check --heal"),
            webhook_url=opts.webhook_url,
            notify_cmd=opts.notify_cmd,
        ),
        on_entry=entries.append,
    )
    for restart in healer.round(report.targets):
        healer.execute(restart)
    return entries, healer.notify()
