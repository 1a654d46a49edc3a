"""The report's chart geometry (views/scales.py): 1-2-5 value ticks with units, gaps between
samples, marker label rows that never overlap (pure)."""

from __future__ import annotations

import math
import random

import pytest

from orchestrator.views.scales import (
    MIB,
    PERCENT,
    TOK_S,
    axis,
    gaps,
    label_width,
    nice_step,
    overlaps,
    place_labels,
    split_gaps,
)


def _mantissa(step: float) -> float:
    return round(step / 10 ** math.floor(math.log10(step)), 6)


@pytest.mark.parametrize(
    "peak", [1.7, 1.0, 7.0, 23.0, 99.0, 100.0, 101.0, 1234.0, 21_432.0, 1e6, 3.3e7]
)
def test_ticks_step_by_one_two_or_five_and_cover_the_peak(peak: float) -> None:
    a = axis([0.0, peak], TOK_S)
    steps = {round(b - a_, 9) for a_, b in zip(a.ticks, a.ticks[1:], strict=False)}
    assert len(steps) == 1, a.ticks
    assert _mantissa(steps.pop()) in (1.0, 2.0, 5.0)
    assert a.ticks[0] == 0 and a.top >= peak and a.top - peak < a.ticks[1]
    assert 3 <= len(a.ticks) <= 6, a.ticks
    assert all(label.endswith(" tok/s") for label in a.labels)
    assert len(set(a.labels)) == len(a.labels), "two ticks read the same"


def test_nice_step_is_one_two_five() -> None:
    assert [nice_step(s) for s in (1.0, 3.0, 8.0, 40.0, 90.0)] == [0.2, 1.0, 2.0, 10.0, 20.0]


def test_utilization_always_runs_0_to_100_percent() -> None:
    for values in ([], [0.0], [3.0, 4.0], [100.0]):
        a = axis(values, PERCENT)
        assert a.top == 100.0 and a.labels[0] == "0 %" and a.labels[-1] == "100 %", values


def test_an_all_zero_series_gets_a_labelled_unit_axis() -> None:
    mem = axis([0.0, 0.0, 0.0], MIB)
    assert mem.top == 1024.0 and mem.labels[-1] == "1.0 GiB" and len(mem.ticks) >= 3
    assert mem.note == "every sample is 0 MiB"
    tok = axis([0.0], TOK_S)
    assert tok.top == 1.0 and tok.note == "every sample is 0 tok/s"
    assert axis([], MIB).note == "no samples"
    assert axis([5.0], MIB).note == ""


def test_memory_reads_in_gib_and_never_below_one_gib() -> None:
    assert axis([3.0], MIB).top == 1024.0 and axis([900.0], MIB).labels[-1] == "1.0 GiB"
    assert axis([1500.0], MIB).labels[-1] == "1.5 GiB"
    big = axis([140_000.0], MIB)
    assert big.labels[-1] == "150 GiB" and big.top == 150 * 1024.0


def test_a_pause_between_samples_breaks_the_line() -> None:
    # the ghost GPU: 0 % until the recorder paused, 100 % when it came back
    pts = [(float(t), 0.0) for t in range(0, 20, 2)] + [(60.0, 100.0), (62.0, 100.0)]
    runs = split_gaps(pts)
    assert [len(r) for r in runs] == [10, 2]
    assert runs[0][-1] == (18.0, 0.0) and runs[1][0] == (60.0, 100.0), "no segment across"
    assert gaps([t for t, _ in pts]) == [(18.0, 60.0)]


def test_regular_and_jittered_samples_are_one_line() -> None:
    rng = random.Random(7)
    pts = [(t * 2.0 + rng.uniform(-0.5, 0.5), 1.0) for t in range(50)]
    assert len(split_gaps(pts)) == 1 and gaps([t for t, _ in pts]) == []


def test_a_shared_interval_decides_for_a_sparse_series() -> None:
    """A series sampled less often than the chart (tokens/s every 10 s on a 2 s chart) is cut
    at the chart's own gaps, not between each of its points."""
    assert len(split_gaps([(0.0, 1.0), (10.0, 1.0), (20.0, 1.0)], interval=2.0)) == 3
    assert len(split_gaps([(0.0, 1.0), (10.0, 1.0), (20.0, 1.0)], interval=10.0)) == 1


def _boxes(placed, row_h: float = 16.0):  # type: ignore[no-untyped-def]
    return [(p.left, -p.row * row_h - row_h, p.right, -p.row * row_h) for p in placed]


@pytest.mark.parametrize(
    "xs",
    [
        [500.0, 500.0],  # two markers at the same instant
        [500.0, 501.0],  # one unit (about a pixel) apart
        [500.0, 500.0, 500.0, 501.0],
        [995.0, 996.0],  # at the right edge: labels go left of their line
        [2.0, 3.0],  # at the left edge
    ],
)
def test_marker_labels_never_overlap(xs: list[float]) -> None:
    labels = [(x, label_width("death (log-signature) 22:14:50", 12.0)) for x in xs]
    placed = place_labels(labels, 0.0, 1000.0)
    assert overlaps(_boxes(placed)) == []
    assert len({p.row for p in placed}) == len(xs), "each of these needs its own row"
    assert all(p.left >= 0.0 and p.right <= 1000.0 for p in placed), placed


def test_labels_far_apart_share_the_first_row() -> None:
    placed = place_labels([(100.0, 80.0), (400.0, 80.0), (700.0, 80.0)], 0.0, 1000.0)
    assert {p.row for p in placed} == {0}


def test_random_markers_never_overlap() -> None:
    rng = random.Random(28)
    for _ in range(200):
        labels = [(rng.uniform(0, 1000), rng.uniform(20, 250)) for _ in range(rng.randint(1, 9))]
        placed = place_labels(labels, 0.0, 1000.0)
        assert overlaps(_boxes(placed)) == [], labels
        for (x, _), p in zip(labels, placed, strict=True):  # each label touches its own line
            assert abs((p.left if p.anchor == "start" else p.right) - x) <= 3.0 + 1e-9
