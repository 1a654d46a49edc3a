"""``orch watch``'s model: what is shown about each target, fed one snapshot at a time
(main thread only): per-target history, the findings, the state word, "unreachable since"."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.model import Finding, Snapshot
from orchestrator.monitor.state import roles_by_gpu, target_state

log = logging.getLogger(__name__)

Detect = Callable[[Sequence[Snapshot], Any, float], Sequence[Finding]]


@dataclass
class TargetView:
    """Everything shown about one target. Mutated by :class:`WatchModel` only."""

    name: str
    roles: dict[int, str] = field(default_factory=dict)
    config: Any = None
    history: collections.deque[Snapshot] = field(
        default_factory=lambda: collections.deque(maxlen=150)
    )
    current: Snapshot | None = None
    last_good: Snapshot | None = None
    unreachable_since: float | None = None
    findings: tuple[Finding, ...] = ()
    state: str = "connecting"
    tokens_per_s: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=60)
    )
    log_tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=200))
    run_id: str | None = None

    def signature(self) -> tuple[Any, ...]:
        """What counts as a change for ``--plain``: state, run, findings (not every step)."""
        return (
            self.state,
            self.run_id,
            self.unreachable_since,
            tuple(sorted((f.kind, int(f.severity), f.gpus) for f in self.findings)),
        )

    @property
    def shown(self) -> Snapshot | None:
        """The snapshot to draw readings from: the newest one that has data."""
        return self.last_good


class WatchModel:
    """The state of every watched target, fed one snapshot at a time (main thread)."""

    def __init__(self, views: Iterable[TargetView], detect: Detect | None = None) -> None:
        self.views: dict[str, TargetView] = {v.name: v for v in views}
        self.detect = detect
        self.messages: collections.deque[str] = collections.deque(maxlen=3)

    def apply(self, name: str, snap: Snapshot) -> bool:
        """Take in ``snap`` for target ``name``; ``True`` when its :meth:`~TargetView.signature` changed."""
        v = self.views[name]
        before = v.signature()
        v.current = snap
        v.history.append(snap)
        if snap.reachable:
            v.unreachable_since = None
            v.last_good = snap
            if snap.run is not None:
                if snap.run.run_id != v.run_id:
                    v.tokens_per_s.clear()
                    v.log_tail.clear()
                v.run_id = snap.run.run_id
                v.log_tail.extend(snap.run.new_log_lines)
            if snap.metrics is not None and snap.metrics.tokens_per_s is not None:
                v.tokens_per_s.append(snap.metrics.tokens_per_s)
        elif v.unreachable_since is None:
            v.unreachable_since = snap.taken_at
        findings: Sequence[Finding] = ()
        if self.detect is not None:
            try:
                findings = self.detect(list(v.history), v.config, snap.taken_at)
            except Exception as exc:  # noqa: BLE001 - lenient in views: show, carry on
                log.debug("detectors failed for %s", name, exc_info=True)
                self.messages.append(f"{name}: detectors failed: {exc}")
        v.findings = tuple(findings)
        grace = v.config.limits.startup_grace_s if v.config is not None else 120.0
        v.state = target_state(snap, v.findings, startup_grace_s=grace)
        return v.signature() != before


def default_detect(history: Sequence[Snapshot], cfg: Any, now: float) -> Sequence[Finding]:
    from orchestrator.detect.engine import run_detectors

    if cfg is None:
        return run_detectors(history, limits=_default_limits(), now=now)
    return run_detectors(history, limits=cfg.limits, roles=roles_by_gpu(cfg.gpus), now=now)


def _default_limits() -> Any:
    from orchestrator.detect.limits import Limits

    return Limits()
