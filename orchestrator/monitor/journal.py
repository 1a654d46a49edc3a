"""The restart journal: every decision ``orch supervise`` and ``orch check --heal`` took about a
dead run, with its evidence (stored in the history database, :mod:`orchestrator.monitor.history`).

One :class:`JournalEntry` per decision that changed something: the first sight of a death (a
``wait`` for the backoff, or a ``give-up``), a wait for the GPUs to read free, the claim of a
``restart`` (written *before* anything is done, under the history lock: the restart budget
counts claims, so a supervisor that dies mid-restart never grants an extra one), its outcome
(``restarted``, ``restart-failed``, ``interrupted``), a death deliberately left alone
(``none``: stopped by an operator). Decisions that repeat (still waiting) are not written again.

:func:`summary` is what ``orch status``, ``orch watch`` and the postmortem show (pure).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.wire.model import Wire

ACTIONS = ("wait", "restart", "restarted", "restart-failed", "interrupted", "give-up", "none")
"""Journal actions: the decisions (``wait``, ``restart``, ``give-up``, ``none``) and the
outcomes of a restart (``restarted``, ``restart-failed``, ``interrupted``: its claimer died)."""
OUTCOMES = ("restarted", "restart-failed", "interrupted")
NOTICE_ACTIONS = ("restarted", "restart-failed", "interrupted", "give-up")
"""Entries that are announced (once each): a restart's outcome is a notice, a give-up pages."""


@dataclass(frozen=True, slots=True)
class JournalEntry(Wire):
    """One decision about one unit's dead run. Times are Unix s (the deciding machine's clock).

    ``unit``: a container name (a multi-node job's name when jobs exist). ``run_id``: the dead
    run decided about. ``attempt``: the restart's number within the policy window (1-based).
    ``cause``: the playbook id that named the failure (``None``: unknown). ``due_at``: when a
    ``wait`` ends. ``new_run_id``: the run a restart started. ``by``: who decided
    (``orch supervise pid 4242 on ops1``). ``id`` and ``notified_at`` are the store's.
    """

    unit: str
    at: float
    action: str
    reason: str
    run_id: str | None = None
    note: str = ""
    trigger: str | None = None
    cause: str | None = None
    procedure: str | None = None
    attempt: int | None = None
    due_at: float | None = None
    new_run_id: str | None = None
    evidence: tuple[str, ...] = ()
    remedy: tuple[str, ...] = ()
    by: str = ""
    id: int | None = None
    notified_at: float | None = None

    def line(self, now: float | None = None) -> str:
        """One human line: when, what, why.

        >>> JournalEntry("ct200", 100.0, "restarted", "relaunch as r2", run_id="r1", attempt=1,
        ...              new_run_id="r2").line(now=160.0)
        'ct200 restarted r1 -> r2 (attempt 1) 1m ago: relaunch as r2'
        """
        run = self.run_id or "-"
        if self.new_run_id:
            run += f" -> {self.new_run_id}"
        att = f" (attempt {self.attempt})" if self.attempt else ""
        return f"{self.unit} {self.action} {run}{att} {ago(self.at, now)}: {self.reason}"


def ago(at: float, now: float | None = None) -> str:
    """``12s ago``, ``5m ago``, ``3h ago``, ``2d ago``.

    >>> ago(0.0, 42.0), ago(0.0, 400.0), ago(0.0, 3 * 3600.0 + 5), ago(0.0, 86400.0 * 2)
    ('42s ago', '6m ago', '3h ago', '2d ago')
    """
    secs = max(0.0, (time.time() if now is None else now) - at)
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if secs >= size:
            return f"{int(secs // size)}{unit} ago"
    return f"{int(secs)}s ago"


def restarts_since(entries: Sequence[JournalEntry], since: float) -> int:
    """Restarts claimed at or after ``since`` (the budget counts claims, not outcomes)."""
    return sum(1 for e in entries if e.action == "restart" and e.at >= since)


def summary(
    entries: Sequence[JournalEntry], *, max_restarts: int | None, window_s: float | None, now: float
) -> dict[str, Any] | None:
    """What ``orch status`` and ``orch watch`` show of one unit's journal (``None``: empty).

    >>> e = [JournalEntry("ct", 10.0, "restart", "r", run_id="a", attempt=1),
    ...      JournalEntry("ct", 20.0, "restarted", "as b", run_id="a", new_run_id="b", attempt=1)]
    >>> s = summary(e, max_restarts=3, window_s=3600.0, now=80.0)
    >>> s["restarts"], s["text"], s["short"]
    (1, 'restarts 1/3 in 1h; restarted a -> b (attempt 1) 1m ago: as b', '1/3 restarted 1m ago')
    """
    if not entries:
        return None
    last = entries[-1]
    count = restarts_since(entries, now - window_s) if window_s is not None else None
    budget = ""
    if count is not None and max_restarts is not None and window_s is not None:
        from orchestrator.config.restart import format_duration

        budget = f"restarts {count}/{max_restarts} in {format_duration(window_s)}; "
    line = last.line(now).removeprefix(f"{last.unit} ")
    used = f"{count}/{max_restarts} " if count is not None and max_restarts is not None else ""
    return {
        "restarts": count,
        "max": max_restarts,
        "last": last.to_dict(),
        "text": budget + line,
        "short": f"{used}{last.action} {ago(last.at, now)}",
    }
