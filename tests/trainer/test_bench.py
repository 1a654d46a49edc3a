"""bench/trainer.py prints both throughputs, the ratio, the GPU command, and JSON last."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.procs import ROOT, trainer_env


@pytest.mark.slow
def test_bench_json_last(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "trainer.py"),
            "--steps",
            "10",
            "--repeats",
            "1",
            "--json",
        ],
        cwd=tmp_path,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    assert set(result) == {
        "pipelined_tok_s",
        "plain_tok_s",
        "ratio",
        "tau",
        "tau_no_context",
        "tau_bigram",
        "tau_eval_s",
        "tau_eval_peak_mib",
    }
    assert result["tau_eval_s"] > 0 and result["tau_eval_peak_mib"] > 0
    assert 1.0 <= result["tau"] <= 4.0  # tiny-cpu: block_size 4, measured at step 10
    assert result["pipelined_tok_s"] > 0 and result["plain_tok_s"] > 0
    assert result["ratio"] == pytest.approx(
        result["pipelined_tok_s"] / result["plain_tok_s"], rel=1e-2
    )
    assert any("trainer/configs/dflash-8gpu.yaml" in line for line in lines)
