"""Every --fault produces its documented symptom (docs/trainer.md, "Fault injection")."""

from __future__ import annotations

import math
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

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
# The target ~100x the drafter's work: only a stretched target stage slows this pipeline down.
TARGET_BOUND = (
    "--set",
    "train.log_every=4",
    "--set",
    "train.eval_every=0",
    "--set",
    "target.d_model=256",
    "--set",
    "target.d_ff=1024",
    "--set",
    "target.n_layers=6",
    "--set",
    "drafter.target_layers=[0]",
    "--set",
    "drafter.d_model=16",
    "--set",
    "drafter.d_ff=16",
    "--set",
    "drafter.n_layers=1",
    "--set",
    "data.kind=synthetic",
    "--set",
    "devices.drafter=[cpu]",
)


def test_crash_prints_traceback_and_exits_1(tmp_path: Path) -> None:
    proc = run_trainer(tmp_path, "--steps", "6", "--fault", "crash@3", *FAST)
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.rstrip().endswith("RuntimeError: injected fault: crash at step 3")
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    assert heartbeat_step(tmp_path) == 2
    assert "trainer: finished" not in proc.stdout


def test_crash_once_fires_from_step_0_only_so_a_resume_gets_past_it(tmp_path: Path) -> None:
    """``crash-once@N``: the first run crashes at N like ``crash@N``; the same command with
    ``--resume auto`` starts after the newest checkpoint (< N) and finishes (the restart loop)."""
    args = (
        "--steps",
        "8",
        "--fault",
        "crash-once@6",
        "--set",
        "train.log_every=1",
        "--set",
        "train.ckpt_every=4",
    )
    first = run_trainer(tmp_path, *args)
    assert first.returncode == 1, first.stderr[-2000:]
    assert first.stderr.rstrip().endswith("RuntimeError: injected fault: crash at step 6")
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5]
    again = run_trainer(tmp_path, *args, "--resume", "auto")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "trainer: resumed from " in again.stdout and " at step=4 " in again.stdout
    assert "trainer: faults crash-once@6" in again.stdout
    steps = [r["step"] for r in read_metrics(tmp_path)]
    assert steps == [1, 2, 3, 4, 5, 5, 6, 7, 8], steps  # the resumed run's first step is 5 > 4
    assert "trainer: finished step=8" in again.stdout


def test_oom_raises_cuda_oom_text_in_the_target_forward(tmp_path: Path) -> None:
    """``oom@N`` is raised where a real CUDA OOM of the target's GPUs is: inside the
    coordinator's target forward, while the drafter workers run. The workers are stopped and
    joined, so the process exits 1 with the traceback (not ``terminate called ...``, 134)."""
    proc = run_trainer(tmp_path, "--steps", "6", "--fault", "oom@2", *FAST)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" in proc.stderr
    assert OOM_TEXT in proc.stderr
    assert ", in run_target\n" in proc.stderr and ", in _target_fault\n" in proc.stderr
    assert "terminate called" not in proc.stderr
    assert heartbeat_step(tmp_path) == 1


def test_silent_exit_leaves_no_trace(tmp_path: Path) -> None:
    proc = run_trainer(tmp_path, "--steps", "6", "--fault", "silent-exit@3", *FAST)
    assert proc.returncode == 0
    assert proc.stderr == ""
    assert "trainer: finished" not in proc.stdout
    assert [parse_line(x)["step"] for x in proc.stdout.splitlines() if parse_line(x)] == [1, 2]
    assert heartbeat_step(tmp_path) == 2
    assert not (tmp_path / "checkpoints").exists()


def test_nan_step_is_skipped_counted_and_never_checkpointed(tmp_path: Path) -> None:
    """``nan@3``: step 3's gradient is NaN; the step is skipped (weights unchanged), counted,
    and training goes on from finite weights: every checkpoint is finite."""
    proc = run_trainer(
        tmp_path,
        "--steps",
        "6",
        "--fault",
        "nan@3",
        *FAST[:2],
        "--set",
        "train.ckpt_every=1",
        "--set",
        "train.keep_ckpts=10",
    )
    assert proc.returncode == 0, proc.stderr
    losses = [parse_line(x)["loss"] for x in proc.stdout.splitlines() if parse_line(x)]
    assert len(losses) == 6
    assert math.isnan(losses[2]) and all(math.isfinite(v) for v in losses[:2] + losses[3:])
    records = read_metrics(tmp_path)
    assert [r["loss"] for r in records][2] is None
    assert [r["nonfinite_steps"] for r in records] == [0, 0, 1, 1, 1, 1]
    assert "trainer: warning: step 3: gradient not finite, step skipped" in proc.stderr
    saved = sorted((tmp_path / "checkpoints").glob("step_*.pt"))
    assert len(saved) == 6
    states = [torch.load(p, weights_only=True)["drafter"] for p in saved]
    assert all(torch.isfinite(t).all() for s in states for t in s.values())
    assert all(torch.equal(states[1][k], states[2][k]) for k in states[1])  # step 3 skipped


def test_nonfinite_steps_in_a_row_stop_the_run_with_a_clear_message(tmp_path: Path) -> None:
    proc = run_trainer(
        tmp_path,
        "--steps",
        "20",
        "--fault",
        "nan@3:100",
        *FAST[:2],
        "--set",
        "train.ckpt_every=2",
        "--set",
        "train.max_nonfinite_steps=4",
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.rstrip().splitlines()[-1]
    assert last.startswith(
        "trainer.checkpoint.NonFiniteError: 4 steps in a row had a non-finite "
        "gradient (steps 3..6; train.max_nonfinite_steps=4); stopping."
    ), last
    assert heartbeat_step(tmp_path) == 5  # step 6's bookkeeping raised before its beat
    for path in (tmp_path / "checkpoints").glob("step_*.pt"):
        state = torch.load(path, weights_only=True)
        assert all(torch.isfinite(t).all() for t in state["drafter"].values()), path


@pytest.mark.serial  # a throughput ratio within one run: load that changes mid-run reads as the factor
def test_slow_drops_throughput_and_the_banner_names_the_factor(tmp_path: Path) -> None:
    proc = run_trainer(
        tmp_path, "--steps", "16", "--fault", "slow@9:6", "--set", "train.log_every=4"
    )
    assert proc.returncode == 0, proc.stderr
    assert "trainer: faults slow@9:6\n" in proc.stdout
    tok_s = {r["step"]: r["tok_s"] for r in read_metrics(tmp_path)}
    before = max(tok_s[4], tok_s[8])
    after = max(tok_s[12], tok_s[16])
    assert after < before / 2.5, tok_s


@pytest.mark.serial  # a throughput ratio within one run: load that changes mid-run reads as the factor
def test_slow_stretches_the_target_stage_too(tmp_path: Path) -> None:
    """A target-bound pipeline (big target, tiny drafter) slows by the factor as well: the
    coordinator's target forward is stretched, not only drafter worker 0's step."""
    proc = run_trainer(tmp_path, "--steps", "24", "--fault", "slow@13:6", *TARGET_BOUND)
    assert proc.returncode == 0, proc.stderr
    tok_s = {r["step"]: r["tok_s"] for r in read_metrics(tmp_path)}
    before = max(tok_s[s] for s in (4, 8, 12))
    after = max(tok_s[s] for s in (16, 20, 24))
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
