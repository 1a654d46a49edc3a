"""Typer glue only: parse flags, call the module that does the work, render, exit.

Every ``OrchError`` is handled here in one place: one red ``error:`` line on
stderr and the error's documented exit code. Anything else is a bug: its
traceback is shown with a line asking for a report.

Each command group lives in its own section below; the work itself lives in the
modules they call (launch.py, postmortem.py, views/...).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from orchestrator import __version__
from orchestrator.errors import OrchError

app = typer.Typer(
    name="orch",
    help="Launch, watch and explain training runs in Proxmox LXC containers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
err_console = Console(stderr=True)
out_console = Console()


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
        None, "-c", "--config", help="hosts.yaml to use (else $ORCH_CONFIG, ./hosts.yaml, "
        "~/.config/orch/hosts.yaml).", envvar=None
    ),
    verbose: int = typer.Option(0, "-v", "--verbose", count=True, help="More log output (-vv: debug)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    state.config = config
    state.verbose = verbose
    logging.basicConfig(
        level=logging.WARNING - 10 * min(verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def print_json(data: Any) -> None:
    """Machine output: one JSON document on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def load_inventory():  # type: ignore[no-untyped-def]
    """The inventory named by ``-c`` / ``$ORCH_CONFIG`` / the lookup order (config.py)."""
    from orchestrator.config import load_inventory as _load

    return _load(state.config)


# --- foundation: hosts, trust, sandbox -------------------------------------------------------

# --- agent -----------------------------------------------------------------------------------

# --- launch lifecycle ------------------------------------------------------------------------

# --- detection: diagnose, postmortem, playbook -----------------------------------------------

# --- views: watch, check, export -------------------------------------------------------------

# --- first five minutes: demo, init, doctor --------------------------------------------------


def run(argv: list[str] | None = None) -> int:
    """Run orch with ``argv`` (default: ``sys.argv[1:]``) and return the exit code.

    Tests call this directly (with pytest's ``capsys``) to check codes and messages.
    """
    import click

    try:
        rv = app(args=argv, prog_name="orch", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except OrchError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        err_console.print("aborted")
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception:  # noqa: BLE001 - last resort: a bug, show it
        import traceback

        traceback.print_exc()
        err_console.print(
            "[bold red]orch crashed: this is a bug.[/] Please report it with the traceback above."
        )
        return 70


def main() -> None:
    """Console-script entry point."""
    sys.exit(run())


if __name__ == "__main__":
    main()
