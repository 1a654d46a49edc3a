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
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.agent.gpu import GpuCollector
from orchestrator.agent.logs import LogReader
from orchestrator.agent.metrics import MetricParser
from orchestrator.agent.procs import ProcSampler
from orchestrator.agent.rundir import (
    CURRENT,
    EXIT_STATUS,
    HEARTBEAT,
    LOG,
    MANIFEST,
    RUNS,
    STOP_REQUEST,
    parse_exit_status,
    parse_run_id,
    parse_stop_request,
    read_small,
)
from orchestrator.agent.tmux import TmuxReader
from orchestrator.model import (
    AgentCost,
    Metrics,
    RunManifest,
    RunState,
    SchemaError,
    Snapshot,
)


@dataclass(frozen=True, slots=True)
class ObserverConfig:
    """What to observe. Durations in seconds; ``tail_lines`` is pane lines kept."""

    target: str = "local"
    workdir: str = "."
    session: str = "train"
    tail_lines: int = 8
    gpu_deadline_s: float = 2.0
    gpu_source: str | None = None
    socket_name: str | None = None
    socket_path: str | None = None
    log_patterns: Mapping[str, str] | None = None
    log_tail_bytes: int = 16384
    max_line_bytes: int = 2000


def disk_space_mib(path: str, fallback: str | None = None) -> tuple[float | None, float | None]:
    """(available, total) MiB of the file system holding ``path`` (else ``fallback``).

    Equivalent to ``df -m --output=avail,size PATH``; available is ``f_bavail``
    (what an unprivileged writer gets). ``(None, None)`` when neither path can be
    statted. Never blocks on the network beyond what statvfs does.

    >>> free, total = disk_space_mib("/")
    >>> 0 <= free <= total
    True
    >>> disk_space_mib("/no/such/dir")
    (None, None)
    """
    for p in (path, fallback):
        if not p:
            continue
        try:
            st = os.statvfs(p)
        except OSError:
            continue
        mib = st.f_frsize / 1048576.0
        return round(st.f_bavail * mib, 3), round(st.f_blocks * mib, 3)
    return None, None


class Observer:
    """Builds :class:`~orchestrator.model.Snapshot` objects; keeps state between calls."""

    def __init__(self, cfg: ObserverConfig) -> None:
        self.cfg = cfg
        self.gpus = GpuCollector(deadline_s=cfg.gpu_deadline_s, source=cfg.gpu_source)
        self.logs = LogReader(tail_bytes=cfg.log_tail_bytes, max_line_bytes=cfg.max_line_bytes)
        self.procs = ProcSampler()
        self.tmux = TmuxReader(cfg.socket_name, cfg.socket_path)
        self.gpus.preload()  # imports are process start-up cost, not per-observation cost
        self.metrics = MetricParser(cfg.log_patterns)
        self.run_id: str | None = None
        self.offset: int | None = None
        self._manifest: tuple[float | None, RunManifest | None, str | None] | None = None
        self._last_metrics: Metrics | None = None

    def resume(self, run_id: str | None, offset: int | None) -> None:
        """Continue reading ``run_id``'s log at ``offset`` (ignored if the run changed)."""
        self.run_id, self.offset = run_id, offset

    def close(self) -> None:
        self.gpus.close()

    def _current_run(self) -> tuple[str | None, int]:
        raw, _ = read_small(os.path.join(self.cfg.workdir, RUNS, CURRENT), 256)
        if raw is None:
            return None, 0
        return parse_run_id(raw.decode("utf-8", "replace")), len(raw)

    def _read_manifest(self, run_dir: str) -> tuple[RunManifest | None, str | None, int]:
        path = os.path.join(run_dir, MANIFEST)
        try:
            mtime: float | None = os.stat(path).st_mtime
        except OSError:
            mtime = None
        if self._manifest is not None and self._manifest[0] == mtime and mtime is not None:
            return self._manifest[1], self._manifest[2], 0
        raw, _ = read_small(path, 1 << 20)
        if raw is None:
            return None, None, 0
        try:
            manifest: RunManifest | None = RunManifest.from_dict(json.loads(raw))
            error = None
        except (ValueError, SchemaError) as exc:
            manifest, error = None, f"manifest.json unreadable: {str(exc)[:200]}"
        self._manifest = (mtime, manifest, error)
        return manifest, error, len(raw)

    def _run(self, now: float, errors: list[str]) -> tuple[RunState | None, int]:
        run_id, nbytes = self._current_run()
        if run_id is None:
            return None, nbytes
        run_dir = os.path.join(self.cfg.workdir, RUNS, run_id)
        if run_id != self.run_id:
            self.run_id, self.offset, self._manifest = run_id, None, None
            self._last_metrics = None
        manifest, merr, n = self._read_manifest(run_dir)
        nbytes += n
        if merr:
            errors.append(merr)
        log_path = os.path.join(run_dir, LOG)
        chunk = self.logs.read(log_path, self.offset)
        nbytes += chunk.bytes_read
        self.offset = chunk.offset
        raw, exit_at = read_small(os.path.join(run_dir, EXIT_STATUS), 256)
        exit_status = None
        if raw is not None:
            nbytes += len(raw)
            exit_status = parse_exit_status(raw.decode("utf-8", "replace"))
        stop_at, stop_by = None, None
        if raw is not None:  # ended: was it asked to? (runs.py's stop writes this first)
            stop_raw, _ = read_small(os.path.join(run_dir, STOP_REQUEST), 4096)
            stop = parse_stop_request(stop_raw.decode("utf-8", "replace") if stop_raw else None)
            stop_at, stop_by = (stop.at, stop.by) if stop else (None, None)
            nbytes += len(stop_raw or b"")
        try:
            heartbeat_age: float | None = now - os.stat(os.path.join(run_dir, HEARTBEAT)).st_mtime
        except OSError:
            heartbeat_age = None
        disk_free, disk_total = disk_space_mib(run_dir, self.cfg.workdir)
        if chunk.lines:
            m = self.metrics.parse(chunk.lines, now)
            if m is not None:
                self._last_metrics = _merge(self._last_metrics, m)
        return RunState(
            run_id=run_id,
            run_dir=run_dir,
            manifest=manifest,
            log_path=log_path,
            log_exists=chunk.exists,
            log_size_bytes=chunk.size_bytes,
            log_mtime=chunk.mtime,
            log_offset=chunk.offset,
            new_log_lines=chunk.lines,
            exit_status=exit_status,
            exit_status_at=exit_at if raw is not None else None,
            heartbeat_age_s=round(heartbeat_age, 3) if heartbeat_age is not None else None,
            log_error=chunk.error,
            stop_requested_at=stop_at,
            stop_requested_by=stop_by,
            disk_free_mib=disk_free,
            disk_total_mib=disk_total,
        ), nbytes

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
        run, nbytes = self._run(now, errors)
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
            metrics=self._last_metrics,
            errors=tuple(errors),
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


def _merge(old: Metrics | None, new: Metrics) -> Metrics:
    """Newest value per metric; a metric not in ``new`` keeps its older value."""
    if old is None:
        return new
    return Metrics(
        step=new.step if new.step is not None else old.step,
        loss=new.loss if new.loss is not None else old.loss,
        tokens_per_s=new.tokens_per_s if new.tokens_per_s is not None else old.tokens_per_s,
        acc_len=new.acc_len if new.acc_len is not None else old.acc_len,
        tau=new.tau if new.tau is not None else old.tau,
        seen_at=new.seen_at,
    )
