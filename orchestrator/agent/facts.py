"""What the container offers: python, tmux, NVML driver + GPU inventory, disk, sessions, torch.

Equivalent shell: ``python3 -V; tmux -V; nvidia-smi -L; df -m WORKDIR; tmux ls;
python3 -c 'import torch; print(torch.cuda.device_count())'``. The torch check is
optional (``--torch``) and runs in a child process under a timeout, because
importing torch can take tens of seconds or hang on a broken driver.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from orchestrator.agent.gpu import GpuCollector
from orchestrator.agent.runfacts import disk_space_mib
from orchestrator.agent.tmux import TmuxReader, tmux_version
from orchestrator.wire.model import SCHEMA_VERSION

_TORCH_PROBE = (
    "import json, time; t = time.monotonic(); import torch; d = time.monotonic() - t; "
    "ok = torch.cuda.is_available(); "
    "print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda, "
    "'cuda_available': ok, 'device_count': torch.cuda.device_count() if ok else 0, "
    "'import_s': round(d, 3)}))"
)


def _disk_free_mib(path: str) -> tuple[str, float | None]:
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and probe != os.path.dirname(probe):
        probe = os.path.dirname(probe)
    free, _total = disk_space_mib(probe)
    return probe, round(free, 1) if free is not None else None


def torch_check(python: str, timeout_s: float) -> dict[str, Any]:
    """Import torch in a child ``python`` (at most ``timeout_s``) and report what CUDA it sees."""
    start = time.monotonic()
    try:
        out = subprocess.run(
            [python, "-c", _TORCH_PROBE], capture_output=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"import torch did not finish within {timeout_s} s"}
    except OSError as exc:
        return {"ok": False, "error": str(exc)}
    elapsed = round(time.monotonic() - start, 3)
    if out.returncode != 0:
        tail = out.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        return {"ok": False, "error": tail[0][:300], "elapsed_s": elapsed}
    try:
        data = json.loads(out.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"ok": False, "error": "unreadable torch probe output", "elapsed_s": elapsed}
    return {"ok": True, "elapsed_s": elapsed, **data}


def gather(
    workdir: str,
    *,
    with_torch: bool = False,
    torch_timeout_s: float = 60.0,
    gpu_deadline_s: float = 2.0,
    gpu_source: str | None = None,
    socket_name: str | None = None,
    socket_path: str | None = None,
) -> dict[str, Any]:
    """All facts as one JSON-ready dict (``schema_version`` included). Never raises."""
    collector = GpuCollector(deadline_s=gpu_deadline_s, source=gpu_source)
    gpus, nvml = collector.collect()
    collector.close()
    tmux = TmuxReader(socket_name, socket_path)
    disk_path, free = _disk_free_mib(workdir)
    facts: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "python": {
            "version": ".".join(map(str, sys.version_info[:3])),
            "executable": sys.executable,
        },
        "tmux": {"version": tmux_version(), "sessions": tmux.sessions(), "error": tmux.error},
        "nvml": nvml.to_dict(),
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "memory_total_mib": g.memory_total_mib,
                "error": g.error,
            }
            for g in gpus
        ],
        "disk": {"path": disk_path, "free_mib": free},
        "workdir": os.path.abspath(workdir),
        "hostname": os.uname().nodename,
        "time": time.time(),
    }
    if with_torch:
        facts["torch"] = torch_check(sys.executable, torch_timeout_s)
    return facts
