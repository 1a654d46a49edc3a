"""The shared Typer ``app`` of orch, its root options and the helpers every command uses.

``orchestrator/cli.py`` is the entry point and re-exports these names; the command
modules beside this one import them from here, so ``python -m orchestrator.cli`` (where
cli.py runs as ``__main__``) and the ``orch`` script register on the one same ``app``.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from orchestrator import __version__
from orchestrator.errors import OrchError

if TYPE_CHECKING:
    from rich.console import Console

    from orchestrator.config.inventory import Inventory

app = typer.Typer(
    name="orch",
    help="Launch, watch and explain training runs in Proxmox LXC containers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class _LazyConsole:
    """A rich ``Console`` made on first use: ``orch check --json`` (and every plain-text path)
    prints without rich, so it does not import it (~25 ms of every one-shot command)."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._console: Console | None = None

    def _get(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._kwargs)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)

    # Dunders are looked up on the type, not through __getattr__: rich's Live does
    # `with self.console:` (a proxy without these crashed `orch watch` on a terminal).
    def __enter__(self) -> Console:
        return self._get().__enter__()

    def __exit__(self, *exc: object) -> None:
        self._get().__exit__(*exc)  # type: ignore[arg-type]


def real_console(console: Console) -> Console:
    """The rich ``Console`` behind ``out_console``/``err_console`` (made now if not yet), for
    rich objects that keep it (Live, progress bars): they may set attributes on it or use it
    where a proxy is not enough."""
    return console._get() if isinstance(console, _LazyConsole) else console


err_console: Console = _LazyConsole(stderr=True)  # type: ignore[assignment]
out_console: Console = _LazyConsole()  # type: ignore[assignment]


class State:
    """Options given before the command (``orch -c hosts.yaml status``)."""

    config: Path | None = None
    verbose: int = 0


state = State()


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
    state.config = config
    state.verbose = verbose
    logging.basicConfig(
        level=logging.WARNING - 10 * min(verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def report_error(exc: OrchError) -> None:
    """The one form of an ``OrchError`` on the terminal: ``error: <message>`` in red on stderr.

    Text, not markup: the message may quote hosts.yaml content such as "[/x]" or ":smile:".
    """
    from rich.text import Text

    from orchestrator.wire.text import visible

    line = Text.assemble(("error:", "bold red"), " ", visible(str(exc), multiline=True))
    err_console.print(line, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    """Machine output: one JSON document on stdout."""
    from orchestrator.wire.text import json_safe

    text = json.dumps(json_safe(data), indent=2, sort_keys=False, default=str, allow_nan=False)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


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


def load_inventory() -> Inventory:
    """The inventory named by ``-c`` / ``$ORCH_CONFIG`` / the lookup order (config/inventory.py)."""
    from orchestrator.config.inventory import load_inventory as _load

    return _load(state.config)
