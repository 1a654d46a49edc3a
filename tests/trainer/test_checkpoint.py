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
from trainer.checkpoint import NonFiniteError
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


def test_a_nonfinite_state_is_never_written(tmp_path: Path) -> None:
    state = {"drafter": {"w": torch.tensor([1.0, float("nan")])}}
    with pytest.raises(NonFiniteError, match=r"not writing the checkpoint of step 4: drafter\.w"):
        checkpoint.save(tmp_path, 4, state, keep=3)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # no file, no temp file


def test_resume_skips_a_nonfinite_checkpoint(tmp_path: Path) -> None:
    """A NaN checkpoint (as an older trainer wrote after ``nan@N``) is refused, with a warning;
    ``--resume auto`` continues from the newest finite one."""
    cfg = load_config(TINY, ["train.ckpt_every=2", "train.steps=4"])
    Trainer(cfg, RunOptions(tmp_path, log_out=io.StringIO())).run_pipelined(4)
    good = checkpoint.load_latest(tmp_path)
    assert good is not None and good.step == 4
    poisoned = dict(good.state, step=6)
    poisoned["drafter"] = {k: v * float("nan") for k, v in good.state["drafter"].items()}
    bad = tmp_path / "checkpoints" / "step_0000006.pt"
    torch.save(poisoned, bad)
    proc = run_trainer(tmp_path, "--resume", "auto", "--steps", "5")
    assert proc.returncode == 0, proc.stderr
    assert f"trainer: warning: skipping non-finite checkpoint {bad}: drafter." in proc.stderr
    assert f"resumed from {good.path} at step=4" in proc.stdout


def test_resume_with_more_steps_keeps_the_saved_lr_schedule(tmp_path: Path) -> None:
    """The schedule's length is saved: resuming a 6-step run with ``--steps 12`` continues at
    the decayed floor (10 % of train.lr), it does not restart a longer cosine."""
    first = run_trainer(
        tmp_path, "--steps", "6", "--set", "train.log_every=1", "--set", "train.warmup_steps=2"
    )
    assert first.returncode == 0, first.stderr
    second = run_trainer(
        tmp_path,
        "--resume",
        "auto",
        "--steps",
        "12",
        "--set",
        "train.log_every=1",
        "--set",
        "train.warmup_steps=2",
    )
    assert second.returncode == 0, second.stderr
    assert "at step=6 lr_schedule_steps=6" in second.stdout
    lr = {r["step"]: r["lr"] for r in read_metrics(tmp_path)}
    floor = load_config(TINY).train.lr * 0.1
    assert lr[6] == pytest.approx(floor)
    assert all(lr[s] == pytest.approx(floor) for s in range(7, 13)), lr
