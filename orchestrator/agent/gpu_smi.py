"""GPU readings from nvidia-smi: the fallback when pynvml or the NVML library cannot load.

Equivalent shell commands (what the seeds ran every poll, with dcgm-exporter's other fields
that nvidia-smi's ``--query-gpu`` gives appended)::

    nvidia-smi --query-gpu=index,uuid,name,utilization.gpu,memory.used,memory.total,\
temperature.gpu,power.draw,driver_version,clocks.sm,clocks.mem,enforced.power.limit,pstate,\
utilization.memory,temperature.memory,memory.reserved,utilization.encoder,utilization.decoder \
--format=csv,noheader,nounits
    nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory,process_name \
--format=csv,noheader,nounits

One process answers for every GPU, so both queries together get the collector's deadline;
nvidia-smi prints no row for a failed GPU (the gaps in the index range are it). An older
nvidia-smi that refuses a field (``Field "memory.reserved" is not a valid field to query.``)
is asked the seeds' fields alone from then on. Parsing is pure (:func:`parse_smi_gpus`, :func:`parse_smi_apps`); failures are data, never exceptions.
"""

from __future__ import annotations

import logging
import subprocess
import time
from dataclasses import replace
from typing import Any

from orchestrator.agent.procs import in_host_pid_namespace
from orchestrator.wire.model import GpuProcess, GpuSample, NvmlStatus

log = logging.getLogger(__name__)


class SmiReader:
    """GPU readings from nvidia-smi, both queries within ``deadline_s`` (seconds) together.

    No new nvidia-smi starts while a killed one still will not exit (D state).
    """

    def __init__(self, smi: str = "nvidia-smi", deadline_s: float = 2.0) -> None:
        self.smi = smi
        self.deadline_s = deadline_s
        self._smi_stuck: subprocess.Popen[bytes] | None = None
        self.more = True  # False once this nvidia-smi refused one of SMI_MORE_FIELDS

    def _smi(self, argv: list[str], end: float) -> tuple[int | str, str, str]:
        """One nvidia-smi query until monotonic ``end``; remembers one that would not die."""
        rc, out, err, stuck = _run_bounded(argv, end - time.monotonic())
        if stuck is not None:
            self._smi_stuck = stuck
        return rc, out, err

    def collect(self, note: str = "") -> tuple[tuple[GpuSample, ...], NvmlStatus]:
        """Both queries within ``deadline_s``; ``note`` (why not pynvml) goes into the status message."""
        if self._smi_stuck is not None and self._smi_stuck.poll() is None:
            # one nvidia-smi that outlived SIGKILL (D state) is enough: do not pile up more
            return (), NvmlStatus(
                ok=False,
                source="nvidia-smi",
                error_kind="timeout",
                message=f"nvidia-smi pid {self._smi_stuck.pid} still blocked after SIGKILL",
            )
        self._smi_stuck = None
        end = time.monotonic() + self.deadline_s  # both queries together stay within it
        rc, out, err = self._query_gpus(end)
        if rc == "missing":
            return (), NvmlStatus(
                ok=False,
                source="nvidia-smi",
                error_kind="library-not-found",
                message=f"{self.smi} not found{note}",
            )
        if rc == "timeout":
            return (), NvmlStatus(
                ok=False,
                source="nvidia-smi",
                error_kind="timeout",
                message=f"nvidia-smi did not return within {self.deadline_s} s",
            )
        rows, rest = parse_smi_gpus(out, more=self.more)
        problems = [line for line in rest + err.splitlines() if line.strip()]
        if not rows:
            text = " ".join(problems) or f"nvidia-smi exited {rc} with no output"
            return (), NvmlStatus(
                ok=False, source="nvidia-smi", error_kind=smi_error_kind(text), message=text[:500]
            )
        rc2, out2, _err2 = self._smi(
            [self.smi, f"--query-compute-apps={SMI_APP_FIELDS}", "--format=csv,noheader,nounits"],
            end,
        )
        apps = parse_smi_apps(out2) if isinstance(rc2, int) else None
        if apps is not None and not in_host_pid_namespace():  # host PIDs: names are wrong here
            apps = {u: [replace(p, name=None) for p in ps] for u, ps in apps.items()}
        driver = next((r.pop("driver_version") for r in rows), None)
        for r in rows:
            r.pop("driver_version", None)
        samples = tuple(
            GpuSample(
                **r, processes=tuple(apps.get(r["uuid"] or "", ())) if apps is not None else None
            )
            for r in rows
        )
        if problems:
            kind = smi_error_kind(" ".join(problems))
            # nvidia-smi prints no row for a failed GPU: the gaps in the index range are it
            seen = {s.index for s in samples}
            gaps = [i for i in range(max(seen) + 1) if i not in seen]
            samples = tuple(
                sorted(
                    samples + tuple(GpuSample(index=i, error=kind) for i in gaps),
                    key=lambda s: s.index,
                )
            )
            return samples, NvmlStatus(
                ok=False,
                source="nvidia-smi",
                driver_version=driver,
                error_kind=kind,
                message=" ".join(problems)[:500],
            )
        return samples, NvmlStatus(
            ok=True, source="nvidia-smi", driver_version=driver, message=note.strip(" ()") or None
        )

    def _query_gpus(self, end: float) -> tuple[int | str, str, str]:
        """``--query-gpu`` with :data:`SMI_MORE_FIELDS` while this nvidia-smi takes them."""
        fields = f"{SMI_GPU_FIELDS},{SMI_MORE_FIELDS}" if self.more else SMI_GPU_FIELDS
        argv = [self.smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"]
        rc, out, err = self._smi(argv, end)
        if self.more and "is not a valid field to query" in out + err:
            self.more = False
            return self._query_gpus(end)
        return rc, out, err


SMI_GPU_FIELDS = (
    "index,uuid,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw,"
    "driver_version"
)
SMI_MORE_FIELDS = (
    "clocks.sm,clocks.mem,enforced.power.limit,pstate,utilization.memory,temperature.memory,"
    "memory.reserved,utilization.encoder,utilization.decoder"
)
"""dcgm-exporter's default fields that ``--query-gpu`` gives too (``nvidia-smi --help-query-gpu``)."""
_MORE = [
    ("sm_clock_mhz", float),
    ("mem_clock_mhz", float),
    ("power_limit_w", float),
    ("pstate", int),
    ("mem_copy_util_pct", float),
    ("memory_temp_c", float),
    ("memory_reserved_mib", float),
    ("encoder_util_pct", float),
    ("decoder_util_pct", float),
]


SMI_APP_FIELDS = "gpu_uuid,pid,used_memory,process_name"


def smi_error_kind(text: str) -> str:
    """Classify an nvidia-smi failure message.

    >>> smi_error_kind("Failed to initialize NVML: Driver/library version mismatch")
    'driver-mismatch'
    >>> smi_error_kind("Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.")
    'gpu-lost'
    >>> smi_error_kind("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    'driver-not-loaded'
    >>> smi_error_kind("NVML Shared Library Not Found")
    'library-not-found'
    >>> smi_error_kind("something odd")
    'other'
    """
    low = text.lower()
    if "version mismatch" in low:
        return "driver-mismatch"
    if "gpu is lost" in low or "fallen off the bus" in low or "requires reset" in low:
        return "gpu-lost"
    if "couldn't communicate with the nvidia driver" in low or "driver not loaded" in low:
        return "driver-not-loaded"
    if "library not found" in low or "not found" in low and "nvml" in low:
        return "library-not-found"
    if "timed out" in low or "timeout" in low:
        return "timeout"
    return "other"


def _smi_number(text: str) -> float | None:
    """A numeric csv cell, or ``None`` for ``[N/A]``, ``[Not Supported]``, ``[GPU requires reset]``.

    >>> _smi_number(" 75.12 "), _smi_number("[N/A]"), _smi_number("[GPU requires reset]")
    (75.12, None, None)
    """
    try:
        return float(text.strip())
    except ValueError:
        return None


def _pstate(text: str) -> int | None:
    """``P0`` .. ``P15`` -> 0 .. 15; ``None`` for ``[N/A]`` or ``P?``.

    >>> _pstate("P0"), _pstate(" P8 "), _pstate("[N/A]")
    (0, 8, None)
    """
    text = text.strip()
    return int(text[1:]) if text[:1] == "P" and text[1:].isdigit() else None


def parse_smi_gpus(text: str, more: bool = False) -> tuple[list[dict[str, Any]], list[str]]:
    """Parse ``--query-gpu=SMI_GPU_FIELDS --format=csv,noheader,nounits`` output (with
    ``more``: ``SMI_GPU_FIELDS,SMI_MORE_FIELDS``).

    Returns (rows, other lines). A row is a dict of GpuSample fields plus
    ``driver_version``; lines that are not rows (error messages) come back as-is.

    >>> rows, _ = parse_smi_gpus("0, GPU-a, NVIDIA H200, 98, 1, 143771, 58, 612.40, 570.172.08, "
    ...                          "1980, 3201, 700.00, P0, 45, [N/A], 0, 0, 0", more=True)
    >>> rows[0]["sm_clock_mhz"], rows[0]["pstate"], rows[0]["memory_temp_c"], rows[0]["power_limit_w"]
    (1980.0, 0, None, 700.0)

    >>> rows, rest = parse_smi_gpus(
    ...     "0, GPU-a, NVIDIA H200, 0, 0, 143771, 30, 75.50, 550.54.15\\n"
    ...     "3, GPU-d, NVIDIA H200, 100, 0, 143771, 41, [N/A], 550.54.15\\n"
    ...     "Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.\\n")
    >>> rows[1]["utilization_pct"], rows[1]["memory_used_mib"], rows[1]["power_w"]
    (100.0, 0.0, None)
    >>> rest
    ['Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.']
    """
    rows: list[dict[str, Any]] = []
    rest: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        width = 9 + len(_MORE) if more else 9
        if len(cells) < width or not cells[0].isdigit():
            rest.append(line.strip())
            continue
        extra = cells[len(cells) - (width - 9) :] if more else []
        cells = cells[: len(cells) - len(extra)]
        # a name holding commas: the fixed-width tail tells us where it ends
        name = ", ".join(cells[2 : len(cells) - 6])
        tail = cells[len(cells) - 6 :]
        extras = {
            key: (_pstate(cell) if key == "pstate" else _smi_number(cell))
            for (key, _kind), cell in zip(_MORE, extra, strict=False)
        }
        rows.append(
            {
                **extras,
                "index": int(cells[0]),
                "uuid": cells[1] or None,
                "name": name or None,
                "utilization_pct": _smi_number(tail[0]),
                "memory_used_mib": _smi_number(tail[1]),
                "memory_total_mib": _smi_number(tail[2]),
                "temperature_c": _smi_number(tail[3]),
                "power_w": _smi_number(tail[4]),
                "driver_version": tail[5] if tail[5] and not tail[5].startswith("[") else None,
            }
        )
    return rows, rest


def parse_smi_apps(text: str) -> dict[str, list[GpuProcess]]:
    """Parse ``--query-compute-apps=SMI_APP_FIELDS --format=csv,noheader,nounits`` by GPU uuid.

    >>> apps = parse_smi_apps("GPU-a, 4242, 80123, python3\\nGPU-a, 77, [N/A], x, y\\nNo running processes found\\n")
    >>> apps["GPU-a"][0].pid, apps["GPU-a"][0].used_memory_mib, apps["GPU-a"][0].name
    (4242, 80123.0, 'python3')
    >>> apps["GPU-a"][1].name, apps["GPU-a"][1].used_memory_mib
    ('x, y', None)
    """
    out: dict[str, list[GpuProcess]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",", 3)]
        if len(cells) < 3 or not cells[1].isdigit():
            continue
        name = cells[3] if len(cells) > 3 and cells[3] and not cells[3].startswith("[") else None
        out.setdefault(cells[0], []).append(
            GpuProcess(pid=int(cells[1]), used_memory_mib=_smi_number(cells[2]), name=name)
        )
    return out


def _run_bounded(
    argv: list[str], deadline_s: float
) -> tuple[int | str, str, str, subprocess.Popen[bytes] | None]:
    """Run argv for at most ``deadline_s``; rc is ``"missing"`` or ``"timeout"`` on those failures.

    A hung nvidia-smi may sit in D state and ignore SIGKILL, so after killing it
    we wait only briefly instead of blocking the snapshot on it; such a process
    comes back last (else ``None``) so the caller can wait for it to go.
    """
    if deadline_s <= 0:
        return "timeout", "", "", None
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    except OSError:
        return "missing", "", "", None
    try:
        out, err = proc.communicate(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.wait(0.2)
        except subprocess.TimeoutExpired:
            log.warning("nvidia-smi pid %s did not die after SIGKILL", proc.pid)
            return "timeout", "", "", proc
        return "timeout", "", "", None
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), None
