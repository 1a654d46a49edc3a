"""GPU readings inside the container: pynvml under a deadline, nvidia-smi as the fallback
(:mod:`orchestrator.agent.gpu_smi`, which gives the equivalent shell commands).

NVML failures are data: :class:`GpuCollector.collect` never raises for them; it
returns an :class:`~orchestrator.wire.model.NvmlStatus` with ``error_kind`` one of
``library-not-found``, ``driver-not-loaded``, ``driver-mismatch``, ``gpu-lost``,
``timeout``, ``other``. A lost GPU can make NVML (and nvidia-smi) block forever,
so each GPU is read on its own worker thread, all in parallel, and the caller
waits at most ``deadline_s`` for each: a hung GPU is ``timeout`` (naming the call)
on that GPU alone while the others still read. Later collections probe a hanging
GPU on a fresh worker for a fraction of a second only (recovery shows at the next
poll) and keep at most :data:`MAX_STUCK_PER_GPU` threads blocked in it. nvidia-smi
(one process for every GPU) gets ``deadline_s`` for both of its queries together,
and no new one starts while a killed one still will not exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from orchestrator.agent import gpupids
from orchestrator.agent.gpu_fields import mib as _mib
from orchestrator.agent.gpu_fields import read_more
from orchestrator.agent.gpu_smi import SmiReader
from orchestrator.agent.procs import in_host_pid_namespace
from orchestrator.wire.model import GpuProcess, GpuSample, NvmlStatus

log = logging.getLogger(__name__)


# pynvml's NVML_ERROR_* codes -> our stable kinds.
_NVML_KINDS = {
    9: "driver-not-loaded",
    10: "timeout",
    12: "library-not-found",
    15: "gpu-lost",
    18: "driver-mismatch",
}
# pynvml codes meaning "this reading does not exist here", not a failure.
_NVML_ABSENT = {3, 4, 13}  # NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND


def nvml_error_kind(code: int | None) -> str:
    """Our error kind for an NVML return code.

    >>> nvml_error_kind(18), nvml_error_kind(15), nvml_error_kind(999)
    ('driver-mismatch', 'gpu-lost', 'other')
    """
    return _NVML_KINDS.get(code or 0, "other")


def _proc_name(pid: int) -> str | None:
    """``/proc/<pid>/comm`` in the host's PID namespace; ``None`` inside a container, where a
    host PID is missing or another process (named from the host instead; a driver that
    gives the container's own PIDs gets its names from :mod:`gpupids`)."""
    if not in_host_pid_namespace():
        return None
    try:
        with open(f"/proc/{pid}/comm", "rb") as fh:
            return fh.read(64).decode("utf-8", "replace").strip() or None
    except OSError:
        return None


class _Worker:
    """One daemon thread that runs jobs one at a time; the caller waits at most a deadline.

    A job that overruns leaves the worker busy; ``submit`` then refuses at once.
    :meth:`retire` ends the thread once its job (if any) returns.
    """

    def __init__(self, name: str = "nvml") -> None:
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._job: Callable[[], Any] | None = None
        self._done = True
        self._retired = False
        self._result: Any = None
        self._error: BaseException | None = None
        self.busy_since: float | None = None
        self.step = ""  # what the running job is doing, for the timeout message
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return not self._done

    def _loop(self) -> None:
        while True:
            with self._cv:
                while self._job is None and not self._retired:
                    self._cv.wait()
                if self._job is None:
                    return
                job = self._job
            result: Any = None
            error: BaseException | None = None
            try:
                result = job()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                error = exc
            with self._cv:
                self._job = None
                self._result, self._error = result, error
                self._done = True
                self.busy_since = None
                self._cv.notify_all()

    def start(self, job: Callable[[], Any]) -> bool:
        """Hand ``job`` to the thread without waiting; ``False`` when it is still busy."""
        with self._cv:
            if not self._done or self._retired:
                return False
            self._job, self._done = job, False
            self.busy_since = time.monotonic()
            self.step = ""
            self._cv.notify_all()
            return True

    def wait(self, end: float) -> tuple[bool, Any]:
        """Wait until monotonic ``end`` for the started job: ``(True, result)`` or ``(False, None)``.

        Raises whatever the job raised.
        """
        with self._cv:
            while not self._done:
                left = end - time.monotonic()
                if left <= 0:
                    return False, None
                self._cv.wait(left)
            if self._error is not None:
                err, self._error = self._error, None
                raise err
            return True, self._result

    def submit(self, job: Callable[[], Any], deadline_s: float) -> tuple[bool, Any]:
        """Run ``job`` on the worker; ``(True, result)`` or ``(False, None)`` after the deadline.

        Raises whatever ``job`` raised.
        """
        if not self.start(job):
            return False, None
        return self.wait(time.monotonic() + deadline_s)

    def retire(self) -> None:
        """Let the thread end after its current job; it takes no more."""
        with self._cv:
            self._retired = True
            self._cv.notify_all()


#: Threads one hung GPU may hold blocked in NVML at once; past this, no new probe of it
#: until one returns (a GPU that hangs forever costs this many threads, not one per poll).
MAX_STUCK_PER_GPU = 4
#: How long a collection waits on a GPU that was hanging at the previous one (seconds):
#: a healthy NVML call answers in milliseconds, so recovery shows at the next poll.
HANGING_PROBE_S = 0.25


class _Gpu:
    """One GPU: its identity (learned once), its own worker, the workers stuck in it."""

    __slots__ = (
        "index",
        "handle",
        "uuid",
        "name",
        "pci",
        "minor",
        "total_mib",
        "worker",
        "stuck",
        "hang_since",
        "nvlink",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.handle: Any = None
        self.uuid: str | None = None
        self.name: str | None = None
        self.pci: str | None = None
        self.minor: int | None = None
        self.total_mib: float | None = None
        self.worker: _Worker | None = None
        self.stuck: list[_Worker] = []  # retired workers still blocked in an NVML call
        self.hang_since: float | None = None  # monotonic start of the call that overran
        self.nvlink: tuple[int, int] | None = None  # previous (rx + tx KiB, NVML timestamp in us)

    def timed_out(self) -> GpuSample:
        return GpuSample(
            index=self.index,
            uuid=self.uuid,
            name=self.name,
            memory_total_mib=self.total_mib,
            error="timeout",
        )


class GpuCollector:
    """Reads every GPU once per :meth:`collect`; NVML is initialised once and kept.

    Every GPU is read on its own worker thread, all in parallel, each under
    ``deadline_s``: a hung GPU is reported as ``timeout`` on that GPU only while the
    others still read. A GPU whose call overran is *hanging*: its blocked worker is
    retired (left to return on its own), and the next collections probe it on a fresh
    worker for only :data:`HANGING_PROBE_S`, so they neither block on it nor miss its
    recovery; at most :data:`MAX_STUCK_PER_GPU` threads stay blocked per GPU.

    Args:
        deadline_s: longest a collection may wait on NVML or nvidia-smi (seconds).
        source: ``auto`` (pynvml, falling back to nvidia-smi when pynvml or the
            library cannot load), ``nvml`` or ``nvidia-smi``. Env
            ``ORCH_AGENT_GPU_SOURCE`` overrides the default ``auto``.
        smi: the nvidia-smi program.
    """

    def __init__(self, deadline_s: float = 2.0, source: str | None = None, smi: str = "nvidia-smi"):
        self.deadline_s = deadline_s
        self.source = source or os.environ.get("ORCH_AGENT_GPU_SOURCE") or "auto"
        self.smi = smi
        self._smi_reader = SmiReader(smi, deadline_s)
        self._pynvml: Any = None
        self._initialised = False
        self._driver: str | None = None
        self._gpus: list[_Gpu] | None = None
        self._worker: _Worker | None = None  # init, driver version, count, shutdown
        self._fallback_reason: str | None = None

    # --- public -----------------------------------------------------------------------------

    def collect(self) -> tuple[tuple[GpuSample, ...], NvmlStatus]:
        """Read all GPUs. Never raises for NVML trouble; returns (samples, status)."""
        start = time.monotonic()
        samples, status = self._collect_any()
        if not in_host_pid_namespace():
            samples, status = gpupids.in_container(samples, status)
        return samples, _with_elapsed(status, start)

    def _collect_any(self) -> tuple[tuple[GpuSample, ...], NvmlStatus]:
        if self.source != "nvidia-smi" and self._fallback_reason is None:
            samples, status = self._collect_nvml()
            if status.error_kind != "library-not-found" or self.source == "nvml":
                return samples, status
            self._fallback_reason = status.message
        return self._collect_smi()

    def minor(self, index: int) -> int:
        """The minor number of GPU ``index``'s device node (``/dev/nvidia<minor>``); its index
        when NVML did not say (nvidia-smi, or not read yet)."""
        for g in self._gpus or ():
            if g.index == index and g.minor is not None:
                return g.minor
        return index

    def preload(self) -> None:
        """Import pynvml now (when the source may use it) so the first collection costs less."""
        if self.source != "nvidia-smi":
            self._load()

    def close(self) -> None:
        """Shut NVML down if it answered (best effort, never blocks past the deadline)."""
        if self._initialised and self._worker is not None:
            with contextlib.suppress(Exception):  # shutting down anyway
                self._worker.submit(self._pynvml.nvmlShutdown, min(self.deadline_s, 0.5))
            self._initialised = False
        for g in self._gpus or ():
            for w in (g.worker, *g.stuck):
                if w is not None:
                    w.retire()

    # --- pynvml -----------------------------------------------------------------------------

    def _load(self) -> str | None:
        if self._pynvml is not None:
            return None
        try:
            import pynvml
        except ImportError as exc:
            return f"pynvml not importable: {exc}"
        self._pynvml = pynvml
        self._worker = _Worker()
        return None

    def _collect_nvml(self) -> tuple[tuple[GpuSample, ...], NvmlStatus]:
        problem = self._load()
        if problem:
            return (), NvmlStatus(
                ok=False, source="nvml", error_kind="library-not-found", message=problem
            )
        assert self._worker is not None
        worker = self._worker
        start = time.monotonic()
        if self._gpus is None:
            if worker.busy:
                stuck = start - (worker.busy_since or start)
                return (), NvmlStatus(
                    ok=False,
                    source="nvml",
                    error_kind="timeout",
                    message=f"NVML still blocked in {worker.step or 'a call'} for {stuck:.1f} s",
                )
            try:
                done, _ = worker.submit(self._init, self.deadline_s)
            except self._pynvml.NVMLError as exc:
                return (), NvmlStatus(
                    ok=False,
                    source="nvml",
                    error_kind=nvml_error_kind(getattr(exc, "value", None)),
                    message=f"{worker.step}: {exc}",
                    driver_version=self._driver,
                )
            except OSError as exc:  # a broken library file
                return (), NvmlStatus(ok=False, source="nvml", error_kind="other", message=str(exc))
            if not done:
                return (), NvmlStatus(
                    ok=False,
                    source="nvml",
                    error_kind="timeout",
                    message=f"{worker.step or 'NVML'} did not return within {self.deadline_s} s",
                )
        assert self._gpus is not None
        samples, notes = self._read_all(start)
        bad = [s for s in samples if s.error]
        if bad:
            return samples, NvmlStatus(
                ok=False,
                source="nvml",
                error_kind=bad[0].error,
                driver_version=self._driver,
                message="; ".join(notes.get(s.index, f"GPU {s.index}: {s.error}") for s in bad),
            )
        return samples, NvmlStatus(ok=True, source="nvml", driver_version=self._driver)

    def _init(self) -> None:
        """Runs on the system worker: init, driver version, device count (no device calls)."""
        nv = self._pynvml
        assert self._worker is not None
        self._worker.step = "nvmlInit"
        nv.nvmlInit()
        self._initialised = True
        self._worker.step = "nvmlSystemGetDriverVersion"
        self._driver = _text(nv.nvmlSystemGetDriverVersion())
        self._worker.step = "nvmlDeviceGetCount"
        self._gpus = [_Gpu(i) for i in range(nv.nvmlDeviceGetCount())]

    def _read_all(self, start: float) -> tuple[tuple[GpuSample, ...], dict[int, str]]:
        """Start every GPU's read at once, then wait for each until its own deadline.

        Returns the samples in index order and, per failed GPU, a note for the message.
        """
        assert self._gpus is not None
        started: list[tuple[_Gpu, _Worker, float]] = []
        samples: dict[int, GpuSample] = {}
        notes: dict[int, str] = {}
        for g in self._gpus:
            g.stuck = [w for w in g.stuck if w.busy]  # a stuck call that returned frees its slot
            hanging = g.worker is not None and g.worker.busy
            if hanging:
                assert g.worker is not None
                g.worker.retire()
                g.stuck.append(g.worker)
                g.worker = None
            if g.worker is None:
                if len(g.stuck) >= MAX_STUCK_PER_GPU:
                    blocked = start - (g.hang_since or start)
                    samples[g.index] = g.timed_out()
                    step = g.stuck[-1].step or "a call"
                    notes[g.index] = (
                        f"GPU {g.index}: NVML still blocked in {step} for {blocked:.1f} s"
                    )
                    continue
                g.worker = _Worker(f"nvml-gpu{g.index}")
            wait_s = min(HANGING_PROBE_S, self.deadline_s) if g.stuck else self.deadline_s
            g.worker.start(functools.partial(self._read_gpu, g, g.worker))
            started.append((g, g.worker, start + wait_s))
        for g, w, end in started:
            try:
                done, sample = w.wait(end)
            except Exception as exc:  # noqa: BLE001 - _read_gpu maps NVML errors; a broken library
                log.warning("GPU %s: reading failed: %s", g.index, exc)
                code = getattr(exc, "value", None)
                done, sample = True, GpuSample(index=g.index, error=nvml_error_kind(code))
            if done:
                samples[g.index] = sample
                g.hang_since = None
                continue
            g.hang_since = g.hang_since or w.busy_since or start
            samples[g.index] = g.timed_out()
            took = end - start
            notes[g.index] = (
                f"GPU {g.index}: {w.step or 'NVML'} did not return within {took:.2g} s"
                if g.stuck
                else f"GPU {g.index}: {w.step or 'NVML'} did not return within {self.deadline_s} s"
            )
        return tuple(samples[i] for i in sorted(samples)), notes

    def _read_gpu(self, g: _Gpu, worker: _Worker) -> GpuSample:
        """Runs on the GPU's worker: the handle and identity when not known yet, then a reading."""
        nv = self._pynvml
        if g.handle is None:
            worker.step = f"nvmlDeviceGetHandleByIndex(GPU {g.index})"
            try:
                g.handle = nv.nvmlDeviceGetHandleByIndex(g.index)
            except nv.NVMLError as exc:
                return GpuSample(index=g.index, error=nvml_error_kind(getattr(exc, "value", None)))
        if g.uuid is None:
            try:
                g.uuid = self._field(
                    worker, lambda: _text(nv.nvmlDeviceGetUUID(g.handle)), f"GetUUID(GPU {g.index})"
                )
                g.name = self._field(
                    worker, lambda: _text(nv.nvmlDeviceGetName(g.handle)), f"GetName(GPU {g.index})"
                )
                g.pci = self._field(
                    worker,
                    lambda: _text(nv.nvmlDeviceGetPciInfo(g.handle).busId),
                    f"GetPciInfo(GPU {g.index})",
                )
                g.minor = self._field(
                    worker,
                    lambda: int(nv.nvmlDeviceGetMinorNumber(g.handle)),
                    f"GetMinorNumber(GPU {g.index})",
                )
            except nv.NVMLError:
                pass  # read below: the reading reports the device's error
        sample = self._read_device(worker, g.handle, g.index, g.uuid, g.name)
        if sample.error is None:
            try:
                calls = functools.partial(self._field, worker)
                more, g.nvlink = read_more(self._pynvml, g.handle, g.index, calls, g.nvlink)
                sample = dataclasses.replace(sample, **more)
            except nv.NVMLError as exc:
                kind = nvml_error_kind(getattr(exc, "value", None))
                sample = GpuSample(index=g.index, uuid=g.uuid, name=g.name, error=kind)
        if sample.memory_total_mib is not None:
            g.total_mib = sample.memory_total_mib
        return dataclasses.replace(sample, pci_bus_id=g.pci) if g.pci else sample

    def _field(self, worker: _Worker, call: Callable[[], Any], step: str) -> Any:
        """One optional reading: ``None`` when not supported; device errors propagate."""
        worker.step = f"nvmlDevice{step}"
        try:
            return call()
        except self._pynvml.NVMLError as exc:
            if getattr(exc, "value", None) in _NVML_ABSENT:
                return None
            raise

    def _read_device(
        self, worker: _Worker, h: Any, i: int, uuid: str | None, name: str | None
    ) -> GpuSample:
        nv = self._pynvml
        field = functools.partial(self._field, worker)
        try:
            util = field(
                lambda: nv.nvmlDeviceGetUtilizationRates(h), f"GetUtilizationRates(GPU {i})"
            )
            mem = field(lambda: nv.nvmlDeviceGetMemoryInfo(h), f"GetMemoryInfo(GPU {i})")
            temp = field(
                lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
                f"GetTemperature(GPU {i})",
            )
            power_mw = field(lambda: nv.nvmlDeviceGetPowerUsage(h), f"GetPowerUsage(GPU {i})")
            procs = field(
                lambda: nv.nvmlDeviceGetComputeRunningProcesses(h),
                f"GetComputeRunningProcesses(GPU {i})",
            )
        except nv.NVMLError as exc:
            return GpuSample(
                index=i, uuid=uuid, name=name, error=nvml_error_kind(getattr(exc, "value", None))
            )
        processes = None
        if procs is not None:
            processes = tuple(
                GpuProcess(
                    pid=int(p.pid),
                    used_memory_mib=_mib(p.usedGpuMemory),
                    name=_proc_name(int(p.pid)),
                )
                for p in procs
            )
        return GpuSample(
            index=i,
            uuid=uuid,
            name=name,
            utilization_pct=float(util.gpu) if util is not None else None,
            mem_copy_util_pct=float(util.memory) if util is not None else None,
            memory_used_mib=_mib(mem.used) if mem is not None else None,
            memory_total_mib=_mib(mem.total) if mem is not None else None,
            temperature_c=float(temp) if temp is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            processes=processes,
        )

    def _collect_smi(self) -> tuple[tuple[GpuSample, ...], NvmlStatus]:
        note = f" (pynvml unavailable: {self._fallback_reason})" if self._fallback_reason else ""
        self._smi_reader.smi, self._smi_reader.deadline_s = self.smi, self.deadline_s
        return self._smi_reader.collect(note)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _with_elapsed(status: NvmlStatus, start: float) -> NvmlStatus:
    return dataclasses.replace(status, elapsed_ms=round((time.monotonic() - start) * 1000, 2))
