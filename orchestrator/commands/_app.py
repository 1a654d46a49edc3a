"""The shared Typer ``app`` of orch, its root options and the helpers every command uses.

``orchestrator/cli.py`` is the entry point and re-exports these names; the command
modules beside this one import them from here, so ``python -m orchestrator.cli`` (where
cli.py runs as ``__main__``) and the ``orch`` script register on the one same ``app``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from orchestrator import __version__
from orchestrator.commands._base import (  # re-exported: the names command modules import
    State,
    _LazyConsole,
    err_console,
    load_inventory,
    out_console,
    print_json,
    real_console,
    report_crash,
    report_error,
    set_root_options,
    state,
)

__all__ = [
    "State",
    "_LazyConsole",
    "app",
    "db_option",
    "err_console",
    "load_inventory",
    "notify_cmd_option",
    "notify_option",
    "out_console",
    "print_json",
    "real_console",
    "report_crash",
    "report_error",
    "state",
]

app = typer.Typer(
    name="orch",
    help="Launch, watch and explain training runs in Proxmox LXC containers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"orch {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    config: Path | None = typer.Option(
        None,
        "-c",
        "--config",
        help="hosts.yaml to use (else $ORCH_CONFIG, ./hosts.yaml, ~/.config/orch/hosts.yaml).",
        envvar=None,
    ),
    verbose: int = typer.Option(
        0, "-v", "--verbose", count=True, help="More log output (-vv: debug)."
    ),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    set_root_options(config, verbose)


def db_option(what: str = "whose restart journal is shown") -> Any:
    """``--db PATH``: the history database (one definition for every command that reads it)."""
    return typer.Option(
        None,
        "--db",
        help=f"History database {what} (default $ORCH_DB or ~/.local/state/orch/orch.db).",
    )


def notify_option() -> Any:
    """``--notify URL`` (``$ORCH_WEBHOOK``): check's alerts, supervise's notices and pages."""
    return typer.Option(
        None,
        "--notify",
        metavar="URL",
        envvar="ORCH_WEBHOOK",
        show_envvar=True,
        help="Webhook for alerts (POST JSON with a Slack-compatible 'text'); $ORCH_WEBHOOK keeps the URL out of ps.",
    )


def notify_cmd_option() -> Any:
    """``--notify-cmd CMD``: the same JSON on a command's stdin."""
    return typer.Option(
        None,
        "--notify-cmd",
        metavar="CMD",
        help="Command run with the alert JSON on stdin (split like a shell would, run without one).",
    )
