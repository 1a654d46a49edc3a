"""``orch check`` without typer: a parser for the argv it is sure of, else typer's path.

``orch check`` runs from cron on every target of a fleet, and typer (with click, and pydantic
for its parameter types) costs ~150 ms of CPU a run before the check starts
(docs/ARCHITECTURE.md, "Performance"). :func:`parse` takes only the plain forms: root options
``-c/--config FILE`` and ``-v/-vv/--verbose`` before ``check``, then ``check``'s own options
(:data:`CHECK_OPTIONS`, as ``--opt VALUE`` or ``--opt=VALUE``), targets, ``--``. Anything
else (``--help``, ``--version``, an unknown or malformed option, a value typer would refuse
or one that looks like an option, an empty value) returns ``None`` and the whole argv goes
through typer, so help, usage errors and their exit codes are typer's own.
``tests/commands/test_fastcheck.py`` checks the table against the typer command and that
both paths give the command the same arguments for a table of argvs.
"""

from __future__ import annotations

import errno
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.commands._base import (
    err_console,
    report_crash,
    report_error,
    set_root_options,
)
from orchestrator.errors import OrchError

# option -> (keyword of checking.check, kind); kinds: flag (True), off (False), str, path,
# float (a plain decimal), int1 (a whole number >= 1), multi (repeatable str)
CHECK_OPTIONS: dict[str, tuple[str, str]] = {
    "--json": ("as_json", "flag"),
    "--notify": ("notify", "str"),
    "--notify-cmd": ("notify_cmd", "str"),
    "--renotify": ("renotify", "float"),
    "--db": ("db", "path"),
    "--timeout": ("timeout", "float"),
    "--jobs": ("jobs", "int1"),
    "--critical": ("critical", "multi"),
    "--heal": ("heal", "flag"),
    "--perfdata": ("perfdata", "flag"),
    "--no-perfdata": ("perfdata", "off"),
}
CHECK_DEFAULTS: dict[str, Any] = {
    "as_json": False,
    "notify": None,
    "notify_cmd": None,
    "renotify": 4.0,
    "db": None,
    "timeout": 30.0,
    "jobs": 32,
    "critical": [],
    "heal": False,
    "perfdata": True,
}
CHECK_ENVVARS: dict[str, str] = {"notify": "ORCH_WEBHOOK"}  # read when the option is absent
_FLOAT = re.compile(r"[0-9]+(\.[0-9]+)?")
_INT = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Parsed:
    """One ``orch check`` argv, parsed: the root options and ``check``'s keywords."""

    config: Path | None
    verbose: int
    kwargs: dict[str, Any] = field(default_factory=dict)


def _value(kind: str, text: str) -> Any:
    """``text`` as an option of ``kind`` would be given to the command; ``None`` if typer
    might read it otherwise (or refuse it)."""
    if kind in ("str", "multi"):
        return text
    if kind == "path":
        return Path(text)
    if kind == "float":
        return float(text) if _FLOAT.fullmatch(text) else None
    if kind == "int1":
        return int(text) if _INT.fullmatch(text) and int(text) >= 1 else None
    return None


def _root(argv: list[str]) -> tuple[Path | None, int, int] | None:
    """The root options before ``check``: (config, verbose, index of ``check``)."""
    config: Path | None = None
    verbose = 0
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "check":
            return config, verbose, i
        if tok in ("-c", "--config") and i + 1 < len(argv):
            text, i = argv[i + 1], i + 2
        elif tok.startswith("--config="):
            text, i = tok[len("--config=") :], i + 1
        elif tok == "--verbose" or re.fullmatch(r"-v+", tok):
            verbose += 1 if tok == "--verbose" else len(tok) - 1
            i += 1
            continue
        else:
            return None
        if not text or text.startswith("-"):
            return None
        config = Path(text)
    return None


def parse(argv: list[str], environ: Mapping[str, str]) -> Parsed | None:
    """``argv`` (without the program name) as an ``orch check`` this parser is sure of, or
    ``None``: then typer parses it (help, errors and every other command)."""
    root = _root(argv)
    if root is None:
        return None
    config, verbose, at = root
    kwargs = {k: (list(v) if isinstance(v, list) else v) for k, v in CHECK_DEFAULTS.items()}
    targets: list[str] = []
    given: set[str] = set()
    rest = argv[at + 1 :]
    i = 0
    while i < len(rest):
        tok = rest[i]
        i += 1
        if tok == "--":
            targets += rest[i:]
            break
        if not tok.startswith("-"):
            targets.append(tok)
            continue
        name, eq, inline = tok.partition("=")
        if name not in CHECK_OPTIONS:
            return None
        key, kind = CHECK_OPTIONS[name]
        if kind in ("flag", "off"):
            if eq:
                return None
            kwargs[key] = kind == "flag"
            continue
        if eq:
            text = inline
        elif i < len(rest):
            text, i = rest[i], i + 1
        else:
            return None
        if not text or text.startswith("-"):
            return None
        value = _value(kind, text)
        if value is None:
            return None
        if kind == "multi":
            kwargs[key].append(value)
        else:
            kwargs[key] = value
        given.add(key)
    for key, var in CHECK_ENVVARS.items():
        if key not in given and environ.get(var):
            kwargs[key] = environ[var]
    return Parsed(config=config, verbose=verbose, kwargs={"targets": targets, **kwargs})


class _QuietFlush:
    """A stream whose ``flush`` ignores a closed pipe (as click's ``PacifyFlushWrapper``, which
    typer's path puts in place after EPIPE), so the interpreter's exit does not complain."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def run(parsed: Parsed) -> int:
    """Run the parsed check and return its exit code, each failure as typer's path ends it
    (``typer.core._main`` and ``orchestrator/commands/typercli.run``): an ``OrchError`` its
    ``error:`` line and code, Ctrl-C 130, EOF ``aborted`` and 130, a closed stdout exit
    status 1, anything else a bug (traceback, 70)."""
    try:
        set_root_options(parsed.config, parsed.verbose)
        from orchestrator.commands.checking import check

        return check(**parsed.kwargs)
    except OrchError as exc:
        report_error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except EOFError:
        sys.stderr.write("\n")
        err_console.print("aborted")
        return 130
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            return report_crash()
        sys.stdout = _QuietFlush(sys.stdout)  # type: ignore[assignment]
        sys.stderr = _QuietFlush(sys.stderr)  # type: ignore[assignment]
        raise SystemExit(1) from None
    except Exception:  # noqa: BLE001 - last resort: a bug, show it
        return report_crash()
