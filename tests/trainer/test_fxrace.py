"""Seed 002's FX race, made reproducible: ``--fault fx-race`` fires without the warm-up only.

The error is torch's own (``torch._dynamo.eval_frame`` refuses to enter a compiled function while
any thread runs ``torch.fx.symbolic_trace``); the fault only puts an FX trace where the seeds'
lazy first compile had one and holds its window open. See ``trainer/fxrace.py``.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.trainer.procs import TINY, read_metrics, run_trainer
from trainer.config import load_config
from trainer.pipeline import RunOptions, Trainer

SEED_002 = (
    "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized "
    "function. This is not supported at the moment."
)
ARGS = ("--steps", "3", "--fault", "fx-race@1", "--set", "train.log_every=1")


def test_fx_race_without_the_warmup_is_the_seeds_error(tmp_path: Path) -> None:
    proc = run_trainer(tmp_path, *ARGS, "--warmup", "none")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.rstrip().endswith(SEED_002), proc.stderr[-3000:]
    assert "torch/_dynamo/eval_frame.py" in proc.stderr  # raised by dynamo's check, not by us
    assert "trainer: faults fx-race@1" in proc.stdout
    assert (
        "attention=sdpa+compile(eager)" in proc.stdout or "cpu:sdpa+compile(eager)" in proc.stdout
    )
    assert read_metrics(tmp_path) == []


def test_fx_race_with_the_sequential_warmup_does_not_fire(tmp_path: Path) -> None:
    proc = run_trainer(tmp_path, *ARGS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Detected that you are using FX" not in proc.stderr
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]


@pytest.fixture
def compiles() -> Iterator[list[str]]:
    """Names of the threads in which dynamo starts compiling a frame, while the test runs."""
    seen: list[str] = []

    def on_start(_args: object) -> None:
        seen.append(threading.current_thread().name)

    torch._dynamo.reset()  # a fresh cache: earlier tests' compiles must not hide ours
    torch._dynamo.callback_handler.register_start_callback(on_start)
    try:
        yield seen
    finally:
        torch._dynamo.callback_handler.remove_start_callback(on_start)


def _compiled_run(tmp_path: Path, warmup: str) -> None:
    cfg = load_config(TINY, ["train.eval_every=2", "train.log_every=1"])
    opts = RunOptions(tmp_path, compile=True, compile_backend="eager", log_out=io.StringIO())
    trainer = Trainer(cfg, opts)
    trainer.warmup(warmup)
    assert trainer.run_pipelined(4).step == 4


def test_after_the_warmup_no_frame_compiles_in_a_worker_thread(
    tmp_path: Path, compiles: list[str]
) -> None:
    """Training steps, the gradient-checkpoint recompute and the tau measurement included."""
    _compiled_run(tmp_path, "sequential")
    assert compiles and set(compiles) == {"MainThread"}, compiles


def test_without_the_warmup_frames_compile_in_the_worker_threads(
    tmp_path: Path, compiles: list[str]
) -> None:
    """The counterpart: the probe above does see a worker's compile when there is one."""
    _compiled_run(tmp_path, "none")
    assert any(name.startswith("drafter-") for name in compiles), compiles
