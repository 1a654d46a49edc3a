"""View commands: ``orch watch`` (live), ``orch check`` (exit codes, alerts), ``orch export``."""

from __future__ import annotations

from pathlib import Path

import typer

from orchestrator.commands._app import (
    app,
    db_option,
    load_inventory,
    notify_cmd_option,
    notify_option,
    out_console,
    real_console,
)


@app.command("watch")
def watch_cmd(
    targets: list[str] = typer.Argument(
        None,
        help="Containers or jobs to watch (default: all); one container opens its detail "
        "view, a job shows its row and its nodes beneath.",
    ),
    interval: float | None = typer.Option(
        None,
        "--interval",
        min=0.2,
        help="Seconds between snapshots.",
        show_default="hosts.yaml poll_interval",
    ),
    plain: bool = typer.Option(
        False,
        "--plain",
        help="One line per change instead of the full-screen view (automatic when stdout is not a terminal).",
    ),
    db: Path | None = db_option(),
) -> None:
    """Live dashboard of every target: state, run, step, tokens/s, GPUs by role, findings.

    Keys: q quits, up/down select, Enter opens a target's detail (GPUs, evidence,
    pane tail, the restart journal), Esc goes back. Exit code 0 on q or Ctrl-C.
    """
    from orchestrator.commands.watching import watch

    raise typer.Exit(
        watch(
            load_inventory(),
            targets or [],
            interval_s=interval,
            plain=plain,
            console=real_console(out_console),
            db=db,
        )
    )


@app.command("check")
def check_cmd(
    targets: list[str] = typer.Argument(
        None, help="Containers or jobs to check (default: all in hosts.yaml)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of lines."),
    notify: str | None = notify_option(),
    notify_cmd: str | None = notify_cmd_option(),
    renotify: float = typer.Option(
        4.0,
        "--renotify",
        metavar="HOURS",
        help="Repeat an alert still active after this many hours.",
    ),
    db: Path | None = db_option("(alert state, history, the restart journal)"),
    timeout: float = typer.Option(
        30.0,
        "--timeout",
        metavar="S",
        help="Seconds a target may take to answer before it counts as unreachable.",
    ),
    jobs: int = typer.Option(
        32, "--jobs", min=1, help="Targets snapshotted at once (1 = strictly sequential)."
    ),
    critical: list[str] = typer.Option(
        [],
        "--critical",
        metavar="KIND",
        help="Finding kind to page for as CRITICAL even when a detector rates it a warning (repeatable; default: none).",
    ),
    heal: bool = typer.Option(
        False,
        "--heal",
        help="Also restart dead runs of targets with a restart: policy, deciding as orch supervise does (docs/self-healing.md).",
    ),
    perfdata: bool = typer.Option(
        True,
        "--perfdata/--no-perfdata",
        help="Nagios performance data after '|' (counts, tokens/s, GPU util and memory); never in --json.",
    ),
) -> None:
    """One health check of every target, for cron and Nagios.

    Exit codes: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (no target answered, or the
    check could not run). One line per problem; alerts are deduplicated through the
    history database (new, changed severity, repeat after --renotify hours, recovery).
    With --heal, each restart decision follows as a HEAL line (a "heal" list in --json);
    the exit code stays the check's, from what it observed before acting.
    """
    from orchestrator.commands.checking import check

    raise typer.Exit(
        check(
            targets or [],
            as_json=as_json,
            notify=notify,
            notify_cmd=notify_cmd,
            renotify=renotify,
            db=db,
            timeout=timeout,
            jobs=jobs,
            critical=critical,
            heal=heal,
            perfdata=perfdata,
        )
    )


@app.command("export")
def export_cmd(
    targets: list[str] = typer.Argument(None, help="Containers or jobs to export (default: all)."),
    listen: str | None = typer.Option(
        None, "--listen", metavar="HOST:PORT", help="Serve /metrics here, e.g. 127.0.0.1:9400."
    ),
    textfile: Path | None = typer.Option(
        None,
        "--textfile",
        metavar="PATH",
        help="Write node_exporter textfile metrics here (atomically).",
    ),
    interval: float | None = typer.Option(
        None,
        "--interval",
        metavar="S",
        help="Seconds between polls (default 15 with --listen; with --textfile alone: write once and exit).",
    ),
    timeout: float = typer.Option(
        30.0, "--timeout", metavar="S", help="Seconds a target may take to answer."
    ),
) -> None:
    """Prometheus metrics: dcgm-exporter GPU names and labels plus orch_* run and health gauges
    (a job: orch_job_state, orch_job_tokens_per_second, orch_job_node_*, orch_job_first_failure)."""
    from orchestrator.commands.exporting import serve
    from orchestrator.errors import UsageError
    from orchestrator.monitor.observe import select_jobs, select_targets
    from orchestrator.monitor.poller import Poller
    from orchestrator.views import export

    if not listen and not textfile:
        raise UsageError("orch export needs --listen HOST:PORT or --textfile PATH")
    if listen:
        try:
            export.parse_listen(listen)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    inventory = load_inventory()
    poller = Poller(
        inventory,
        select_targets(inventory, targets or []),
        timeout_s=timeout,
        jobs=select_jobs(inventory, targets or []),
    )
    try:
        serve(
            poller, listen=listen, textfile=str(textfile) if textfile else None, interval_s=interval
        )
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        raise UsageError(f"orch export: {exc}") from None
