"""The ``progress`` object of the JSON documents (``orch diagnose/status/check --json``) from a
:class:`~orchestrator.wire.progress.Reading` or a snapshot's metrics (pure, stdlib only: ships
to the agent inside ``wire/``).
"""

from __future__ import annotations

import math

from orchestrator.wire.model import Metrics
from orchestrator.wire.progress import Reading


def summary(framework: str | None, r: Reading) -> dict[str, object]:
    """The ``progress`` object of ``orch diagnose --json`` and the docs: ``None`` where the
    log does not say; ``throughput`` is ``{"value", "unit"}`` or ``None``; ``loss_nonfinite``
    is ``"nan"``, ``"inf"`` or ``"-inf"`` where the loss is not finite (JSON has none of them:
    ``--json`` writes that loss as ``null``, :func:`~orchestrator.wire.text.json_safe`), else
    ``None``.

    >>> summary("torchtitan", Reading(step=3, loss=2.5, rate=5862.0, unit="tokens/s/device"))
    {'framework': 'torchtitan', 'step': 3, 'total_steps': None, 'loss': 2.5, 'loss_nonfinite': None, 'throughput': {'value': 5862.0, 'unit': 'tokens/s/device'}, 'eta_s': None}
    >>> summary(None, Reading(loss=float("-inf")))["loss_nonfinite"]
    '-inf'
    """
    rate = {"value": r.rate, "unit": r.unit} if r.rate is not None else None
    return {
        "framework": framework,
        "step": r.step,
        "total_steps": r.total_steps,
        "loss": r.loss,
        "loss_nonfinite": nonfinite(r.loss),
        "throughput": rate,
        "eta_s": r.eta_s,
    }


def nonfinite(v: float | None) -> str | None:
    """``"nan"``, ``"inf"`` or ``"-inf"`` for a value JSON cannot hold, else ``None``.

    >>> nonfinite(float("nan")), nonfinite(float("inf")), nonfinite(2.5), nonfinite(None)
    ('nan', 'inf', None, None)
    """
    if v is None or math.isfinite(v):
        return None
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def metrics_progress(m: Metrics | None) -> dict[str, object] | None:
    """:func:`summary` of a snapshot's metrics (``orch status --json``, ``orch check --json``);
    ``None`` without metrics. An older agent's tokens/s stands as the throughput.

    >>> metrics_progress(Metrics(step=4, tokens_per_s=900.0))["throughput"]
    {'value': 900.0, 'unit': 'tokens/s'}
    """
    if m is None:
        return None
    rate, unit = m.throughput, m.throughput_unit
    if rate is None and m.tokens_per_s is not None:
        rate, unit = m.tokens_per_s, "tokens/s"
    return summary(m.framework, Reading(m.step, m.total_steps, m.loss, rate, unit, m.eta_s))
