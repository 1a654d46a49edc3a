"""Throughput detector: the run's training rate fell, compared in its own unit only.

The rate is :class:`~orchestrator.wire.model.Metrics`' ``throughput`` with its
``throughput_unit`` (read by :mod:`orchestrator.wire.progress`): tokens/s, samples/s,
it/s, TFLOP/s per device, or a time per step. A unit change (a bar switching from training
to evaluation) starts a new series: it never reads as a drop.
"""

from __future__ import annotations

from statistics import median

from orchestrator.config.limits import Limits
from orchestrator.detect.base import History, fmt_time, reachable
from orchestrator.wire.model import Finding, Severity


def _throughput_series(history: History) -> tuple[list[tuple[float, float]], str]:
    """(taken_at, rate) per distinct reading in the newest reading's unit, and that unit.

    A snapshot repeating the last reading adds nothing; a reading in another unit (a bar
    switching from training to evaluation, a time per step beside a rate) is left out: a
    rate is compared with its own unit only. A time per step (``s/step``) is turned into
    steps/s so that lower is slower for every unit.
    """
    readings: list[tuple[float, float, str]] = []
    last_key: tuple[object, ...] | None = None
    for s in reachable(history):
        m = s.metrics
        if m is None:
            continue
        value, unit = m.throughput, m.throughput_unit
        if value is None and m.tokens_per_s is not None:  # an older agent
            value, unit = m.tokens_per_s, "tokens/s"
        if value is None or unit is None:
            continue
        key = (m.step, m.seen_at, value, unit)
        if key == last_key and (m.step is not None or m.seen_at is not None):
            continue
        last_key = key
        readings.append((s.taken_at, value, unit))
    if not readings:
        return [], "tokens/s"
    unit = readings[-1][2]
    out = [(t, v) for t, v, u in readings if u == unit]
    if unit == "s/step":
        return [(t, 1.0 / v) for t, v in out if v > 0], "steps/s (from s/step)"
    return out, unit


def throughput_drop(history: History, limits: Limits) -> list[Finding]:
    """The training rate below ``throughput_drop_ratio`` x the run's rolling baseline for N
    readings, in one unit (tokens/s, samples/s, it/s...: never across a unit change).

    The baseline is the median of up to ``throughput_baseline_samples`` readings
    before the low ones. Also fires under the absolute floor ``min_tokens_per_s``
    (tokens/s only). Seed 002: 21.5 Ktok/s fell to 4.3.
    """
    series, unit = _throughput_series(history)
    n = limits.throughput_samples
    if len(series) < n or not history:
        return []
    tail = series[-n:]
    before = series[:-n][-limits.throughput_baseline_samples :]
    target = history[-1].target
    short = "tok/s" if unit == "tokens/s" else unit
    if before:
        base = median(v for _, v in before)
        floor = base * limits.throughput_drop_ratio
        if base > 0 and all(v < floor for _, v in tail):
            low = [v for _, v in tail]
            return [
                Finding(
                    kind="throughput-drop",
                    severity=Severity.WARNING,
                    target=target,
                    summary=(
                        f"{unit} fell to {_fmt_rate(low[-1])} from a baseline of "
                        f"{_fmt_rate(base)} ({low[-1] / base:.0%}; threshold "
                        f"{limits.throughput_drop_ratio:.0%}) for {n} readings"
                    ),
                    since=tail[0][0],
                    evidence=(
                        f"baseline median of {len(before)} readings: {_fmt_rate(base)} {short}",
                        *(f"{fmt_time(t)} {_fmt_rate(v)} {short}" for t, v in tail),
                    ),
                )
            ]
    floor_tps = limits.min_tokens_per_s
    if unit == "tokens/s" and floor_tps is not None and all(v < floor_tps for _, v in tail):
        return [
            Finding(
                kind="throughput-drop",
                severity=Severity.WARNING,
                target=target,
                summary=(
                    f"tokens/s at {tail[-1][1]:,.0f}, under the floor of "
                    f"{floor_tps:,.0f} for {n} readings"
                ),
                since=tail[0][0],
                evidence=tuple(f"{fmt_time(t)} {v:,.0f} tok/s" for t, v in tail),
            )
        ]
    return []


def _fmt_rate(v: float) -> str:
    """A rate as the findings print it: thousands apart, small rates with their decimals.

    >>> _fmt_rate(21500.0), _fmt_rate(2.5), _fmt_rate(0.0123)
    ('21,500', '2.50', '0.0123')
    """
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.2f}" if v >= 0.1 else f"{v:.3g}"
