"""The newest run's facts from its directory: run id, manifest, log by byte offset, exit status,
stop request, heartbeat age, disk space, metrics (what a snapshot's ``run`` and ``metrics`` hold).

One reader serves both places a run is read from: inside the container (the agent's
:class:`~orchestrator.agent.snapshot.Observer`, plain files) and from the Proxmox host
(:mod:`orchestrator.agent.host`, every path resolved inside the container's root by
:class:`~orchestrator.agent.rootfs.ContainerRoot`). The difference is the :class:`Files`
handed in. A :class:`RunReader` keeps what must survive between observations: the log
offset, the manifest (re-read only when its mtime changes) and the newest metrics.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import BinaryIO, Protocol

from orchestrator.agent.logs import LogReader
from orchestrator.agent.metrics import MetricParser
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
from orchestrator.wire.model import Metrics, RunManifest, RunState, SchemaError
from orchestrator.wire.text import BAD_DATA_PREFIX, bounded_int, finite, loads_bounded


class Files(Protocol):
    """How a reader gets at the run's files (paths as the container names them)."""

    def read(self, path: str, limit: int) -> tuple[bytes | None, float | None]:
        """(content up to ``limit`` bytes, mtime); ``(None, None)`` when missing or refused."""
        ...

    def mtime(self, path: str) -> float | None:
        """Modification time, ``None`` when missing."""
        ...

    def open(self, path: str) -> BinaryIO:
        """Open for reading; ``FileNotFoundError``/``OSError`` as ``open`` raises them."""
        ...

    def disk(self, path: str, fallback: str) -> tuple[float | None, float | None]:
        """(available, total) MiB of the file system holding ``path`` (else ``fallback``)."""
        ...


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
        return vfs_mib(st)
    return None, None


def vfs_mib(st: os.statvfs_result) -> tuple[float, float]:
    """(available, total) MiB of a statvfs result."""
    mib = st.f_frsize / 1048576.0
    return round(st.f_bavail * mib, 3), round(st.f_blocks * mib, 3)


class LocalFiles:
    """The files of this machine (the agent inside the container)."""

    def read(self, path: str, limit: int) -> tuple[bytes | None, float | None]:
        return read_small(path, limit)

    def mtime(self, path: str) -> float | None:
        try:
            return os.stat(path).st_mtime
        except OSError:
            return None

    def open(self, path: str) -> BinaryIO:
        return open(path, "rb")  # the caller closes it

    def disk(self, path: str, fallback: str) -> tuple[float | None, float | None]:
        return disk_space_mib(path, fallback)


class RunReader:
    """Reads ``<workdir>/runs/current``'s run through ``files``, continuing its log.

    Args:
        workdir: the container's workdir (``runs/`` lives here).
        files: how to read (:class:`LocalFiles`, or a container root from the host).
        log_patterns: per-container metric regexes (hosts.yaml ``log_patterns``).
    """

    def __init__(
        self,
        workdir: str,
        files: Files,
        *,
        log_patterns: Mapping[str, str] | None = None,
        log_tail_bytes: int = 16384,
        max_line_bytes: int = 2000,
    ) -> None:
        self.workdir = workdir
        self.files = files
        self.logs = LogReader(
            tail_bytes=log_tail_bytes, max_line_bytes=max_line_bytes, opener=files.open
        )
        self.metrics = MetricParser(log_patterns)
        self.run_id: str | None = None
        self.offset: int | None = None
        self.last_metrics: Metrics | None = None
        self._manifest: tuple[float | None, RunManifest | None, str | None] | None = None

    def resume(self, run_id: str | None, offset: int | None) -> None:
        """Continue reading ``run_id``'s log at ``offset`` (ignored if the run changed)."""
        self.run_id, self.offset = run_id, offset

    def current(self) -> tuple[str | None, int]:
        """(the run id ``runs/current`` holds, bytes read)."""
        raw, _ = self.files.read(os.path.join(self.workdir, RUNS, CURRENT), 256)
        if raw is None:
            return None, 0
        return parse_run_id(raw.decode("utf-8", "replace")), len(raw)

    def small(self, run_dir: str, name: str, limit: int = 256) -> tuple[bytes | None, float | None]:
        """A small file of the run directory (``pgid``, ``wrapper.pid``...)."""
        return self.files.read(os.path.join(run_dir, name), limit)

    def _manifest_of(self, run_dir: str) -> tuple[RunManifest | None, str | None, int]:
        path = os.path.join(run_dir, MANIFEST)
        mtime = self.files.mtime(path)
        if self._manifest is not None and self._manifest[0] == mtime and mtime is not None:
            return self._manifest[1], self._manifest[2], 0
        raw, _ = self.files.read(path, 1 << 20)
        if raw is None:
            return None, None, 0
        try:
            manifest: RunManifest | None = RunManifest.from_dict(loads_bounded(raw))
            error = None
        except (ValueError, SchemaError, TypeError, AttributeError, OverflowError) as exc:
            manifest, error = None, f"{BAD_DATA_PREFIX}: manifest.json unreadable: {str(exc)[:200]}"
        self._manifest = (mtime, manifest, error)
        return manifest, error, len(raw)

    def read(self, now: float, errors: list[str]) -> tuple[RunState | None, int]:
        """The run now (``None``: no run) and the bytes read from its files; problems go to
        ``errors``. Never raises for what it finds."""
        run_id, nbytes = self.current()
        if run_id is None:
            return None, nbytes
        run_dir = os.path.join(self.workdir, RUNS, run_id)
        if run_id != self.run_id:
            self.run_id, self.offset, self._manifest = run_id, None, None
            self.last_metrics = None
            self.metrics.reset()
        manifest, merr, n = self._manifest_of(run_dir)
        nbytes += n
        if merr:
            errors.append(merr)
        log_path = os.path.join(run_dir, LOG)
        chunk = self.logs.read(log_path, self.offset)
        nbytes += chunk.bytes_read
        self.offset = chunk.offset
        raw, exit_at = self.files.read(os.path.join(run_dir, EXIT_STATUS), 256)
        exit_status = None
        if raw is not None:
            nbytes += len(raw)
            exit_status = parse_exit_status(raw.decode("utf-8", "replace"))
        stop_at, stop_by = None, None
        if raw is not None:  # ended: was it asked to? (runs.py's stop writes this first)
            stop_raw, _ = self.files.read(os.path.join(run_dir, STOP_REQUEST), 4096)
            stop = parse_stop_request(stop_raw.decode("utf-8", "replace") if stop_raw else None)
            stop_at, stop_by = (stop.at, stop.by) if stop else (None, None)
            nbytes += len(stop_raw or b"")
        beat = self.files.mtime(os.path.join(run_dir, HEARTBEAT))
        heartbeat_age = now - beat if beat is not None else None
        disk_free, disk_total = self.files.disk(run_dir, self.workdir)
        if chunk.lines:
            m = self._parse_metrics(chunk.lines, now, errors)
            if m is not None:
                self.last_metrics = merge_metrics(self.last_metrics, m)
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

    def _parse_metrics(
        self, lines: tuple[str, ...], now: float, errors: list[str]
    ) -> Metrics | None:
        """The log's newest metrics, each range-checked (:func:`checked_metrics`); a value
        out of range, or a parser that fails on a line, is a ``bad data:`` error of this
        snapshot (the ``bad-metrics`` finding), never the end of the observation."""
        huge = next((h for line in lines[-64:] if (h := _HUGE_STEP.search(line[:4096]))), None)
        if huge is not None:  # the progress parser ignores it; the operator hears of it
            errors.append(
                f"{BAD_DATA_PREFIX}: train.log metrics: step out of range "
                f"({len(huge.group(1))} digits)"
            )
        try:
            m = self.metrics.parse(lines, now)
        except (ValueError, OverflowError, ArithmeticError) as exc:
            errors.append(
                f"{BAD_DATA_PREFIX}: train.log metrics: {type(exc).__name__}: {exc}"[:300]
            )
            return None
        if m is None:
            return None
        m, why = checked_metrics(m)
        if why:
            errors.append(f"{BAD_DATA_PREFIX}: train.log metrics: {why}")
        return m


_HUGE_STEP = re.compile(r"\b(?:global_)?(?:step|iter|iteration)[\"']?\s*[=:]\s*[\"']?(\d{16,})")
"""A step-like key whose value has 16 digits or more: at or past 2**53 (9.0e15), which no
progress reader keeps; said as a ``bad data:`` error so a run printing one is seen, never
misread.

>>> _HUGE_STEP.search("step=" + "9" * 400).end() - 5, _HUGE_STEP.search("step=123") is None
(400, True)
"""


def checked_metrics(m: Metrics) -> tuple[Metrics | None, str | None]:
    """``m`` with every value range-checked: a step an int in ``[0, 2**53)``, the others
    finite (loss may be NaN: a diverged run says so); (metrics or ``None``, what was dropped).

    >>> checked_metrics(Metrics(step=10**400, loss=2.0))
    (Metrics(step=None, loss=2.0, tokens_per_s=None, acc_len=None, tau=None, seen_at=None, total_steps=None, throughput=None, throughput_unit=None, eta_s=None, framework=None), 'step out of range (401 digits)')
    >>> checked_metrics(Metrics(step=3, loss=float("nan")))[1] is None
    True
    """
    step = m.step if m.step is None else bounded_int(m.step)
    bad = []
    if m.step is not None and step is None:
        shown = (
            f"{len(str(m.step))} digits"
            if isinstance(m.step, int) and abs(m.step) > 10**18
            else repr(m.step)[:40]
        )
        bad.append(f"step out of range ({shown})")
    rest: dict[str, float | None] = {}
    for key in ("tokens_per_s", "acc_len", "tau", "throughput", "eta_s"):
        v = getattr(m, key)
        rest[key] = None if v is None else finite(v)
        if v is not None and rest[key] is None:
            bad.append(f"{key} not a finite number ({repr(v)[:40]})")
    total = m.total_steps if m.total_steps is None else bounded_int(m.total_steps)
    if m.total_steps is not None and total is None:
        bad.append("total_steps out of range")
    loss = m.loss if m.loss is None or isinstance(m.loss, float) else finite(m.loss)
    out = dataclasses.replace(m, step=step, loss=loss, total_steps=total)
    out = dataclasses.replace(out, **rest)  # type: ignore[arg-type]  # every key a float field
    if rest["throughput"] is None:
        out = dataclasses.replace(out, throughput_unit=None)
    if all(
        getattr(out, k) is None
        for k in ("step", "loss", "tokens_per_s", "acc_len", "tau", "throughput")
    ):
        return None, "; ".join(bad) or None
    return out, "; ".join(bad) or None


def merge_metrics(old: Metrics | None, new: Metrics) -> Metrics:
    """Newest value per metric; a metric not in ``new`` keeps its older value.

    >>> m = merge_metrics(Metrics(step=1, loss=2.0), Metrics(step=2, seen_at=5.0))
    >>> (m.step, m.loss, m.seen_at)
    (2, 2.0, 5.0)
    >>> m = merge_metrics(Metrics(throughput=3.0, throughput_unit="it/s"), Metrics(step=3))
    >>> (m.throughput, m.throughput_unit)
    (3.0, 'it/s')
    """
    if old is None:
        return new
    kept = {f: getattr(old, f) for f in _MERGED if getattr(new, f) is None}
    if new.throughput is not None:  # a rate keeps its own unit
        kept.pop("throughput_unit", None)
    return dataclasses.replace(new, **kept)


_MERGED = tuple(f.name for f in dataclasses.fields(Metrics) if f.name != "seen_at")
