"""--compile with the sequential warm-up (the seeds' fix) trains on two drafter replicas."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.procs import read_metrics, run_trainer


@pytest.mark.slow
@pytest.mark.serial  # CPU-bound: a time limit, or one torch.compile per core
def test_compile_with_sequential_warmup(tmp_path: Path) -> None:
    proc = run_trainer(
        tmp_path, "--compile", "--steps", "3", "--set", "train.log_every=1", timeout_s=400
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert (
        "attention=flex_attention+compile|cpu:sdpa+compile" in out
        or "attention=sdpa+compile" in out
    )
    warm = [
        line
        for line in out.splitlines()
        if line.startswith("trainer: warm-up cpu forward+backward")
    ]
    assert len(warm) == 2  # one per drafter device, before the worker threads start
    assert out.index(warm[-1]) < out.index("step=1 ")
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]


def test_warmup_none_is_reported(tmp_path: Path) -> None:
    proc = run_trainer(tmp_path, "--warmup", "none", "--steps", "2")
    assert proc.returncode == 0, proc.stderr
    assert "trainer: warm-up skipped (--warmup none)" in proc.stdout
    assert "forward+backward" not in proc.stdout
