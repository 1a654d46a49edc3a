"""A strict reader of Nagios plugin output, written from the formats' own definitions (not
from orch's writer):

- Monitoring Plugins development guidelines (monitoring-plugins.org doc/guidelines.html),
  "Performance data": ``'label'=value[UOM];[warn];[crit];[min];[max]``, space-separated;
  the label may hold anything but ``=`` (and ``'``, doubled inside quotes), quoted when it
  holds spaces; value, min and max in the class ``[-0-9.]``; warn and crit in the
  "Threshold and ranges" format ``[@][start:][end]`` (start may be ``~``); UOM none,
  ``s``/``ms``/``us``, ``%``, ``B``/``KB``/``MB``/``TB``, ``c``; trailing unfilled
  semicolons may be dropped.
- Nagios Core 4 "Plugin API" (multiple lines of output): ``TEXT | PERFDATA`` on the first
  line, then long text lines until one holding ``|``; what follows that ``|`` and every
  later line is performance data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

UOMS = ("", "s", "ms", "us", "%", "B", "KB", "MB", "TB", "c")
NUMBER = r"-?[0-9]+(?:\.[0-9]+)?|-?\.[0-9]+"
_NUM = re.compile(rf"(?:{NUMBER})\Z")
_RANGE = re.compile(rf"@?(?:(?:~|{NUMBER})?:)?(?:{NUMBER})?\Z")
_ITEM = re.compile(
    r"(?:'(?P<quoted>(?:[^']|'')+)'|(?P<bare>[^\s'=]+))"
    rf"=(?P<value>{NUMBER})(?P<uom>[A-Za-z%]*)(?P<rest>(?:;[^;\s]*){{0,4}})"
)


@dataclass(frozen=True, slots=True)
class Item:
    label: str
    value: float
    uom: str
    warn: str
    crit: str
    min: float | None
    max: float | None


@dataclass(frozen=True, slots=True)
class Output:
    text: str
    long_text: tuple[str, ...]
    perfdata: tuple[Item, ...]


class FormatError(ValueError):
    pass


def parse_perfdata(text: str) -> list[Item]:
    """Every item of a performance data string; raises :class:`FormatError` on anything the
    guidelines do not allow."""
    items = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _ITEM.match(text, pos)
        if m is None:
            raise FormatError(f"not a perfdata item at {pos}: {text[pos : pos + 40]!r}")
        label = m["quoted"].replace("''", "'") if m["quoted"] else m["bare"]
        if "=" in label:
            raise FormatError(f"label {label!r} holds '='")
        if m["uom"] not in UOMS:
            raise FormatError(f"{label}: unit {m['uom']!r} is not one of {UOMS}")
        fields = m["rest"].split(";")[1:] + ["", "", "", ""]
        warn, crit, lo, hi = fields[:4]
        for name, r in (("warn", warn), ("crit", crit)):
            if r and not _RANGE.match(r):
                raise FormatError(f"{label}: {name} {r!r} is not a range")
        for name, n in (("min", lo), ("max", hi)):
            if n and not _NUM.match(n):
                raise FormatError(f"{label}: {name} {n!r} is not in [-0-9.]")
        items.append(
            Item(
                label,
                float(m["value"]),
                m["uom"],
                warn,
                crit,
                float(lo) if lo else None,
                float(hi) if hi else None,
            )
        )
        pos = m.end()
        if pos < len(text):
            if not text[pos].isspace():
                raise FormatError(f"items must be apart by spaces at {pos}: {text[pos:]!r}")
            while pos < len(text) and text[pos].isspace():
                pos += 1
    return items


def parse_output(stdout: str) -> Output:
    """A plugin's whole stdout, split as a Nagios 4 core splits it."""
    lines = stdout.rstrip("\n").split("\n")
    first, _, perf = lines[0].partition("|")
    long_text: list[str] = []
    perf_parts = [perf]
    in_perf = False
    for line in lines[1:]:
        if in_perf:
            perf_parts.append(line)
            continue
        text, bar, rest = line.partition("|")
        if bar:
            in_perf = True
            perf_parts.append(rest)
            if text.strip():
                long_text.append(text)
        else:
            long_text.append(line)
    items = parse_perfdata(" ".join(perf_parts))
    return Output(first.rstrip(), tuple(long_text), tuple(items))
