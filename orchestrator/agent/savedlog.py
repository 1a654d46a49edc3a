"""A saved kernel log (``journalctl -k`` / ``dmesg`` text, a kern.log) as host-observer events.

``orch kernel LOG`` reads what a user saved from a host into the same
:class:`~orchestrator.wire.model.KernelEvent` the host observer makes live (kind, xid, pci,
MIG ``gpu_instance`` / ``compute_instance``, the owner ``vmid`` of a guest's port or an OOM
victim's memory cgroup, the ``device``). Every line is brought to what
:class:`~orchestrator.agent.kernel.KernelParser` reads, by the prefix its tool printed:

- journalctl (systemd src/shared/logs-show.c): ``short`` / ``short-precise``
  ``Dec 02 04:34:10[.123456] HOST kernel: MSG`` (also a syslog kern.log), ``short-iso`` /
  ``short-iso-precise`` ``2026-12-02T04:34:10[.123456]+0000 HOST kernel: MSG``,
  ``short-unix`` ``1796186050.123456 HOST kernel: MSG``, ``short-monotonic``
  ``[  123.456789] HOST kernel: MSG``;
- dmesg (util-linux sys-utils/dmesg.c): ``[  123.456789] MSG``, ``-T``
  ``[Wed Dec  2 04:34:10 2026] MSG``, ``--time-format iso``, ``-x``
  ``kern  :warn  : ``, ``-r`` ``<4>``, ``-t`` (no time).

A time without a year takes this year (the last one when that would be in the future); a
time since boot (``[ 123.4]``) has no date, unless ``boot_time`` says when the boot began.
Lines are bounded (:data:`~orchestrator.agent.kernel.MAX_LINE_CHARS`); bytes that are not
UTF-8 are replaced, never raised on.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from orchestrator.agent.kernel import MAX_LINE_CHARS, KernelParser
from orchestrator.wire.model import KernelEvent

_MONTHS = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}
_SHORT = re.compile(r"^([A-Z][a-z]{2}) +(\d{1,2}) (\d\d):(\d\d):(\d\d)(\.\d+)? \S+ kernel: ?(.*)$")
_ISO_HOST = re.compile(
    r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:[+-]\d\d:?\d\d|Z)?) \S+ kernel: ?(.*)$"
)
_MONO_HOST = re.compile(r"^(\[\s*\d+\.\d+\]) \S+ kernel: ?(.*)$")
_CTIME = re.compile(
    r"^\[[A-Z][a-z]{2} ([A-Z][a-z]{2}) +(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4})\] ?(.*)$"
)
_DECODE = re.compile(r"^[a-z0-9]+ *:[a-z]+ *: ")
_RAW = re.compile(r"^<\d{1,3}>")
READ_CHUNK = 65536
"""The most of one line read from the file at a time; the rest of a longer line is skipped."""


def _epoch(year: int, month: int, day: int, hh: int, mm: int, ss: int) -> float | None:
    try:
        return time.mktime((year, month, day, hh, mm, ss, 0, 0, -1))
    except (OverflowError, ValueError):
        return None


def _no_year(month: int, day: int, hh: int, mm: int, ss: int, now: float) -> float | None:
    year = time.localtime(now).tm_year
    at = _epoch(year, month, day, hh, mm, ss)
    if at is not None and at > now + 86400:
        at = _epoch(year - 1, month, day, hh, mm, ss)
    return at


def normalize(line: str, now: float | None = None) -> str:
    """``line`` as KernelParser reads it: ``EPOCH MSG`` when its time is known, the tool's own
    ``[ 12.3] MSG`` for a time since boot, else ``MSG``; a continuation line unchanged.

    >>> normalize("1796186050.250000 pve1 kernel: NVRM: boom")
    '1796186050.250000 pve1 kernel: NVRM: boom'
    >>> normalize("[  123.456789] pve1 kernel: NVRM: boom")
    '[  123.456789] NVRM: boom'
    >>> normalize("kern  :warn  : [  5.000000] NVRM: boom")
    '[  5.000000] NVRM: boom'
    >>> normalize("<4>NVRM: boom")
    'NVRM: boom'
    >>> normalize("    continued")
    '    continued'
    """
    if line[:1].isspace():
        return line
    now = time.time() if now is None else now
    line = _RAW.sub("", _DECODE.sub("", line, count=1), count=1)
    m = _SHORT.match(line)
    if m:
        mon = _MONTHS.get(m.group(1))
        day, hh, mm, ss = (int(m.group(i)) for i in range(2, 6))
        at = _no_year(mon, day, hh, mm, ss, now) if mon else None
        if at is None:
            return m.group(7)
        return f"{at + float(m.group(6) or 0.0):.6f} {m.group(7)}"
    m = _ISO_HOST.match(line)
    if m:
        return f"{m.group(1)} {m.group(2)}"
    m = _MONO_HOST.match(line)
    if m:
        return f"{m.group(1)} {m.group(2)}"
    m = _CTIME.match(line)
    if m:
        mon = _MONTHS.get(m.group(1))
        day, hh, mm, ss = (int(m.group(i)) for i in range(2, 6))
        at = _epoch(int(m.group(6)), mon, day, hh, mm, ss) if mon else None
        return f"{at:.6f} {m.group(7)}" if at is not None else m.group(7)
    return line


def parse_saved_log(
    lines: Iterable[str], *, boot_time: float | None = None, now: float | None = None
) -> list[KernelEvent]:
    """Every event of a saved kernel log, in order (:func:`normalize` then KernelParser).

    >>> log = ["Dec 02 04:34:10 pve1 kernel: NVRM: Xid (PCI:0000:3b:00 GPU-I:02 GPU-CI:01): 43, pid=9, name=python3, Ch 00000008",
    ...        "[Wed Dec  2 04:34:11 2026] vmbr0: port 2(fwpr201p0) entered disabled state"]
    >>> [(e.kind, e.xid, e.gpu_instance, e.compute_instance, e.vmid, e.device) for e in parse_saved_log(log)]
    [('xid', 43, 2, 1, None, None), ('link-down', None, None, None, 201, 'fwpr201p0')]
    """
    parser = KernelParser(boot_time=boot_time)
    out: list[KernelEvent] = []
    for line in lines:
        out.extend(parser.feed([normalize(line[:MAX_LINE_CHARS], now)]))
    out.extend(parser.flush())
    return out


def iter_file_lines(fh: BinaryIO) -> Iterator[str]:
    """A binary file's lines, decoded (bad UTF-8 replaced, NULs dropped), each at most
    :data:`READ_CHUNK` bytes: the rest of a longer line is read past, never held."""
    while True:
        chunk = fh.readline(READ_CHUNK)
        if not chunk:
            return
        if not chunk.endswith(b"\n"):
            rest = chunk
            while rest and not rest.endswith(b"\n"):
                rest = fh.readline(READ_CHUNK)
        yield chunk.decode("utf-8", "replace").replace("\x00", "").rstrip("\r\n")


def read_saved_log(path: Path, *, boot_time: float | None = None) -> list[KernelEvent]:
    """The events of the saved log at ``path``. Raises OSError when it cannot be read."""
    with path.open("rb") as fh:
        return parse_saved_log(iter_file_lines(fh), boot_time=boot_time)
