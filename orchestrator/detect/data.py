"""The data detector: what a container wrote that could not be taken (pure).

A value out of range or a document that could not be read is dropped where it is read
(``orchestrator/wire/text.py``: a step not an int below 2**53, a time not a Unix time in
seconds, JSON nested too deep) and noted as a ``bad data:`` error of the snapshot; this says
it, on that target, so the drop never silently changes a state.
"""

from __future__ import annotations

from orchestrator.config.limits import Limits
from orchestrator.detect.base import History
from orchestrator.wire.model import Finding, Severity
from orchestrator.wire.text import BAD_DATA_PREFIX

RECENT_S = 60.0
"""Seconds a dropped value stays said after the snapshot that dropped it."""


def bad_metrics(history: History, limits: Limits) -> list[Finding]:
    """A snapshot of the last :data:`RECENT_S` seconds dropped a value or document the container wrote (a 400-digit
    step, a ``time`` in milliseconds, ``"[" * 5000`` in manifest.json): said, on that target,
    so a number out of range never silently changes a state.

    >>> from orchestrator.config.limits import Limits
    >>> from orchestrator.wire.model import Snapshot
    >>> s = Snapshot("ct", 1.0, errors=("bad data: train.log metrics: step out of range",))
    >>> [f.summary for f in bad_metrics([s], Limits())]
    ['a value the container wrote was dropped: train.log metrics: step out of range']
    >>> later, much_later = Snapshot("ct", 2.0), Snapshot("ct", 100.0)
    >>> len(bad_metrics([s, later], Limits())), len(bad_metrics([s, later, much_later], Limits()))
    (1, 0)
    """
    del limits
    if not history:
        return []
    last = history[-1]
    # a bad line is read once (logs by byte offset): it stays said for RECENT_S, so a check
    # that samples twice, or a watch interval later, still shows it
    recent = [s for s in history if last.taken_at - s.taken_at <= RECENT_S]
    bad = [e for s in reversed(recent) for e in s.errors if e.startswith(BAD_DATA_PREFIX)]
    if not bad:
        return []
    run = [s for s in recent if any(e.startswith(BAD_DATA_PREFIX) for e in s.errors)]
    return [
        Finding(
            kind="bad-metrics",
            severity=Severity.WARNING,
            target=last.target,
            summary="a value the container wrote was dropped: "
            + bad[0][len(BAD_DATA_PREFIX) :].lstrip(": "),
            since=run[0].taken_at,
            evidence=tuple(bad[:5]),
        )
    ]
