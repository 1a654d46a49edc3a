"""A multi-node job's throughput from its nodes' rates, one figure per unit (pure).

Each node's newest rate comes with its unit (docs/progress.md): a rate is never added to a
rate of another unit. Per unit:

- a count of work per second (``tokens/s``, ``samples/s``, ``words/s``) is summed over the
  nodes: each node's log counts its own work;
- a per-device rate (``tokens/s/device``, ``samples/s/device``, ``TFLOP/s/device``) times the
  node's device count, when it is known, is that node's rate in the unit without
  ``/device`` (torchtitan's ``tps`` on a node of 8 GPUs: 8 x tps tokens/s) and is summed as
  above; a node whose device count is not known keeps its rate per device, and the job's
  figure in that unit is the mean per device over those nodes (a sum of per-device rates is
  no unit at all);
- a step rate (``it/s``) or a time per step (``s/step``) is the job's pace, which every
  data-parallel node shares: the slowest node's (the least it/s, the most s/step), not a sum.

>>> [(r.value, r.unit, r.how) for r in job_rates([(900.0, "tokens/s/device", 8),
...                                               (1000.0, "tokens/s", None)])]
[(8200.0, 'tokens/s', 'sum')]
>>> [(r.value, r.unit, r.how) for r in job_rates([(900.0, "tokens/s/device", None),
...                                               (1100.0, "tokens/s/device", None)])]
[(1000.0, 'tokens/s/device', 'mean per device')]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

PER_DEVICE = "/device"
PER_THREAD = "/thread"
PACE_UNITS = {"it/s": min, "s/step": max}
"""Units a job's nodes share rather than add, and which node's value is the job's (slowest)."""


@dataclass(frozen=True, slots=True)
class JobRate:
    """The job's figure in one unit: ``value`` in ``unit``, over ``nodes`` nodes; ``how`` is
    ``sum``, ``mean per device`` or ``slowest node``."""

    value: float
    unit: str
    nodes: int
    how: str

    def to_dict(self) -> dict[str, object]:
        return {"value": self.value, "unit": self.unit, "nodes": self.nodes, "how": self.how}


def node_rate(rate: float, unit: str, devices: int | None) -> tuple[float, str]:
    """A node's rate in the unit it adds up in: a per-device rate times ``devices`` (when
    known and positive) in the unit without ``/device``, else as given.

    >>> node_rate(5862.0, "tokens/s/device", 8), node_rate(5862.0, "tokens/s/device", None)
    ((46896.0, 'tokens/s'), (5862.0, 'tokens/s/device'))
    """
    if unit.endswith(PER_DEVICE) and devices is not None and devices > 0:
        return rate * devices, unit[: -len(PER_DEVICE)]
    return rate, unit


def job_rates(rates: Iterable[tuple[float, str, int | None]]) -> tuple[JobRate, ...]:
    """One :class:`JobRate` per unit from ``(rate, unit, devices)`` per node (nodes without a
    rate left out), in the order the units first appear."""
    by_unit: dict[str, list[float]] = {}
    for rate, unit, devices in rates:
        value, u = node_rate(rate, unit, devices)
        by_unit.setdefault(u, []).append(value)
    out = []
    for unit, values in by_unit.items():
        if unit in PACE_UNITS:
            out.append(JobRate(PACE_UNITS[unit](values), unit, len(values), "slowest node"))
        elif unit.endswith(PER_DEVICE):
            out.append(JobRate(sum(values) / len(values), unit, len(values), "mean per device"))
        elif unit.endswith(PER_THREAD):  # fastText's words/s/thread: the thread count unknown
            out.append(JobRate(sum(values) / len(values), unit, len(values), "mean per thread"))
        else:
            out.append(JobRate(sum(values), unit, len(values), "sum"))
    return tuple(out)


def tokens_per_s(rates: Iterable[JobRate]) -> float | None:
    """The job's run-wide tokens/s among ``rates`` (``None`` when no node's rate is one)."""
    return next((r.value for r in rates if r.unit == "tokens/s"), None)
