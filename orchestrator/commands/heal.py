"""Self-healing commands: ``orch supervise`` (``orch check --heal`` is a flag of check)."""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import typer

from orchestrator.commands._app import (
    app,
    db_option,
    load_inventory,
    notify_cmd_option,
    notify_option,
)


def emit_line(as_json: bool, kind: str, text: str, data: dict[str, Any] | None = None) -> None:
    """One event on stdout: a line for people, or one JSON object per line (``--json-lines``)."""
    if as_json:
        sys.stdout.write(
            json.dumps({"event": kind, **(data or {"line": text})}, default=str) + "\n"
        )
    else:
        sys.stdout.write(text + "\n")
    sys.stdout.flush()


@app.command("supervise")
def supervise_cmd(
    targets: list[str] = typer.Argument(
        None, help="Containers to supervise (default: every one with a restart: policy)."
    ),
    interval: float = typer.Option(
        5.0, "--interval", min=0.2, metavar="S", help="Seconds between observation rounds."
    ),
    timeout: float = typer.Option(
        30.0, "--timeout", metavar="S", help="Seconds a target may take to answer a round."
    ),
    db: Path | None = db_option("holding the restart journal and budget; share it with orch check"),
    notify: str | None = notify_option(),
    notify_cmd: str | None = notify_cmd_option(),
    drain: float = typer.Option(
        120.0,
        "--drain",
        metavar="S",
        help="On SIGTERM/SIGINT, wait this long for restarts in flight to finish.",
    ),
    rounds: int | None = typer.Option(
        None, "--rounds", min=1, help="Stop after this many rounds (default: run until stopped)."
    ),
    json_lines: bool = typer.Option(
        False, "--json-lines", help="One JSON object per event instead of lines."
    ),
) -> None:
    """Keep runs alive: restart a dead run when its diagnosis says a restart helps, page once
    when it does not (docs/self-healing.md).

    Foreground and long-running (run it under systemd). Each round observes every target with
    a restart: policy, decides with the same function as `orch check --heal`, journals the
    decision in the history database and carries out restarts (relaunch with --resume auto, or
    the playbook's procedure such as prewarm-relaunch). SIGTERM or SIGINT stops it cleanly;
    a second one exits at once. Exit codes: 0 stopped; 2 no target with a policy, bad flags;
    3 the history database cannot be used; 1 restarts were still running at exit.
    """
    import shlex

    from orchestrator.heal.healer import Healer, HealOptions, whoami
    from orchestrator.heal.supervise import SuperviseOptions, supervise, supervised_units

    inventory = load_inventory()
    units = supervised_units(inventory, targets or [])
    opts = HealOptions(
        db_path=db,
        by=whoami("orch supervise"),
        webhook_url=notify,
        notify_cmd=shlex.split(notify_cmd) if notify_cmd else None,
    )
    healer = Healer(
        inventory,
        opts,
        on_entry=lambda e: emit_line(json_lines, "journal", e.line(), e.to_dict()),
        echo=lambda line: emit_line(json_lines, "step", line),
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():  # the second signal: leave now; open claims are closed by the next one
            raise SystemExit(128 + signum)
        emit_line(
            json_lines,
            "stopping",
            f"orch supervise: {signal.Signals(signum).name}: "
            f"stopping (restarts in flight get {drain:g} s)",
            {"signal": signum},
        )
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        emit_line(
            json_lines,
            "start",
            f"orch supervise: {', '.join(units)} every {interval:g} s; journal {healer.db_path}",
            {"units": units, "db": str(healer.db_path), "by": opts.by},
        )
        left = supervise(
            inventory,
            healer,
            SuperviseOptions(
                names=units, interval_s=interval, timeout_s=timeout, drain_s=drain, rounds=rounds
            ),
            stop,
            on_problem=lambda p: emit_line(json_lines, "problem", f"orch supervise: {p}"),
        )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    emit_line(
        json_lines,
        "stopped",
        f"orch supervise: stopped ({left} restart(s) in flight)",
        {"in_flight": left},
    )
    raise typer.Exit(1 if left else 0)
