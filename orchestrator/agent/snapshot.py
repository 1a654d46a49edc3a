"""One observation of the container: session + run + processes + GPUs + metrics + cost.

An :class:`Observer` keeps what must survive between observations in a
``stream`` (NVML initialised once, the log offset, CPU ticks, the manifest):
calling :meth:`Observer.observe` again costs only what changed.

The run is ``<workdir>/runs/<id>`` where ``<workdir>/runs/current`` holds the id.
``AgentCost.cpu_ms`` is this process's CPU time (``time.process_time``) spent on
the observation; ``bytes_read`` counts bytes read from the run's files (log,
manifest, exit status) — /proc and tmux are not included.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.agent.gpu import GpuCollector
from orchestrator.agent.procs import ProcSampler
from orchestrator.agent.runfacts import LocalFiles, RunReader
from orchestrator.agent.tmux import TmuxReader
from orchestrator.wire.model import AgentCost, Snapshot
from orchestrator.wire.requests import SESSION


@dataclass(frozen=True, slots=True)
class ObserverConfig:
    """What to observe. Durations in seconds; ``tail_lines`` is pane lines kept."""

    target: str = "local"
    workdir: str = "."
    session: str = SESSION
    tail_lines: int = 8
    gpu_deadline_s: float = 2.0
    gpu_source: str | None = None
    socket_name: str | None = None
    socket_path: str | None = None
    log_patterns: Mapping[str, str] | None = None
    log_tail_bytes: int = 16384
    max_line_bytes: int = 2000


class Observer:
    """Builds :class:`~orchestrator.wire.model.Snapshot` objects; keeps state between calls."""

    def __init__(self, cfg: ObserverConfig) -> None:
        self.cfg = cfg
        self.gpus = GpuCollector(deadline_s=cfg.gpu_deadline_s, source=cfg.gpu_source)
        self.runs = RunReader(
            cfg.workdir,
            LocalFiles(),
            log_patterns=cfg.log_patterns,
            log_tail_bytes=cfg.log_tail_bytes,
            max_line_bytes=cfg.max_line_bytes,
        )
        self.procs = ProcSampler()
        self.tmux = TmuxReader(cfg.socket_name, cfg.socket_path)
        self.gpus.preload()  # imports are process start-up cost, not per-observation cost

    def resume(self, run_id: str | None, offset: int | None) -> None:
        """Continue reading ``run_id``'s log at ``offset`` (ignored if the run changed)."""
        self.runs.resume(run_id, offset)

    def close(self) -> None:
        self.gpus.close()

    def observe(self) -> Snapshot:
        """One observation. Never raises for what it finds; problems go to ``errors``."""
        return self._observe()[0]

    def observe_dict(self) -> dict[str, Any]:
        """One observation as JSON-ready data; its cost includes the conversion to dict."""
        snap, cpu0, wall0, nbytes = self._observe(finish=False)
        data = snap.to_dict()
        data["cost"] = _cost(cpu0, wall0, nbytes).to_dict()
        return data

    def _observe(self, finish: bool = True) -> tuple[Snapshot, float, float, int]:
        cpu0 = time.process_time()
        wall0 = time.monotonic()
        now = time.time()
        errors: list[str] = []
        run, nbytes = self.runs.read(now, errors)
        session_name = run.manifest.session if run and run.manifest else self.cfg.session
        session = self.tmux.state(session_name, self.cfg.tail_lines)
        if self.tmux.error:
            errors.append(self.tmux.error)
        processes = self.procs.tree(session.pane_pid if session.pane_dead is False else None)
        gpus, nvml = self.gpus.collect()
        snap = Snapshot(
            target=self.cfg.target,
            taken_at=now,
            session=session,
            run=run,
            processes=processes,
            gpus=gpus,
            nvml=nvml,
            metrics=self.runs.last_metrics,
            errors=tuple(errors),
            source="container",
        )
        if finish:
            snap = dataclasses.replace(snap, cost=_cost(cpu0, wall0, nbytes))
        return snap, cpu0, wall0, nbytes


def _cost(cpu0: float, wall0: float, nbytes: int) -> AgentCost:
    return AgentCost(
        cpu_ms=round((time.process_time() - cpu0) * 1000, 3),
        bytes_read=nbytes,
        wall_ms=round((time.monotonic() - wall0) * 1000, 3),
    )
