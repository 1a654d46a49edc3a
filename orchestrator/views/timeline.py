"""Inline SVG timelines for the postmortem reports (pure: data in, SVG text out).

What a reader needs to read a chart: a time axis with clock times (UTC), a legend naming
each line (a GPU and its role, a node and its rank), and vertical markers for the moments
that matter (launch, first finding, first failure, each death). :func:`chart` draws series
over time; :func:`lanes` draws one lane of events per node (the job report).
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from dataclasses import dataclass

W, PAD_L, PAD_R = 960, 56, 16
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf")  # fmt: skip
MARK = {"launch": "#2a9d2a", "finding": "#e08a00", "failure": "#d00000", "death": "#7a0000",
        "kernel": "#6a3d9a", "stop": "#555555"}  # fmt: skip
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


def clock(at: float) -> str:
    """``HH:MM:SS`` (UTC) of Unix seconds.

    >>> clock(3661.0)
    '01:01:01'
    """
    return time.strftime("%H:%M:%S", time.gmtime(at))


def ticks(t0: float, t1: float, want: int = 6) -> list[float]:
    """Round clock times between ``t0`` and ``t1``, about ``want`` of them.

    >>> ticks(100.0, 160.0)
    [100.0, 110.0, 120.0, 130.0, 140.0, 150.0, 160.0]
    >>> len(ticks(0.0, 3600.0))
    7

    A span of centuries (a ``time`` in milliseconds) still draws a handful:

    >>> len(ticks(1.7e9, 1.7e12)) <= 7
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
    pad = max((hi - lo) * 0.03, 1.0)
    return lo - pad, hi + pad


class _Canvas:
    def __init__(self, t0: float, t1: float, height: int, top: int) -> None:
        self.t0, self.t1, self.h, self.top = t0, max(t1, t0 + 1e-6), height, top
        self.parts: list[str] = []

    def x(self, t: float) -> float:
        return PAD_L + (t - self.t0) / (self.t1 - self.t0) * (W - PAD_L - PAD_R)

    def axis(self, bottom: int) -> None:
        self.parts.append(
            f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{bottom}" y2="{bottom}" stroke="#999"/>'
        )
        for t in ticks(self.t0, self.t1):
            x = self.x(t)
            self.parts.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{self.top}" y2="{bottom + 4}" stroke="#e4e4e4"/>'
                f'<text x="{x:.1f}" y="{bottom + 16}" font-size="10" text-anchor="middle" '
                f'fill="#555">{clock(t)}</text>'
            )
        self.parts.append(f'<text x="{W - PAD_R}" y="{bottom + 28}" font-size="10" text-anchor="end" '
                          'fill="#555">time (UTC)</text>')  # fmt: skip

    def markers(self, markers: Sequence[Marker], bottom: int) -> None:
        for i, m in enumerate(sorted(markers, key=lambda m: m.at)):
            if not self.t0 <= m.at <= self.t1:
                continue
            x = self.x(m.at)
            color = MARK.get(m.kind, "#333")
            dash = ' stroke-dasharray="4 3"' if m.kind in ("death", "kernel", "stop") else ""
            y = self.top + 10 + (i % 4) * 11
            # labels of markers near the right edge go to their left, so they stay on the chart
            right = x > W * 0.7
            anchor = ' text-anchor="end"' if right else ""
            self.parts.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{self.top}" y2="{bottom}" stroke="{color}" '
                f'stroke-width="2"{dash}><title>{html.escape(m.label)} {clock(m.at)}</title></line>'
                f'<text x="{x - 3 if right else x + 3:.1f}" y="{y}" font-size="10" fill="{color}"'
                f"{anchor}>{html.escape(m.label[:40])}</text>"
            )


def _legend(labels: Sequence[str], y: int) -> list[str]:
    out, x = [], PAD_L
    for i, label in enumerate(labels):
        color = COLORS[i % len(COLORS)]
        text = html.escape(label[:32])
        out.append(f'<rect x="{x}" y="{y - 8}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{x + 14}" y="{y + 1}" font-size="11">{text}</text>')  # fmt: skip
        x += 24 + 7 * len(label[:32])
        if x > W - 120:
            x, y = PAD_L, y + 14
    return out


def chart(
    title: str, series: Sequence[Series], t0: float, t1: float, markers: Sequence[Marker] = ()
) -> str:
    """A line chart of ``series`` over [t0, t1]: legend, clock axis, markers.

    >>> svg = chart("tokens/s", [Series("ct200 (rank 0)", ((10.0, 5.0), (20.0, 7.0)))], 0.0, 30.0,
    ...             [Marker(25.0, "death", "ct201 died")])
    >>> "ct200 (rank 0)" in svg and "00:00:20" in svg and "ct201 died" in svg
    True
    """
    rows = 1 + (sum(24 + 7 * len(s.label[:32]) for s in series) // (W - 170))
    top = 22 + 14 * rows
    height = top + 150
    bottom = height - 34
    c = _Canvas(t0, t1, height, top)
    peak = max([v for s in series for _, v in s.points] + [1.0])

    def y(v: float) -> float:
        return bottom - v / peak * (bottom - top - 40) if peak else bottom

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" role="img">',
        f'<rect width="{W}" height="{height}" fill="#fafafa" stroke="#ddd"/>',
        f'<text x="{PAD_L}" y="14" font-size="12" font-weight="bold">{html.escape(title)}</text>',
        f'<text x="{PAD_L - 4}" y="{y(peak) + 4:.1f}" font-size="10" text-anchor="end" fill="#555">{peak:,.0f}</text>',
        f'<text x="{PAD_L - 4}" y="{bottom:.1f}" font-size="10" text-anchor="end" fill="#555">0</text>',
        *_legend([s.label for s in series], 30),
    ]
    c.axis(bottom)
    for i, s in enumerate(series):
        pts = " ".join(f"{c.x(t):.1f},{y(v):.1f}" for t, v in s.points if t0 <= t <= t1)
        if pts:
            parts.append(f'<polyline fill="none" stroke="{COLORS[i % len(COLORS)]}" stroke-width="2" '
                         f'points="{pts}"><title>{html.escape(s.label)}</title></polyline>')  # fmt: skip
    if not any(s.points for s in series):
        parts.append(f'<text x="{W / 2}" y="{(top + bottom) / 2}" font-size="12">no samples</text>')
    c.markers(markers, bottom)
    return "".join(parts + c.parts) + "</svg>"


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
    top = 28
    lane_h = 26
    bottom = top + lane_h * max(1, len(rows)) + 6
    height = bottom + 34
    c = _Canvas(t0, t1, height, top)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" role="img">',
        f'<rect width="{W}" height="{height}" fill="#fafafa" stroke="#ddd"/>',
        f'<text x="{PAD_L}" y="14" font-size="12" font-weight="bold">{html.escape(title)}</text>',
    ]
    c.axis(bottom)
    for i, (label, events) in enumerate(rows):
        y = top + lane_h * i + lane_h / 2 + 4
        parts.append(f'<text x="4" y="{y + 4:.1f}" font-size="10">{html.escape(label[:12])}</text>'
                     f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ccc"/>')  # fmt: skip
        for at, kind, text in events:
            if t0 <= at <= t1:
                color = MARK.get(kind, MARK["finding"] if kind == "error" else "#1f77b4")
                parts.append(f'<circle cx="{c.x(at):.1f}" cy="{y:.1f}" r="5" fill="{color}">'
                             f"<title>{html.escape(label)} {clock(at)} {kind}: {html.escape(text)}</title></circle>")  # fmt: skip
    c.markers(markers, bottom)
    return "".join(parts + c.parts) + "</svg>"
