"""Checkpoints: atomic, pruned, truncated ones skipped; SIGTERM then --resume auto continues."""

from __future__ import annotations

import io
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from tests.helpers import wait_for
from tests.trainer.procs import (
    ROOT,
    TINY,
    heartbeat_step,
    read_metrics,
    run_trainer,
    trainer_cmd,
    trainer_env,
)
from trainer import checkpoint
from trainer.config import load_config
from trainer.pipeline import RunOptions, Trainer


def test_save_is_atomic_and_pruned(tmp_path: Path) -> None:
    for step in (5, 10, 15, 20):
        checkpoint.save(tmp_path, step, {"drafter": {"w": torch.ones(2) * step}}, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_0000015.pt", "step_0000020.pt"]  # no temp files left, oldest pruned
    loaded = checkpoint.load_latest(tmp_path)
    assert loaded is not None and loaded.step == 20
    assert torch.equal(loaded.state["drafter"]["w"], torch.full((2,), 20.0))


def test_truncated_checkpoint_is_skipped_with_warning(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    checkpoint.save(tmp_path, 5, {"drafter": {"w": torch.zeros(1000)}}, keep=5)
    newest = checkpoint.save(tmp_path, 10, {"drafter": {"w": torch.ones(1000)}}, keep=5)
    newest.write_bytes(newest.read_bytes()[:300])  # a crash mid-write without our temp+rename
    loaded = checkpoint.load_latest(tmp_path)
    assert loaded is not None and loaded.step == 5
    err = capfd.readouterr().err
    assert f"trainer: warning: skipping unreadable checkpoint {newest}" in err


def test_resume_in_process_equals_uninterrupted_run(tmp_path: Path) -> None:
    cfg = load_config(TINY, ["train.ckpt_every=3", "train.steps=6"])
    straight = Trainer(cfg, RunOptions(tmp_path / "a", log_out=io.StringIO()))
    straight.run_pipelined(6)
    first = Trainer(cfg, RunOptions(tmp_path / "b", log_out=io.StringIO()))
    assert first.run_pipelined(3).step == 3
    second = Trainer(cfg, RunOptions(tmp_path / "b", resume=True, log_out=io.StringIO()))
    assert second.start_step == 3
    assert second.run_pipelined(6).step == 6
    a, b = straight.replicas[0].state_dict(), second.replicas[1].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sigterm_checkpoints_then_resume_continues(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.Popen(
        trainer_cmd(
            run,
            "--steps",
            "100000",
            "--set",
            "train.log_every=1",
            "--set",
            "train.ckpt_every=100000",
        ),
        cwd=ROOT,
        env=trainer_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: (heartbeat_step(run) or 0) >= 5, timeout_s=60, what="5 steps")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    stopped = [line for line in out.splitlines() if line.startswith("trainer: stopped by SIGTERM")]
    assert stopped, out
    step = int(stopped[0].split("step=")[1].split(";")[0])
    assert step >= 5
    assert (run / "checkpoints" / f"step_{step:07d}.pt").exists()
    assert read_metrics(run)[-1]["step"] == step

    resumed = run_trainer(
        run, "--resume", "auto", "--steps", str(step + 3), "--set", "train.log_every=1"
    )
    assert resumed.returncode == 0, resumed.stderr
    assert (
        f"trainer: resumed from {run / 'checkpoints' / f'step_{step:07d}.pt'} at step={step}"
        in resumed.stdout
    )
    new_steps = [r["step"] for r in read_metrics(run)]
    assert new_steps[-4:] == [step, step + 1, step + 2, step + 3]
    assert f"trainer: finished step={step + 3}" in resumed.stdout
