"""What every command shares that needs no typer: the root options' ``state``, the lazily
made consoles, the one form of an error, JSON output and the inventory lookup.

``orchestrator/commands/_app.py`` re-exports these beside typer's ``app``; the fast path
of ``orch check`` (``orchestrator/commands/fastcheck.py``) uses them without importing
typer, click or pydantic (~150 ms of every one-shot command: docs/ARCHITECTURE.md,
"Performance").
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import OrchError

if TYPE_CHECKING:
    from rich.console import Console

    from orchestrator.config.inventory import Inventory


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


def set_root_options(config: Path | None, verbose: int) -> None:
    """What the root options do before any command runs: keep them, set up logging."""
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


def report_crash() -> int:
    """An exception that is not an ``OrchError`` is a bug: its traceback, a line asking for a
    report, exit code 70."""
    import traceback

    traceback.print_exc()
    err_console.print(
        "[bold red]orch crashed: this is a bug.[/] Please report it with the traceback above."
    )
    return 70


def print_json(data: Any) -> None:
    """Machine output: one JSON document on stdout."""
    from orchestrator.wire.text import json_safe

    text = json.dumps(json_safe(data), indent=2, sort_keys=False, default=str, allow_nan=False)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def load_inventory() -> Inventory:
    """The inventory named by ``-c`` / ``$ORCH_CONFIG`` / the lookup order (config/inventory.py)."""
    from orchestrator.config.inventory import load_inventory as _load

    return _load(state.config)
