"""bench/gpu.py --dry-run: the GPU check's whole script, end to end on CPU (fake NVML)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.procs import ROOT, trainer_env


@pytest.mark.slow
def test_the_dry_run_prints_every_figure(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu.py"), "--dry-run"],
        cwd=tmp_path,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["dry_run"] is True and out["device"] == "cpu"
    for run in ("copy_task", "lm_bf16"):
        assert out[run]["tok_s"] > 0 and out[run]["tau"] >= 1.0, out[run]
    assert out["copy_task"]["tau_eval_peak_mib"] > 0
    nvml = out["nvml"]
    assert nvml["nvml_ok"] and nvml["gpus_seen"] == 1 and nvml["driver"] == "570.124.06"
    assert nvml["ghost_false_positive"] is False and nvml["ghost_samples"] >= 3
    latched = out["nvml_latched"]  # the same check fires on seed 000's latched GPU
    assert latched["ghost_false_positive"] is True
    assert "GPU 0 reads 100" in latched["ghost_findings"][0]
