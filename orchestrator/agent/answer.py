"""How an agent command answers: one JSON document on stdout and an exit code.

Exit codes: 0 done, 1 failed, 2 bad arguments, 4 refused (a live run is in the way; pass
``--force``). A :class:`RunError` becomes ``{"ok": false, "error": KIND, "message": ...}``
and its code (:func:`guard`). Standard library only (it runs in the container).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 4


class RunError(Exception):
    """A lifecycle command cannot go on; ``code`` is the agent's exit code."""

    def __init__(self, code: int, kind: str, message: str, **facts: Any) -> None:
        super().__init__(message)
        self.code, self.kind, self.message, self.facts = code, kind, message, facts


def emit(doc: Any) -> None:
    """Print ``doc`` as one compact JSON line on stdout and flush (non-JSON values as ``str``)."""
    sys.stdout.write(json.dumps(doc, separators=(",", ":"), default=str) + "\n")
    sys.stdout.flush()


def guard(fn: Any) -> Any:
    """Turn a :class:`RunError` into a JSON error document and its exit code."""

    def handler(args: argparse.Namespace) -> int:
        try:
            return int(fn(args))
        except RunError as exc:
            emit({"ok": False, "error": exc.kind, "message": exc.message, **exc.facts})
            return exc.code

    handler.__doc__ = fn.__doc__
    return handler
