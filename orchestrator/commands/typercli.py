"""Typer glue only: every ``orch`` command through typer; parse flags, run a command, exit.

``orchestrator/cli.py`` (the entry point) comes here for every argv its fast path does
not take (``orchestrator/commands/fastcheck.py``).

Every ``OrchError`` is handled here in one place: one red ``error:`` line on
stderr and the error's documented exit code. Anything else is a bug: its
traceback is shown with a line asking for a report.

The shared ``app``, the root options (``State``/``state``) and the helpers live in
``orchestrator/commands/_app.py`` and are re-exported here; each section's commands
live in ``orchestrator/commands/<section>.py``; the work itself lives in the packages
they call (``lifecycle/``, ``postmortem/``, ``monitor/``, ``views/``, ...).
"""

from __future__ import annotations

import typer

from orchestrator.commands._app import (  # re-exported: the names callers import from here
    State,
    app,
    err_console,
    load_inventory,
    out_console,
    print_json,
    report_crash,
    report_error,
    state,
)
from orchestrator.errors import OrchError

# The import order is the order of `orch --help`: each module registers on `app`.
# isort: off
from orchestrator.commands import foundation  # noqa: F401 - registers hosts, trust, sandbox
from orchestrator.commands import agent  # noqa: F401 - registers facts, snapshot
from orchestrator.commands import lifecycle  # noqa: F401 - launch, stop, logs, status, runs, attach
from orchestrator.commands import detection  # noqa: F401 - diagnose, postmortem, playbook
from orchestrator.commands import kernellog  # noqa: F401 - registers kernel
from orchestrator.commands import views  # noqa: F401 - registers watch, check, export
from orchestrator.commands import heal  # noqa: F401 - registers supervise
from orchestrator.commands import firstrun  # noqa: F401 - registers demo, init, doctor
# isort: on

__all__ = [
    "State",
    "app",
    "err_console",
    "load_inventory",
    "out_console",
    "print_json",
    "run",
    "state",
]


def _click_exception_types() -> tuple[
    tuple[type[BaseException], ...],
    tuple[type[BaseException], ...],
    tuple[type[BaseException], ...],
]:
    """(exit, abort, usage-error) exception classes of typer's click and of click itself.

    typer >= 0.20 carries its own copy of click (``typer._click``) and no longer installs
    click, so ``click`` may be missing; where both exist, either may raise.
    """
    exits: set[type[BaseException]] = {typer.Exit}
    aborts: set[type[BaseException]] = {typer.Abort}
    usage: set[type[BaseException]] = set()
    try:
        from typer._click import exceptions as vendored
    except ImportError:
        pass
    else:
        usage.add(vendored.ClickException)
    try:
        import click
    except ImportError:
        pass
    else:
        exits.add(click.exceptions.Exit)
        aborts.add(click.exceptions.Abort)
        usage.add(click.ClickException)
    return tuple(exits), tuple(aborts), tuple(usage)


def run(argv: list[str] | None = None) -> int:
    """Run orch with ``argv`` (default: ``sys.argv[1:]``) and return the exit code.

    Tests call this directly (with pytest's ``capsys``) to check codes and messages.
    """
    exit_types, abort_types, usage_types = _click_exception_types()
    try:
        rv = app(args=argv, prog_name="orch", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except OrchError as exc:
        report_error(exc)
        return exc.exit_code
    except exit_types as exc:
        return int(getattr(exc, "exit_code", 0) or 0)
    except abort_types:
        err_console.print("aborted")
        return 130
    except usage_types as exc:
        exc.show()  # type: ignore[attr-defined]
        return int(getattr(exc, "exit_code", 2))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception:  # noqa: BLE001 - last resort: a bug, show it
        return report_crash()
