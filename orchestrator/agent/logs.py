"""Incremental log reading by byte offset: a snapshot never re-reads a whole log.

- First read (no offset): only the last ``tail_bytes`` are read; the partial
  first line of that window is dropped.
- Later reads: from the offset to the end, at most ``max_read_bytes``; when more
  than that was appended the reader jumps to the tail and says how much it skipped.
- Only complete lines are returned; an unterminated last line waits for its
  newline unless it already exceeds ``max_line_bytes``.
- A line longer than ``max_line_bytes`` is cut (``…[cut N bytes]``); invalid
  UTF-8 and control characters are replaced; a line redrawn in place with ``\\r``
  (a progress bar) gives its newest ``MAX_CR_SEGMENTS`` non-blank segments, one line
  each, oldest first: a ``tqdm.write`` message lands after the bar it cleared, and the
  bar's step and rate must not be lost with it.
- A missing, deleted or truncated log is data (``error``), never an exception.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

MAX_CR_SEGMENTS = 2
"""Segments kept of a raw line holding carriage returns. tqdm v4.66 ``tqdm/std.py``
``tqdm.write`` clears the bar (``clear``: ``'\\r' + spaces + '\\r'``), writes the message and
its newline, then redraws the bar, so a redirected log holds ``\\r bar1 \\r bar2 ... \\r
spaces \\r message\\n``: the newest bar and the message are the last two non-blank segments."""


def cr_segments(raw: bytes, max_line_bytes: int, keep: int = MAX_CR_SEGMENTS) -> list[bytes]:
    r"""The newest ``keep`` non-blank ``\r`` segments of ``raw``, oldest first (``[raw]``
    without a carriage return; ``[b""]`` when every segment is blank).

    Bounded: only the last ``(keep + 1) x (max_line_bytes + 1)`` bytes are split, so a
    megabyte of bar updates on one line costs no more than a few lines.

    >>> cr_segments(b"\r 1/9 [00:01]\r 2/9 [00:02]\r    \r{'loss': 2.5}", 100)
    [b' 2/9 [00:02]', b"{'loss': 2.5}"]
    >>> cr_segments(b"step 1", 100), cr_segments(b"\r   \r", 100)
    ([b'step 1'], [b''])
    """
    if b"\r" not in raw:
        return [raw]
    start = max(0, len(raw) - (keep + 1) * (max_line_bytes + 1))
    parts = raw[start:].split(b"\r")
    if start > 0 and len(parts) > 1:
        parts = parts[1:]  # the window may begin inside a segment
    kept = [p for p in parts if p.strip()]
    return kept[-keep:] or [b""]


def line_texts(raw: bytes, max_line_bytes: int) -> list[str]:
    r"""The lines one raw log line shows (:func:`cr_segments`, each through :func:`clean_line`).

    >>> line_texts(b"\r 3/9 [00:03, 1.0it/s]\r   \r{'loss': 2.5}", 100)
    [' 3/9 [00:03, 1.0it/s]', "{'loss': 2.5}"]
    """
    return [clean_line(seg, max_line_bytes) for seg in cr_segments(raw, max_line_bytes)]


@dataclass(frozen=True, slots=True)
class LogChunk:
    """What one read saw. ``offset`` is where the next read starts (bytes)."""

    lines: tuple[str, ...]
    offset: int
    size_bytes: int | None
    mtime: float | None
    bytes_read: int
    exists: bool
    error: str | None = None
    skipped_bytes: int = 0


def clean_line(raw: bytes, max_line_bytes: int) -> str:
    r"""Decode one log line safely and bound its length (of a line redrawn with ``\r``, its
    newest non-blank segment: :func:`line_texts` keeps more).

    >>> clean_line(b"step 1\r step 2 loss=0.5\r", 100)
    ' step 2 loss=0.5'
    >>> clean_line(b"ok\x00\xff\x1b[31mred", 100)
    'ok\ufffd\ufffd\ufffd[31mred'
    >>> clean_line(b"x" * 20, 8)
    'xxxxxxxx…[cut 12 bytes]'
    """
    if b"\r" in raw:
        raw = cr_segments(raw, max_line_bytes, keep=1)[-1]
    cut = len(raw) - max_line_bytes
    if cut > 0:
        raw = raw[:max_line_bytes]
    text = _CONTROL.sub("\ufffd", raw.decode("utf-8", "replace"))
    return f"{text}…[cut {cut} bytes]" if cut > 0 else text


def split_lines(
    data: bytes, max_line_bytes: int, *, at_start: bool, at_eof: bool
) -> tuple[list[str], int]:
    """Split ``data`` into complete lines; return (lines, bytes consumed).

    ``at_start``: data begins at a line start (else the first partial line is
    dropped). ``at_eof``: nothing follows, so an overlong partial last line is
    emitted (cut) rather than kept waiting.

    >>> split_lines(b"tail of a\\nline 2\\nline 3\\npart", 100, at_start=False, at_eof=True)
    (['line 2', 'line 3'], 24)
    >>> split_lines(b"a\\nb\\n", 100, at_start=True, at_eof=True)
    (['a', 'b'], 4)
    >>> split_lines(b"xxxxxxxxxx", 4, at_start=True, at_eof=True)
    (['xxxx…[cut 6 bytes]'], 10)
    """
    start = 0
    if not at_start:
        nl = data.find(b"\n")
        if nl < 0:
            return [], 0 if len(data) <= max_line_bytes else len(data)
        start = nl + 1
    end = data.rfind(b"\n")
    lines: list[str] = []
    consumed = start
    if end >= start:
        for raw in data[start:end].split(b"\n"):
            lines.extend(line_texts(raw.rstrip(b"\r"), max_line_bytes))
        consumed = end + 1
    rest = len(data) - consumed
    if at_eof and rest > max_line_bytes:
        lines.extend(line_texts(data[consumed:], max_line_bytes))
        consumed = len(data)
    return lines, consumed


class LogReader:
    """Reads one file incrementally; counts every byte it reads in ``bytes_read``.

    Args:
        tail_bytes: how much of the end a first read looks at.
        max_read_bytes: most bytes one later read takes before jumping to the tail.
        max_line_bytes: longest line kept whole.
        opener: opens a path for reading (default ``open(path, "rb")``; from the host, one
            that resolves it inside the container's root).
    """

    def __init__(
        self,
        tail_bytes: int = 16384,
        max_read_bytes: int = 1 << 20,
        max_line_bytes: int = 2000,
        opener: Callable[[str], BinaryIO] | None = None,
    ) -> None:
        self.tail_bytes = tail_bytes
        self.max_read_bytes = max_read_bytes
        self.max_line_bytes = max_line_bytes
        self.opener = opener

    def read(self, path: str, offset: int | None) -> LogChunk:
        """Lines appended to ``path`` since ``offset`` (``None``: the tail only)."""
        try:
            fh = self.opener(path) if self.opener else open(path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            err = "log deleted" if offset else None
            return LogChunk((), 0, None, None, 0, exists=False, error=err)
        except OSError as exc:
            return LogChunk(
                (),
                offset or 0,
                None,
                None,
                0,
                exists=False,
                error=f"log unreadable: {exc.strerror}",
            )
        with fh:
            st = os.fstat(fh.fileno())
            size = st.st_size
            error = None
            skipped = 0
            if offset is not None and offset > size:
                error = f"log truncated ({offset} -> {size} bytes)"
                offset = None
            if offset is None:
                start = max(0, size - self.tail_bytes)
            elif size - offset > self.max_read_bytes:
                start = size - self.tail_bytes
                skipped = start - offset
            else:
                start = offset
            fh.seek(start)
            data = fh.read(size - start)
            at_start = start == 0 or (offset is not None and start == offset)
            lines, consumed = split_lines(data, self.max_line_bytes, at_start=at_start, at_eof=True)
            if skipped:
                lines.insert(0, f"…[skipped {skipped} bytes]")
            return LogChunk(
                tuple(lines),
                start + consumed,
                size,
                st.st_mtime,
                len(data),
                exists=True,
                error=error,
                skipped_bytes=skipped,
            )


TAIL_BLOCK_BYTES = 64 * 1024


MAX_LINE_BYTES = 2000
"""Longest run-output line an answer carries whole (the snapshot's limit); longer ones are cut."""


MAX_TAIL_BYTES = 512 * 1024
"""Most bytes a tail reads from a file's end, and so about the most its lines hold (the
answer must stay far below the operator's 8 MiB limit, even after JSON escaping)."""


MAX_READ_BYTES = 1 << 20
"""Most bytes one ``logs --offset``/``--follow`` read takes (``--max-bytes`` is capped here)."""


def tail_lines(
    path: Path, n: int, *, max_line_bytes: int = MAX_LINE_BYTES, max_bytes: int = MAX_TAIL_BYTES
) -> tuple[list[str], int]:
    """The last ``n`` lines of ``path`` (the unterminated last one too) and its size in bytes.

    Bounded like the snapshot's log reader (:mod:`orchestrator.agent.logs`): reads
    64 KiB blocks from the end, never more than ``max_bytes`` in all; each line
    goes through :func:`~orchestrator.agent.logs.line_texts` (cut at
    ``max_line_bytes``, invalid UTF-8 and control characters replaced). When the
    window ends inside a line before ``n`` lines were found, the first line says
    ``…[skipped N bytes]``. A missing file gives ``([], 0)``.
    """
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            pos, buf = size, b""
            while pos > 0 and buf.count(b"\n") <= n and size - pos < max_bytes:
                step = min(TAIL_BLOCK_BYTES, pos, max_bytes - (size - pos))
                pos -= step
                fh.seek(pos)
                buf = fh.read(step) + buf
    except FileNotFoundError:
        return [], 0
    if n <= 0:
        return [], size
    raws = buf.split(b"\n")
    if raws[-1] == b"":
        raws.pop()
    skipped = 0
    if pos > 0 and raws:  # the window began inside a line
        skipped = pos + len(raws.pop(0)) + 1
    lines = [t for raw in raws[-n:] for t in line_texts(raw.rstrip(b"\r"), max_line_bytes)][-n:]
    if skipped and len(lines) < n:
        lines.insert(0, f"…[skipped {min(skipped, size)} bytes]")
    return lines, size


def read_from(path: Path, offset: int, max_bytes: int = MAX_READ_BYTES) -> dict[str, Any]:
    """Complete lines of ``path`` from byte ``offset`` (at most ``max_bytes``, capped at 1 MiB).

    Lines are split and bounded as the snapshot's reader does
    (:func:`orchestrator.agent.logs.split_lines`): a partial last line waits for
    its newline unless it is already longer than ``MAX_LINE_BYTES``, then it is
    passed on cut. Returns ``lines``, the next ``offset``, ``size`` and
    ``truncated`` (the file shrank below ``offset``: rotated or truncated;
    reading restarts at 0).
    """
    truncated = False
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            if size < offset:
                offset, truncated = 0, True
            fh.seek(offset)
            data = fh.read(max(1, min(max_bytes, MAX_READ_BYTES)))
    except FileNotFoundError:
        return {"lines": [], "offset": offset, "size": None, "truncated": False}
    lines, used = split_lines(data, MAX_LINE_BYTES, at_start=True, at_eof=True)
    return {"lines": lines, "offset": offset + used, "size": size, "truncated": truncated}


def bound_lines(
    lines: Sequence[str], max_line_bytes: int = MAX_LINE_BYTES, max_bytes: int = MAX_TAIL_BYTES
) -> list[str]:
    """The newest of ``lines`` that fit in ``max_bytes``, each through ``logs.clean_line``.

    For text that arrives as lines (a tmux pane capture) rather than from a file.

    >>> bound_lines(["a" * 10, "b", "c"], max_line_bytes=4, max_bytes=100)
    ['aaaa…[cut 6 bytes]', 'b', 'c']
    >>> bound_lines(["old", "new"], max_bytes=4)
    ['new']
    """
    out: list[str] = []
    total = 0
    for line in reversed(lines):
        text = clean_line(line.encode("utf-8", "replace"), max_line_bytes)
        total += len(text) + 1
        if total > max_bytes:
            break
        out.append(text)
    return out[::-1]
