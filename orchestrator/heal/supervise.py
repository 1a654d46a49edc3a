"""``orch supervise``: the long-running loop (foreground; systemd keeps it up) that observes the
units with a ``restart:`` policy through the monitor layer
(:class:`~orchestrator.monitor.poller.Poller`: one concurrent round of one-shot snapshots,
judged over an in-memory detection window), decides with the one decision function
(:meth:`~orchestrator.heal.healer.Healer.round`) and carries each claimed restart out in its
own thread (at most one per unit: its restart lock), so a long relaunch never blinds it to the
other units.

Stopping: :func:`supervise` returns once ``stop`` is set (SIGTERM/SIGINT in the command), after
waiting up to ``drain_s`` for restarts in flight to journal their outcome. A restart still
running then, or one cut short by SIGKILL, leaves its claim open: the next supervisor (or
``orch check --heal``) counts it as an attempt and closes it (``interrupted``, or ``restarted``
when its new run is current). Nothing is ever restarted twice for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator.config.inventory import Inventory
from orchestrator.errors import OrchError, UsageError
from orchestrator.heal.healer import Healer, Restart
from orchestrator.monitor.observe import select_targets
from orchestrator.monitor.poller import Poller

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SuperviseOptions:
    """``orch supervise``'s flags (seconds)."""

    names: Sequence[str] = ()
    interval_s: float = 5.0
    timeout_s: float = 30.0
    drain_s: float = 120.0
    rounds: int | None = None
    """Stop after this many rounds (``--rounds``; ``None``: until stopped)."""


def supervised_units(inventory: Inventory, names: Sequence[str]) -> list[str]:
    """The units to supervise: the named ones (each must have a policy), else every container
    with a ``restart:`` policy. Raises UsageError when there is none."""
    chosen = select_targets(inventory, names)
    missing = [n for n in chosen if inventory.container(n).restart is None]
    if names and missing:
        raise UsageError(
            f"{', '.join(missing)}: no restart: policy in hosts.yaml; add one (restart: {{max: 3, "
            f"window: 6h, backoff: [60, 300, 900]}}, docs/self-healing.md) or name others"
        )
    units = [n for n in chosen if n not in missing]
    if not units:
        raise UsageError(
            "no container has a restart: policy in hosts.yaml (per container, or under "
            "defaults:); see docs/self-healing.md"
        )
    return units


def supervise(
    inventory: Inventory,
    healer: Healer,
    opts: SuperviseOptions,
    stop: threading.Event,
    *,
    on_problem: Callable[[str], None] = log.warning,
) -> int:
    """Observe, decide, restart, tell; until ``stop`` is set (or ``opts.rounds`` are done).

    Returns the number of restarts still running when it gave up waiting for them (0 after a
    clean stop). Raises UsageError when no unit has a policy, HistoryError when the database is
    unusable (both before the first round).
    """
    units = supervised_units(inventory, opts.names)
    poller = Poller(inventory, units, timeout_s=opts.timeout_s)
    inflight: dict[str, threading.Thread] = {}
    done = 0
    while not stop.is_set():
        started = time.monotonic()
        poller.poll_once()
        busy = {u for u, t in inflight.items() if t.is_alive()}
        for r in healer.round([j for j in poller.latest() if j.name not in busy]):
            inflight[r.config.name] = _start(healer, r)
        for problem in _notify(healer):
            on_problem(problem)
        done += 1
        if opts.rounds is not None and done >= opts.rounds:
            break
        stop.wait(max(0.0, opts.interval_s - (time.monotonic() - started)))
    deadline = time.monotonic() + opts.drain_s
    for t in inflight.values():
        t.join(max(0.0, deadline - time.monotonic()))
    left = sum(t.is_alive() for t in inflight.values())
    if left == 0:
        for problem in _notify(healer):  # the outcomes of the last restarts
            on_problem(problem)
    return left


def _notify(healer: Healer) -> list[str]:
    """:meth:`Healer.notify`; a locked database is a problem to report, not the end."""
    try:
        return healer.notify()
    except OrchError as exc:
        return [f"notices not sent this round: {exc}"]


def _start(healer: Healer, r: Restart) -> threading.Thread:
    t = threading.Thread(
        target=healer.execute, args=(r,), name=f"restart-{r.config.name}", daemon=True
    )
    t.start()
    return t
