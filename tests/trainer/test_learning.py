"""The drafter learns: loss falls and acceptance (tau_tf, tau) rises; the 200-step CLI run is fast."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from tests.trainer.procs import TINY, read_metrics, run_trainer
from trainer.config import load_config
from trainer.metrics import parse_line
from trainer.pipeline import RunOptions, Trainer


def test_loss_falls_and_tau_tf_rises(tmp_path: Path) -> None:
    # the random target: its attractor cycles are learnt in 40 steps (the copy task: test_tau.py)
    cfg = load_config(TINY, ["train.steps=40", "train.log_every=10", "target.kind=lm"])
    out = io.StringIO()
    result = Trainer(cfg, RunOptions(tmp_path, log_out=out)).run_pipelined(40)
    assert result.step == 40
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [10, 20, 30, 40]
    first, last = records[0], records[-1]
    assert last["loss"] < first["loss"] - 0.6, records
    assert last["tau_tf"] > first["tau_tf"] + 0.5, records
    lines = [x for x in out.getvalue().splitlines() if not x.startswith("trainer: tau eval ")]
    assert [parse_line(line)["step"] for line in lines] == [10, 20, 30, 40]
    assert parse_line(lines[-1])["loss"] == pytest.approx(last["loss"], abs=1e-4)
    assert (tmp_path / "heartbeat").read_text().split()[0] == "40"


def test_text_data_bytewise(tmp_path: Path) -> None:
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    cfg = load_config(
        TINY,
        [
            "data.kind=text",
            f"data.path={text}",
            "target.vocab_size=256",
            "target.kind=lm",
            "train.steps=3",
            "train.log_every=1",
        ],
    )
    result = Trainer(cfg, RunOptions(tmp_path / "run", log_out=io.StringIO())).run_pipelined(3)
    assert result.step == 3
    assert len(read_metrics(tmp_path / "run")) == 3


@pytest.mark.slow
@pytest.mark.serial  # CPU-bound: a time limit, or one torch.compile per core
def test_cli_200_steps_under_two_minutes(tmp_path: Path) -> None:
    t0 = time.monotonic()
    proc = run_trainer(tmp_path, "--steps", "200", timeout_s=180)
    wall_s = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert wall_s < 120, f"200 steps took {wall_s:.1f} s"
    out = proc.stdout.splitlines()
    assert out[0].startswith("trainer: version=")
    assert any("python=" in line and "torch=" in line and "cuda=" in line for line in out)
    metrics = [m for line in out if (m := parse_line(line))]
    assert len(metrics) == 20 and metrics[-1]["step"] == 200
    assert metrics[-1]["loss"] < metrics[0]["loss"] and metrics[-1]["tau"] > metrics[0]["tau"]
    assert metrics[-1]["tau"] > 2.5, metrics[-1]  # real draft-and-verify, block_size 4
    assert out[-1].startswith("trainer: finished step=200")
    print(f"tiny-cpu 200 steps: {wall_s:.1f} s wall")
