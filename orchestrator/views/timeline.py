"""Inline SVG timelines for the postmortem reports (pure: data in, SVG text out).

What a reader needs to read a chart: a time axis with clock times (UTC), a value axis with
ticks in its unit, a legend naming each line (a GPU and its role, a node and its rank),
vertical markers for the moments that matter (launch, first finding, first failure, each
death) whose labels never overlap, shaded stretches (an episode of a condition, a pause in
the samples) and lines that break where no sample was taken. :func:`chart` draws series
over time; :func:`lanes` draws one lane of events per node (the job report); :func:`key`
is the page's legend of every mark.

Each SVG has a ``viewBox`` and ``width="100%"``: it fills the page at any width, with no
script and no external asset. The geometry (ticks, gaps, label rows) is
:mod:`orchestrator.views.scales`.
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.views.scales import (
    GAP_FACTOR,
    TOK_S,
    Unit,
    axis,
    gaps,
    label_width,
    median_interval,
    place_labels,
    split_gaps,
)

W, PAD_L, PAD_R = 1000, 92, 16
"""viewBox width and the plot's left/right margins (the value labels sit in the left one)."""
FONT, SMALL, ROW_H, PLOT_H = 13, 12, 16, 170
COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
MARK = {
    "launch": "#2a9d2a",
    "finding": "#e08a00",
    "failure": "#d00000",
    "death": "#7a0000",
    "kernel": "#6a3d9a",
    "stop": "#555555",
}
DASHED = ("death", "kernel", "stop")
_ORDER = {"launch": 0, "finding": 1, "kernel": 2, "stop": 3, "failure": 4, "death": 5}
"""Markers at one instant: the later kinds are drawn over the earlier (a death over a finding)."""
BAND = {"ghost-utilization": "#e08a00", "nvml-error": "#d00000", "gap": "#9a9a9a"}
_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


@dataclass(frozen=True, slots=True)
class Series:
    """One line of a chart: its legend ``label`` and (time, value) points."""

    label: str
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True, slots=True)
class Marker:
    """A vertical line at ``at`` (Unix s): ``kind`` picks its colour (:data:`MARK`)."""

    at: float
    kind: str
    label: str


@dataclass(frozen=True, slots=True)
class Band:
    """A shaded stretch ``start``..``end`` (Unix s) across the plot: ``kind`` picks its colour
    (:data:`BAND`), ``label`` is its tooltip."""

    start: float
    end: float
    kind: str
    label: str


def clock(at: float) -> str:
    """``HH:MM:SS`` (UTC) of Unix seconds.

    >>> clock(3661.0)
    '01:01:01'
    """
    return time.strftime("%H:%M:%S", time.gmtime(at))


def ticks(t0: float, t1: float, want: int = 8) -> list[float]:
    """Round clock times between ``t0`` and ``t1``, about ``want`` of them.

    >>> ticks(100.0, 160.0)
    [100.0, 110.0, 120.0, 130.0, 140.0, 150.0, 160.0]
    >>> len(ticks(0.0, 3600.0))
    7

    A span of centuries (a ``time`` in milliseconds) still draws a handful:

    >>> len(ticks(1.7e9, 1.7e12)) <= 8
    True
    """
    span = max(t1 - t0, 1e-6)
    step: float = next((s for s in _STEPS if span / s <= want), _STEPS[-1])
    if span / step > want:  # longer than days: whole days, never more than ``want`` ticks
        step = _STEPS[-1] * -(-span // (_STEPS[-1] * want))
    first = -(-t0 // step) * step
    out, t = [], float(first)
    while t <= t1 + 1e-9:
        out.append(t)
        t += step
    return out


def span_of(times: Sequence[float]) -> tuple[float, float]:
    """The time range to draw: the times given, a little padded; (0, 1) when none."""
    if not times:
        return 0.0, 1.0
    lo, hi = min(times), max(times)
    pad = max((hi - lo) * 0.02, 1.0)
    return lo - pad, hi + pad


def _svg_open(height: float, title: str) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height:.0f}" width="100%" '
        f'preserveAspectRatio="xMinYMin meet" role="img" class="chart" '
        f'style="display:block;width:100%;height:auto;margin:0 0 10px 0">',
        f"<title>{html.escape(title)}</title>",
        f'<rect width="{W}" height="{height:.0f}" fill="#fafafa" stroke="#ddd"/>',
        f'<text x="{PAD_L}" y="18" font-size="{FONT + 1}" font-weight="bold">{html.escape(title)}</text>',
    ]


@dataclass(frozen=True, slots=True)
class _Frame:
    """The time scale and the plot's box: ``top``..``bottom`` in viewBox units."""

    t0: float
    t1: float
    top: float
    bottom: float

    def x(self, t: float) -> float:
        span = max(self.t1 - self.t0, 1e-6)
        return PAD_L + (t - self.t0) / span * (W - PAD_L - PAD_R)

    def inside(self, t: float) -> bool:
        return self.t0 <= t <= self.t1


def _marker_rows(markers: Sequence[Marker], t0: float, t1: float) -> tuple[list[Marker], list]:
    """The markers in [t0, t1] (by time) and their label boxes (:func:`place_labels`)."""
    frame = _Frame(t0, t1, 0, 0)
    shown = sorted(
        (m for m in markers if frame.inside(m.at)), key=lambda m: (m.at, _ORDER.get(m.kind, 9))
    )
    boxes = place_labels(
        [(frame.x(m.at), label_width(_marker_text(m), SMALL)) for m in shown], 0, W
    )
    return shown, boxes


def _marker_text(m: Marker) -> str:
    return f"{m.label[:40]} {clock(m.at)}"


def _draw_markers(frame: _Frame, shown: Sequence[Marker], boxes: Sequence) -> list[str]:
    """Each marker's line from the plot's bottom up to its label's row (a leader line), and the
    label in that row above the plot (row 0 nearest)."""
    out = []
    for m, box in zip(shown, boxes, strict=True):
        x = frame.x(m.at)
        color = MARK.get(m.kind, "#333")
        dash = ' stroke-dasharray="5 3"' if m.kind in DASHED else ""
        base = frame.top - 5 - box.row * ROW_H
        tx = box.left if box.anchor == "start" else box.right
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{base - SMALL + 1:.1f}" y2="{frame.bottom}" '
            f'stroke="{color}" stroke-width="2"{dash}><title>{html.escape(m.label)} '
            f"{clock(m.at)}</title></line>"
            f'<text class="marker" x="{tx:.1f}" y="{base:.1f}" font-size="{SMALL}" '
            f'fill="{color}" text-anchor="{box.anchor}" data-left="{box.left:.1f}" '
            f'data-right="{box.right:.1f}" data-row="{box.row}">{html.escape(_marker_text(m))}</text>'
        )
    return out


def _time_axis(frame: _Frame) -> list[str]:
    out = [
        f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{frame.bottom}" y2="{frame.bottom}" '
        'stroke="#999"/>'
    ]
    for t in ticks(frame.t0, frame.t1):
        x = frame.x(t)
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{frame.top}" y2="{frame.bottom + 4}" stroke="#e8e8e8"/>'
            f'<text x="{x:.1f}" y="{frame.bottom + 17}" font-size="{SMALL}" text-anchor="middle" '
            f'fill="#555">{clock(t)}</text>'
        )
    out.append(
        f'<text x="{W - PAD_R}" y="{frame.bottom + 32}" font-size="{SMALL}" '
        'text-anchor="end" fill="#555">time (UTC)</text>'
    )
    return out


def _legend(labels: Sequence[str], y: float, note: str = "") -> tuple[list[str], float]:
    """Colour swatches and labels from ``y``, wrapped; ``note`` (grey) after them. Returns
    the SVG parts and the baseline of the last row."""
    out: list[str] = []
    x = float(PAD_L)
    entries = [(i, label[:40]) for i, label in enumerate(labels)] + ([(-1, note)] if note else [])
    for i, text in entries:
        width = (14 if i >= 0 else 0) + label_width(text, SMALL) + 14
        if x + width > W - PAD_R and x > PAD_L:
            x, y = float(PAD_L), y + ROW_H
        if i >= 0:
            color = COLORS[i % len(COLORS)]
            out.append(
                f'<rect x="{x:.1f}" y="{y - 9}" width="10" height="10" fill="{color}"/>'
                f'<text x="{x + 14:.1f}" y="{y}" font-size="{SMALL}">{html.escape(text)}</text>'
            )
        else:
            out.append(
                f'<text x="{x:.1f}" y="{y}" font-size="{SMALL}" fill="#666">{html.escape(text)}</text>'
            )
        x += width
    return out, y


def _bands(frame: _Frame, bands: Sequence[Band]) -> list[str]:
    out = []
    for b in bands:
        lo, hi = max(b.start, frame.t0), min(b.end, frame.t1)
        if hi < lo:
            continue
        x0, x1 = frame.x(lo), frame.x(hi)
        color = BAND.get(b.kind, "#888")
        opacity = 0.22 if b.kind == "gap" else 0.14
        out.append(
            f'<rect class="band {html.escape(b.kind)}" x="{x0:.1f}" y="{frame.top}" '
            f'width="{max(x1 - x0, 2.0):.1f}" height="{frame.bottom - frame.top}" fill="{color}" '
            f'fill-opacity="{opacity}"><title>{html.escape(b.label)}</title></rect>'
        )
        if b.kind == "gap" and x1 - x0 > label_width("no samples", SMALL) + 8:
            out.append(
                f'<text x="{(x0 + x1) / 2:.1f}" y="{frame.bottom - 6}" font-size="{SMALL}" '
                'fill="#777" text-anchor="middle">no samples</text>'
            )
    return out


def marks_of(series: Sequence[Series], t0: float, t1: float) -> set[str]:
    """Which marks the series draw over [t0, t1]: ``line``, ``dot`` (a sample alone between
    gaps), ``band:gap`` (a pause): what the page's :func:`key` must explain.

    >>> sorted(marks_of([Series("a", ((0.0, 1.0), (2.0, 1.0), (4.0, 1.0), (60.0, 1.0)))], 0.0, 60.0))
    ['band:gap', 'dot', 'line']
    """
    times = sorted({t for s in series for t, _ in s.points if t0 <= t <= t1})
    interval = median_interval(times)
    out = {"band:gap"} if gaps(times, GAP_FACTOR, interval) else set()
    for s in series:
        for run in split_gaps([p for p in s.points if t0 <= p[0] <= t1], GAP_FACTOR, interval):
            out.add("line" if len(run) > 1 else "dot")
    return out


def gap_bands(times: Sequence[float], factor: float = GAP_FACTOR) -> list[Band]:
    """One ``gap`` band per pause in ``times`` (:func:`orchestrator.views.scales.gaps`).

    >>> [(b.start, b.end) for b in gap_bands([0.0, 2.0, 4.0, 60.0])]
    [(4.0, 60.0)]
    """
    ts = sorted(set(times))
    step = median_interval(ts)
    return [
        Band(
            a,
            b,
            "gap",
            f"no samples from {clock(a)} to {clock(b)} ({b - a:.0f} s; samples every {step:.0f} s)",
        )
        for a, b in gaps(ts, factor)
        if step is not None
    ]


def _lines(frame: _Frame, series: Sequence[Series], y_of, interval: float | None) -> list[str]:  # type: ignore[no-untyped-def]
    """Each series as one path whose subpaths break at the gaps; a sample alone between two
    gaps is a dot (a path of one point would not show)."""
    out = []
    for i, s in enumerate(series):
        color = COLORS[i % len(COLORS)]
        pts = [(t, v) for t, v in s.points if frame.inside(t)]
        runs = split_gaps(pts, GAP_FACTOR, interval)
        d = " ".join(
            "M" + " L".join(f"{frame.x(t):.1f},{y_of(v):.1f}" for t, v in run)
            for run in runs
            if len(run) > 1
        )
        label = html.escape(s.label)
        if d:
            out.append(
                f'<path class="series" d="{d}" fill="none" stroke="{color}" '
                f'stroke-width="2" stroke-linejoin="round"><title>{label}</title></path>'
            )
        out += [
            f'<circle class="alone" cx="{frame.x(run[0][0]):.1f}" cy="{y_of(run[0][1]):.1f}" '
            f'r="3" fill="{color}"><title>{label}: {run[0][1]:,.6g} at {clock(run[0][0])}</title></circle>'
            for run in runs
            if len(run) == 1
        ]
    return out


def chart(
    title: str,
    series: Sequence[Series],
    t0: float,
    t1: float,
    markers: Sequence[Marker] = (),
    unit: Unit = TOK_S,
    bands: Sequence[Band] = (),
    note: str = "",
) -> str:
    """A line chart of ``series`` over [t0, t1] in ``unit``: legend (``note`` after it),
    value axis, clock axis, shaded ``bands``, gaps (a pause of more than
    :data:`~orchestrator.views.scales.GAP_FACTOR` median intervals) shaded and left
    undrawn, markers with their labels in rows.

    >>> svg = chart("tokens/s", [Series("ct200 (rank 0)", ((10.0, 5.0), (20.0, 7.0)))], 0.0, 30.0,
    ...             [Marker(25.0, "death", "ct201 died")])
    >>> "ct200 (rank 0)" in svg and "00:00:20" in svg and "ct201 died" in svg and "8 tok/s" in svg
    True
    """
    values = [v for s in series for t, v in s.points if t0 <= t <= t1]
    ax = axis(values, unit)
    legend, last = _legend([s.label for s in series], 40, note)
    shown, boxes = _marker_rows(markers, t0, t1)
    rows = 1 + max((b.row for b in boxes), default=-1)
    top = last + 14 + rows * ROW_H + (6 if rows else 0)
    frame = _Frame(t0, t1, top, top + PLOT_H)
    height = frame.bottom + 40
    times = sorted({t for s in series for t, _ in s.points if t0 <= t <= t1})
    interval = median_interval(times)

    def y_of(v: float) -> float:
        return frame.bottom - (v / ax.top if ax.top else 0.0) * PLOT_H

    parts = _svg_open(height, title) + legend + _bands(frame, [*gap_bands(times), *bands])
    for tick, label in zip(ax.ticks, ax.labels, strict=True):
        y = y_of(tick)
        parts.append(
            f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e8e8e8"/>'
            f'<text class="ytick" x="{PAD_L - 6}" y="{y + 4:.1f}" font-size="{SMALL}" '
            f'text-anchor="end" fill="#555">{html.escape(label)}</text>'
        )
    parts += _time_axis(frame)
    parts += _lines(frame, series, y_of, interval)
    if ax.note:
        parts.append(
            f'<text x="{(PAD_L + W - PAD_R) / 2:.0f}" y="{frame.top + PLOT_H / 2:.0f}" '
            f'font-size="{FONT}" fill="#777" text-anchor="middle">{html.escape(ax.note)}</text>'
        )
    parts += _draw_markers(frame, shown, boxes)
    return "".join(parts) + "</svg>"


def lanes(
    title: str,
    rows: Sequence[tuple[str, Sequence[tuple[float, str, str]]]],
    t0: float,
    t1: float,
    markers: Sequence[Marker] = (),
) -> str:
    """One lane per row (a node): its events ``(at, kind, text)`` as dots (colour by kind,
    the text as a tooltip), a clock axis and the markers across every lane.

    >>> svg = lanes("nodes", [("ct200 (rank 0)", [(5.0, "launch", "started")])], 0.0, 10.0)
    >>> "ct200 (rank 0)" in svg and "started" in svg
    True
    """
    shown, boxes = _marker_rows(markers, t0, t1)
    n = 1 + max((b.row for b in boxes), default=-1)
    top = 30 + n * ROW_H + (6 if n else 0)
    lane_h = 26
    frame = _Frame(t0, t1, top, top + lane_h * max(1, len(rows)) + 6)
    parts = _svg_open(frame.bottom + 40, title) + _time_axis(frame)
    for i, (label, events) in enumerate(rows):
        y = top + lane_h * i + lane_h / 2 + 4
        parts.append(
            f'<text x="4" y="{y + 4:.1f}" font-size="{SMALL}">{html.escape(label[:12])}</text>'
            f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ccc"/>'
        )
        for at, kind, text in events:
            if frame.inside(at):
                color = MARK.get(kind, MARK["finding"] if kind == "error" else "#1f77b4")
                parts.append(
                    f'<circle cx="{frame.x(at):.1f}" cy="{y:.1f}" r="5" fill="{color}">'
                    f"<title>{html.escape(label)} {clock(at)} {kind}: {html.escape(text)}</title></circle>"
                )
    parts += _draw_markers(frame, shown, boxes)
    return "".join(parts) + "</svg>"


def _swatch(kind: str) -> str:
    """A small inline SVG of a mark for the key: a marker's line, a band, a dot, a line."""
    svg = '<svg width="28" height="12" viewBox="0 0 28 12" style="vertical-align:middle">'
    if kind.startswith("marker:"):
        k = kind.split(":", 1)[1]
        dash = ' stroke-dasharray="5 3"' if k in DASHED else ""
        body = f'<line x1="14" x2="14" y1="0" y2="12" stroke="{MARK.get(k, "#333")}" stroke-width="2"{dash}/>'
    elif kind.startswith("band:"):
        k = kind.split(":", 1)[1]
        opacity = 0.3 if k == "gap" else 0.25
        body = (
            f'<rect width="28" height="12" fill="{BAND.get(k, "#888")}" fill-opacity="{opacity}"/>'
        )
    elif kind == "dot":
        body = f'<circle cx="14" cy="6" r="3" fill="{COLORS[0]}"/>'
    else:
        body = f'<line x1="0" x2="28" y1="6" y2="6" stroke="{COLORS[0]}" stroke-width="2"/>'
    return svg + body + "</svg>"


def key(entries: Sequence[tuple[str, str]]) -> str:
    """The page's legend: one row per mark ``(kind, meaning)``; ``kind`` is ``marker:<kind>``,
    ``band:<kind>``, ``dot``, ``line`` or ``text:<symbol>`` (a symbol in a label, such as ``*``).

    >>> "first finding" in key([("marker:finding", "first finding: the earliest finding")])
    True
    """
    rows = []
    for kind, text in entries:
        mark = (
            f"<b style='display:inline-block;width:28px;text-align:center'>{html.escape(kind[5:])}</b>"
            if kind.startswith("text:")
            else _swatch(kind)
        )
        rows.append(f"<li>{mark} {html.escape(text)}</li>")
    return "<ul class='key'>" + "".join(rows) + "</ul>"
