"""The ``orch`` entry point: ``orch check`` through its fast path, everything else typer.

``orch check`` (run from cron on every target of a fleet) is parsed without typer, click or
pydantic when its argv is one ``orchestrator/commands/fastcheck.py`` is sure of; every other
argv, ``--help`` and usage errors included, goes to ``orchestrator/commands/typercli.py``
(the typer app, every ``OrchError`` handled in one place). The names other modules used to
import from here (``app``, ``state``, the consoles, ...) are still here, loaded on first use.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["main", "run"]
_FROM_TYPER = (
    "State",
    "app",
    "err_console",
    "load_inventory",
    "out_console",
    "print_json",
    "state",
)


def run(argv: list[str] | None = None) -> int:
    """Run orch with ``argv`` (default: ``sys.argv[1:]``) and return the exit code.

    Tests call this directly (with pytest's ``capsys``) to check codes and messages.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    from orchestrator.commands import fastcheck

    parsed = fastcheck.parse(args, os.environ)
    if parsed is not None:
        return fastcheck.run(parsed)
    from orchestrator.commands.typercli import run as run_typer

    return run_typer(args)


def main() -> None:
    """Console-script entry point."""
    sys.exit(run())


def __getattr__(name: str) -> Any:
    """``app``, ``state``, the consoles and helpers, from the typer side (loaded on first use)."""
    if name in _FROM_TYPER:
        from orchestrator.commands import typercli

        return getattr(typercli, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
