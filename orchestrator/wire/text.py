"""Remote text and documents made safe at the boundary (pure, stdlib only: ships in the agent).

Everything that comes from a container or a host (log lines, ``tee.err``, run ids, process
names, paths, manifest fields, metrics) is untrusted: the training code, a library or a
non-root user may write it. Before it is rendered anywhere (terminal, ``--plain``, report.md
and report.html, JSON text fields, alerts) it passes :func:`visible`:

- C0 controls and DEL become their Unicode control pictures (``\\x1b`` -> ``␛``, U+241B), so
  a terminal never interprets an escape sequence (a title change, OSC 52 to the clipboard, a
  cleared screen); tab and newline are kept only where the caller asks (multi-line text).
- C1 controls (U+0080-U+009F: ``\\x9b`` is a one-byte CSI) and the bidirectional overrides and
  isolates (U+202A-U+202E, U+2066-U+2069, U+200E/U+200F, U+061C: "Trojan Source",
  CVE-2021-42574) are shown as ``\\u202e``-style escapes.

Numbers read from a container are range-checked here too (:func:`bounded_int`,
:func:`plausible_time`), and JSON documents are parsed with size and depth limits
(:func:`loads_bounded`): ``"[" * 5000`` is a :class:`BadDocument`, never a RecursionError.
"""

from __future__ import annotations

import json
import math
from typing import Any

_BIDI = frozenset([0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)])
_TABLE: dict[int, str] = {c: chr(0x2400 + c) for c in range(0x20)}
_TABLE[0x7F] = "\u2421"
_TABLE.update({c: f"\\x{c:02x}" for c in range(0x80, 0xA0)})
_TABLE.update({c: f"\\u{c:04x}" for c in _BIDI})
_MULTI = dict(_TABLE)
del _MULTI[0x0A], _MULTI[0x09]
_SAME = {**_TABLE, **{c: "\ufffd" for c in (*range(0x80, 0xA0), *_BIDI)}}

MAX_STEP = 2**53
"""A step is an int in ``[0, 2**53)`` (the largest a float, and so JSON, holds exactly)."""
MIN_TIME = 946684800.0
"""2000-01-01T00:00:00Z: a Unix time in seconds before this is not a time of a run."""
MAX_TIME = 4102444800.0
"""2100-01-01T00:00:00Z: one after this is milliseconds or nanoseconds, not seconds."""
MAX_DEPTH = 64
"""Nesting a document read from a container may have (manifest.json, metrics.jsonl)."""

BAD_DATA_PREFIX = "bad data"
"""Snapshot errors of a value from the container out of range or a document not read
(``bad data: train.log metrics: step out of range``): the ``bad-metrics`` finding."""


class BadDocument(ValueError):
    """A document from a container that is too big, too deep or not JSON (message says which)."""


def visible(text: str, *, multiline: bool = False, same_length: bool = False) -> str:
    """``text`` with every control character and bidi override shown, never interpreted.

    ``multiline`` keeps newlines and tabs (a log excerpt, ``tee.err``); a one-line field
    (a run id, a process name) shows them too.

    >>> visible("\\x1b]0;pwned\\x07ok")
    '␛]0;pwned␇ok'
    >>> visible("a\\x9b2Jb\\u202ec")
    'a\\\\x9b2Jb\\\\u202ec'
    >>> visible("two\\nlines\\ttab", multiline=True)
    'two\\nlines\\ttab'
    >>> visible("two\\nlines")
    'two␊lines'
    >>> visible("a\x9bb\x1b", same_length=True)
    'a\ufffdb␛'
    >>> visible("plain step=1 loss=2.0 [a,b]")
    'plain step=1 loss=2.0 [a,b]'
    """
    if text.isprintable() and not any(ord(c) in _BIDI for c in text):
        return text
    return text.translate(_SAME if same_length else _MULTI if multiline else _TABLE)


def fence(text: str) -> str:
    """A Markdown code fence ``text`` cannot close: one backtick longer than its longest run.

    >>> fence("no ticks"), fence("```"), fence("a ```` b")
    ('```', '````', '`````')
    """
    longest = run = 0
    for c in text:
        run = run + 1 if c == "`" else 0
        longest = max(longest, run)
    return "`" * max(3, longest + 1)


MAX_COMMAND_CHARS = 256
"""The longest command line carried for a process (``GpuProcess.command``); longer ends in ``…``."""
MAX_CMDLINE_BYTES = 4096
"""How much of ``/proc/PID/cmdline`` is read (the kernel gives up to a page per read)."""


def command_line(raw: bytes | None, *, limit: int = MAX_COMMAND_CHARS) -> str | None:
    r"""A process's ``/proc/PID/cmdline`` (NUL-separated arguments, written by the process
    itself: hostile) as one line: arguments joined by spaces, one with a space in it quoted,
    secret-looking values masked (:func:`orchestrator.wire.secrets.mask_argv`), every control
    character and bidi override shown (:func:`visible`), cut to ``limit`` characters. ``None``
    for an empty one (a kernel thread, a zombie). A process that rewrote its title into one
    argument (``setproctitle``) reads as that title, as nvitop shows it
    (``nvitop/api/process.py`` ``command_join``, v1.7.0).

    >>> command_line(b"python3\x00train.py\x00--hf-token=hf_abc\x00")
    'python3 train.py --hf-token=***'
    >>> command_line(b"sh\x00-c\x00echo hi\x00")
    'sh -c "echo hi"'
    >>> command_line(b"evil\x1b]0;pwned\x07\x00"), command_line(b""), command_line(None)
    ('evil␛]0;pwned␇', None, None)
    >>> len(command_line(b"x" * 5000))
    256
    """
    if not raw:
        return None
    from orchestrator.wire.secrets import mask_argv

    text = raw[:MAX_CMDLINE_BYTES].decode("utf-8", "replace")
    args = text.rstrip("\0").split("\0")
    args = mask_argv(args)
    line = " ".join(f'"{a}"' if (" " in a or not a) and '"' not in a else a for a in args)
    line = visible(line)
    if not line.strip():
        return None
    return line if len(line) <= limit else line[: limit - 1] + "…"


def bounded_int(value: object, *, lo: int = 0, hi: int = MAX_STEP) -> int | None:
    """``value`` as an int in ``[lo, hi)``; ``None`` for anything else (inf, NaN, a bool,
    a 400-digit number, a string).

    >>> bounded_int(120), bounded_int(120.0), bounded_int(float("inf")), bounded_int(10**400)
    (120, 120, None, None)
    >>> bounded_int(-1), bounded_int(True), bounded_int("7"), bounded_int(1.5)
    (None, None, None, None)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            return None
        value = int(value)
    if not isinstance(value, int):
        return None
    return value if lo <= value < hi else None


def plausible_time(value: object) -> float | None:
    """``value`` as a Unix time in seconds between 2000 and 2100; ``None`` for anything else
    (a time in milliseconds or nanoseconds, NaN, a string).

    >>> plausible_time(1764633600), plausible_time(1764633600123), plausible_time(float("nan"))
    (1764633600.0, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        t = float(value)
    except OverflowError:
        return None
    return t if MIN_TIME <= t <= MAX_TIME else None


def finite(value: object) -> float | None:
    """``value`` as a finite float; ``None`` for inf, NaN, an overflowing int or a non-number.

    >>> finite(2.5), finite(float("inf")), finite(10**400), finite("1")
    (2.5, None, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def json_safe(doc: Any) -> Any:
    """``doc`` with every NaN and infinity replaced by ``None``, so ``json.dumps(...,
    allow_nan=False)`` writes valid JSON (bare ``NaN`` is not JSON, RFC 8259 section 6).

    >>> json_safe({"loss": float("nan"), "xs": [1.0, float("inf")], "t": (2, "a")})
    {'loss': None, 'xs': [1.0, None], 't': [2, 'a']}
    """
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: json_safe(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [json_safe(v) for v in doc]
    return doc


def _depth(doc: Any, limit: int) -> bool:
    """Whether ``doc`` nests at most ``limit`` containers deep (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            if d > limit:
                return False
            stack.extend((child, d + 1) for child in node if isinstance(child, (dict, list)))
    return True


def loads_bounded(
    text: str | bytes, *, max_bytes: int = 8 << 20, max_depth: int = MAX_DEPTH
) -> Any:
    """JSON from a container, with size and depth limits.

    Raises:
        BadDocument: larger than ``max_bytes``, nested deeper than ``max_depth``, or not
            JSON (the message says which, at most 200 characters).

    >>> loads_bounded('{"a": [1, 2]}')
    {'a': [1, 2]}
    >>> loads_bounded("[" * 5000)
    Traceback (most recent call last):
    ...
    orchestrator.wire.text.BadDocument: nested deeper than 64 levels
    >>> loads_bounded("[[[1]]]", max_depth=2)
    Traceback (most recent call last):
    ...
    orchestrator.wire.text.BadDocument: nested deeper than 2 levels
    """
    if len(text) > max_bytes:
        raise BadDocument(f"larger than {max_bytes} bytes ({len(text)})")
    try:
        doc = json.loads(text)
    except RecursionError:
        raise BadDocument(f"nested deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadDocument(f"not JSON: {exc}"[:200]) from None
    if not _depth(doc, max_depth):
        raise BadDocument(f"nested deeper than {max_depth} levels")
    return doc
