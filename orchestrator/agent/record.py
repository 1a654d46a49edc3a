"""The flight recorder: GPU and process samples appended to ``<run-dir>/gpu.jsonl``.

It runs beside the trainer for the whole run, so a postmortem knows what the
GPUs did before a death nobody watched. One JSON line per interval::

    {"t": 1700000000.1, "gpus": [GpuSample...], "nvml": NvmlStatus, "procs": [ProcessInfo...]}

Bounded: when ``gpu.jsonl`` passes ``max_bytes`` it is renamed to
``gpu.jsonl.1`` (replacing the previous one), so the pair never exceeds about
twice ``max_bytes``. It stops ``linger_s`` seconds after ``<run-dir>/exit_status``
appears (to catch what the GPUs do right after a death), after ``max_duration_s``,
on SIGTERM/SIGINT/SIGHUP, or ``linger_s`` after the watched ``pid`` is gone (default: the pid in
``<run-dir>/pgid``, the run's process group leader).
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

from orchestrator.agent.gpu import GpuCollector
from orchestrator.agent.procs import ProcSampler, alive, read_pid_file

FILE = "gpu.jsonl"


def rotate_if_needed(path: str, max_bytes: int) -> bool:
    """Rename ``path`` to ``path + '.1'`` once it holds ``max_bytes`` or more; True if rotated."""
    try:
        if os.path.getsize(path) < max_bytes:
            return False
    except OSError:
        return False
    os.replace(path, path + ".1")
    return True


def record(
    run_dir: str,
    *,
    interval_s: float = 5.0,
    max_bytes: int = 8 << 20,
    pid: int | None = None,
    linger_s: float = 30.0,
    max_duration_s: float | None = None,
    gpu_deadline_s: float = 2.0,
    gpu_source: str | None = None,
) -> int:
    """Sample until a stop condition; returns the number of samples written.

    Raises:
        OSError: ``run_dir`` does not exist or is not writable (reported by the CLI).
    """
    path = os.path.join(run_dir, FILE)
    stop = {"now": False}

    def _stop(_signum: int, _frame: Any) -> None:
        stop["now"] = True

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _stop)
    collector = GpuCollector(deadline_s=gpu_deadline_s, source=gpu_source)
    sampler = ProcSampler()
    started = time.monotonic()
    end_at: float | None = None
    written = 0
    with open(path, "a", encoding="utf-8") as _probe:  # fail early if not writable
        pass
    try:
        while not stop["now"]:
            tick = time.monotonic()
            gpus, nvml = collector.collect()
            if pid is None:
                pid = read_pid_file(os.path.join(run_dir, "pgid"))
            line = {
                "t": round(time.time(), 3),
                "gpus": [g.to_dict() for g in gpus],
                "nvml": nvml.to_dict(),
                "procs": [p.to_dict() for p in sampler.tree(pid)] if pid else [],
            }
            rotate_if_needed(path, max_bytes)
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line, separators=(",", ":")) + "\n")
            written += 1
            if end_at is None and (
                os.path.exists(os.path.join(run_dir, "exit_status")) or (pid and not alive(pid))
            ):
                end_at = tick + linger_s
            if end_at is not None and tick >= end_at:
                break
            if max_duration_s is not None and tick - started >= max_duration_s:
                break
            pause = interval_s - (time.monotonic() - tick)
            while pause > 0 and not stop["now"]:
                time.sleep(min(pause, 0.5))
                pause = interval_s - (time.monotonic() - tick)
    finally:
        collector.close()
    return written
