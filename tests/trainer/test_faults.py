"""Every --fault produces its documented symptom (docs/trainer.md, "Fault injection")."""

from __future__ import annotations

import math
import signal
import subprocess
import time
from pathlib import Path

from tests.helpers import wait_for
from tests.trainer.procs import (
    ROOT,
    heartbeat_step,
    read_metrics,
    run_trainer,
    trainer_cmd,
    trainer_env,
)
from trainer.faults import OOM_TEXT
from trainer.metrics import parse_line

FAST = ("--set", "train.log_every=1", "--set", "train.ckpt_every=1000")


def test_crash_prints_traceback_and_exits_1(tmp_path: Path) -> None:
    proc = run_trainer(tmp_path, "--steps", "6", "--fault", "crash@3", *FAST)
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.rstrip().endswith("RuntimeError: injected fault: crash at step 3")
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    assert heartbeat_step(tmp_path) == 2
    assert "trainer: finished" not in proc.stdout


def test_oom_raises_cuda_oom_text(tmp_path: Path) -> None:
    proc = run_trainer(tmp_path, "--steps", "6", "--fault", "oom@2", *FAST)
    assert proc.returncode == 1
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" in proc.stderr
    assert OOM_TEXT in proc.stderr
    assert heartbeat_step(tmp_path) == 1


def test_silent_exit_leaves_no_trace(tmp_path: Path) -> None:
    proc = run_trainer(tmp_path, "--steps", "6", "--fault", "silent-exit@3", *FAST)
    assert proc.returncode == 0
    assert proc.stderr == ""
    assert "trainer: finished" not in proc.stdout
    assert [parse_line(x)["step"] for x in proc.stdout.splitlines() if parse_line(x)] == [1, 2]
    assert heartbeat_step(tmp_path) == 2
    assert not (tmp_path / "checkpoints").exists()


def test_nan_poisons_loss_from_that_step(tmp_path: Path) -> None:
    proc = run_trainer(tmp_path, "--steps", "5", "--fault", "nan@3", *FAST)
    assert proc.returncode == 0, proc.stderr
    losses = [parse_line(x)["loss"] for x in proc.stdout.splitlines() if parse_line(x)]
    assert len(losses) == 5
    assert all(math.isfinite(v) for v in losses[:2])
    assert all(math.isnan(v) for v in losses[2:])
    assert "loss=nan" in proc.stdout
    assert [r["loss"] for r in read_metrics(tmp_path)][2:] == [None, None, None]


def test_slow_drops_throughput(tmp_path: Path) -> None:
    proc = run_trainer(
        tmp_path, "--steps", "16", "--fault", "slow@9:6", "--set", "train.log_every=4"
    )
    assert proc.returncode == 0, proc.stderr
    tok_s = {r["step"]: r["tok_s"] for r in read_metrics(tmp_path)}
    before = max(tok_s[4], tok_s[8])
    after = max(tok_s[12], tok_s[16])
    assert after < before / 2.5, tok_s


def test_hang_stays_alive_without_progress(tmp_path: Path) -> None:
    """A hang beats no more and logs nothing, yet the process lives; a second SIGTERM ends it."""
    proc = subprocess.Popen(
        trainer_cmd(tmp_path, "--steps", "50", "--fault", "hang@3", *FAST),
        cwd=ROOT,
        env=trainer_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: heartbeat_step(tmp_path) == 2, timeout_s=60, what="two steps")
        beat = (tmp_path / "heartbeat").stat().st_mtime_ns
        time.sleep(3.0)  # an absence of progress can only be observed over time
        assert proc.poll() is None
        assert (tmp_path / "heartbeat").stat().st_mtime_ns == beat
        assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
        proc.send_signal(signal.SIGTERM)  # graceful stop cannot complete: the step never ends
        time.sleep(1.0)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGTERM
