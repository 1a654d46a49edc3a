"""The pure geometry of the report's charts: value axes, gaps between samples, label rows.

No SVG here (:mod:`orchestrator.views.timeline` draws): numbers in, numbers and strings out,
so each rule is a doctest. Value axes start at 0 and step by 1, 2 or 5 times a power of
ten in the unit a reader expects (``%``, MiB shown as GiB past 1 GiB, ``tok/s``); a series
that never leaves 0 still gets a readable axis (0 to one unit of the kind: 100 %, 1 GiB,
1 tok/s; nor does a memory axis go below 1 GiB). A gap is a pause between samples longer than ``GAP_FACTOR`` times the median
interval: the line breaks there instead of drawing a ramp nobody measured. Marker labels
go into rows so that no two overlap (:func:`place_labels`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

GAP_FACTOR = 3.0
"""A pause longer than this many median sample intervals is a gap (no line across it)."""
CHAR_W = 0.62
"""Width of a label character in ems: above the mean of sans-serif fonts (DejaVu Sans digits
and lower case are ~0.55-0.64 em), so an estimated box is at least as wide as the drawn one."""


@dataclass(frozen=True, slots=True)
class Unit:
    """How a chart's values read: ``symbol`` after each tick (``%``, ``MiB``, ``tok/s``),
    ``min_top`` the lowest axis top (in the same unit: what an all-zero series gets, and
    what a few MiB on a GPU of many GiB are drawn against), ``fixed_top`` an axis top that
    never changes (a percentage); ``binary`` values are MiB, shown as GiB from 1 GiB up."""

    symbol: str
    min_top: float = 1.0
    fixed_top: float | None = None
    binary: bool = False


PERCENT = Unit("%", min_top=100.0, fixed_top=100.0)
MIB = Unit("MiB", min_top=1024.0, binary=True)
TOK_S = Unit("tok/s")


@dataclass(frozen=True, slots=True)
class Axis:
    """A value axis from 0 to ``top`` (in the data's unit); ``ticks`` where the grid lines go,
    ``labels`` what they read; ``note`` says when every value was 0 (else "")."""

    top: float
    ticks: tuple[float, ...]
    labels: tuple[str, ...]
    note: str = ""


def nice_step(span: float, want: int = 5) -> float:
    """The 1-2-5 step (times a power of ten) that cuts ``span`` into at most ``want`` parts.

    >>> nice_step(100.0), nice_step(1.0), nice_step(23.0), nice_step(140.0), nice_step(0.07)
    (20.0, 0.2, 5.0, 50.0, 0.02)
    """
    if not span > 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(want, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    for mult in (1.0, 2.0, 5.0, 10.0):
        if mult * power >= raw * (1 - 1e-9):
            return round(mult * power, 12)
    return 10.0 * power  # pragma: no cover  (10 x power always reaches raw)


def fmt_number(value: float, step: float) -> str:
    """``value`` with as many decimals as ``step`` needs; thousands separated.

    >>> fmt_number(2500.0, 500.0), fmt_number(0.4, 0.2), fmt_number(0.25, 0.05), fmt_number(0, 1)
    ('2,500', '0.4', '0.25', '0')
    """
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) if step > 0 else 0
    text = f"{value:,.{decimals}f}"
    return "0" if float(value) == 0 else text


def axis(values: Sequence[float], unit: Unit, want: int = 5) -> Axis:
    """The value axis of ``values`` in ``unit``: 0 to the first tick at or above the peak.

    >>> axis([0.0, 37.0, 100.0], PERCENT).labels
    ('0 %', '20 %', '40 %', '60 %', '80 %', '100 %')
    >>> a = axis([0.0, 0.0], MIB)
    >>> a.top, a.labels[-1], a.note
    (1024.0, '1.0 GiB', 'every sample is 0 MiB')
    >>> axis([3.0], MIB).labels  # a few MiB on a GPU of many GiB: nearly empty
    ('0 GiB', '0.2 GiB', '0.4 GiB', '0.6 GiB', '0.8 GiB', '1.0 GiB')
    >>> axis([70_000.0], MIB).labels  # 68.4 GiB
    ('0 GiB', '20 GiB', '40 GiB', '60 GiB', '80 GiB')
    >>> axis([21_432.0], TOK_S).labels, axis([], TOK_S).labels[-1]
    (('0 tok/s', '5k tok/s', '10k tok/s', '15k tok/s', '20k tok/s', '25k tok/s'), '1.0 tok/s')
    >>> axis([2_500_000.0], TOK_S).labels[1:3], axis([9_000.0], TOK_S).labels[-1]
    (('0.5M tok/s', '1.0M tok/s'), '10k tok/s')
    """
    finite = [v for v in values if math.isfinite(v)]
    peak = max(finite, default=0.0)
    note = f"every sample is 0 {unit.symbol}" if finite and peak <= 0 else ""
    if not finite:
        note = "no samples"
    peak = max(peak, unit.min_top if unit.fixed_top is None else unit.fixed_top)
    scale, symbol = 1.0, unit.symbol
    if unit.binary and peak >= 1024.0:
        scale, symbol = 1024.0, "GiB"
    step = nice_step(peak / scale, want)
    n = max(1, math.ceil(peak / scale / step - 1e-9))
    ticks = tuple(round(i * step, 12) * scale for i in range(n + 1))
    top = ticks[-1] / scale
    prefix, div = next(((p, d) for p, d, at in _PREFIXES if top >= at), ("", 1.0))
    labels = tuple(
        f"{fmt_number(t / scale / div, step / div)}{prefix} {symbol}" if t else f"0 {symbol}"
        for t in ticks
    )
    return Axis(top=ticks[-1], ticks=ticks, labels=labels, note=note)


_PREFIXES = (("G", 1e9, 1e9), ("M", 1e6, 1e6), ("k", 1e3, 1e4))
"""Decimal prefixes (symbol, value, from an axis top of): ``25k tok/s``, ``0.5M tok/s``; a
label stays short enough for the chart's left margin."""


def median_interval(times: Sequence[float]) -> float | None:
    """The median of the positive intervals between consecutive ``times`` (s); ``None`` when
    fewer than two distinct times.

    >>> median_interval([0.0, 2.0, 4.0, 6.0, 100.0]), median_interval([5.0, 5.0])
    (2.0, None)
    """
    steps = [b - a for a, b in zip(times, times[1:], strict=False) if b > a]
    return statistics.median(steps) if steps else None


def split_gaps(
    points: Sequence[tuple[float, float]], factor: float = GAP_FACTOR, interval: float | None = None
) -> list[list[tuple[float, float]]]:
    """``points`` (time-ordered) cut into runs wherever the next sample comes more than
    ``factor`` times the median interval later (``interval`` overrides the median: a chart
    uses one for all its series).

    >>> split_gaps([(0, 1), (2, 1), (4, 1), (60, 100), (62, 100)])
    [[(0, 1), (2, 1), (4, 1)], [(60, 100), (62, 100)]]
    >>> split_gaps([(0, 1), (10, 2)]), split_gaps([])
    ([[(0, 1), (10, 2)]], [])
    """
    step = interval if interval is not None else median_interval([t for t, _ in points])
    runs: list[list[tuple[float, float]]] = []
    for p in points:
        if runs and (step is None or p[0] - runs[-1][-1][0] <= factor * step):
            runs[-1].append(p)
        else:
            runs.append([p])
    return runs


def gaps(
    times: Sequence[float], factor: float = GAP_FACTOR, interval: float | None = None
) -> list[tuple[float, float]]:
    """The (start, end) of each pause in ``times`` that :func:`split_gaps` would break at.

    >>> gaps([0.0, 2.0, 4.0, 60.0, 62.0])
    [(4.0, 60.0)]
    """
    ts = sorted(set(times))
    step = interval if interval is not None else median_interval(ts)
    if step is None:
        return []
    return [(a, b) for a, b in zip(ts, ts[1:], strict=False) if b - a > factor * step]


@dataclass(frozen=True, slots=True)
class Placed:
    """A label's box: ``left``..``right`` (chart units), ``row`` (0 = nearest the plot) and
    the text anchor (``start``: text to the right of its line, ``end``: to the left)."""

    left: float
    right: float
    row: int
    anchor: str


def label_width(text: str, font_px: float) -> float:
    """An upper estimate of ``text``'s drawn width at ``font_px`` (chart units).

    >>> label_width("death", 10.0)
    31.0
    """
    return len(text) * font_px * CHAR_W


def place_labels(
    labels: Sequence[tuple[float, float]], lo: float, hi: float, pad: float = 4.0
) -> list[Placed]:
    """Boxes for labels ``(x, width)`` hung on vertical lines at ``x``, in the order given:
    each goes right of its line (left of it when it would pass ``hi``), in the lowest row
    where it keeps ``pad`` clear of every box already there. No two boxes of a row overlap,
    whatever the xs (the same instant, 1 unit apart).

    >>> [(p.row, p.anchor) for p in place_labels([(100.0, 50.0), (100.0, 50.0), (101.0, 50.0)], 0, 1000)]
    [(0, 'start'), (1, 'start'), (2, 'start')]
    >>> [(p.row, p.anchor) for p in place_labels([(100.0, 50.0), (300.0, 50.0), (990.0, 50.0)], 0, 1000)]
    [(0, 'start'), (0, 'start'), (0, 'end')]
    """
    rows: list[list[tuple[float, float]]] = []
    out: list[Placed] = []
    for x, width in labels:
        if x + 3 + width <= hi or x - 3 - width < lo:
            left, right, anchor = x + 3, x + 3 + width, "start"
        else:
            left, right, anchor = x - 3 - width, x - 3, "end"
        row = next(
            (
                i
                for i, taken in enumerate(rows)
                if all(right + pad <= a or left >= b + pad for a, b in taken)
            ),
            len(rows),
        )
        if row == len(rows):
            rows.append([])
        rows[row].append((left, right))
        out.append(Placed(left, right, row, anchor))
    return out


def overlaps(boxes: Sequence[tuple[float, float, float, float]]) -> list[tuple[int, int]]:
    """Index pairs of the (left, top, right, bottom) boxes that intersect (touching is not).

    >>> overlaps([(0, 0, 10, 10), (10, 0, 20, 10), (5, 5, 15, 15)])
    [(0, 2), (1, 2)]
    """
    return [
        (i, j)
        for i, a in enumerate(boxes)
        for j, b in enumerate(boxes)
        if i < j and a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
    ]
