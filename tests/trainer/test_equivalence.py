"""Replicas: two drafter replicas equal one replica trained on the same combined batch."""

from __future__ import annotations

import io
from pathlib import Path

import torch

from tests.trainer.procs import TINY
from trainer.config import load_config
from trainer.pipeline import RunOptions, Trainer

STEPS = 4


def train(tmp_path: Path, name: str, drafters: str, *, plain: bool = False) -> Trainer:
    cfg = load_config(TINY, [f"devices.drafter={drafters}", f"train.steps={STEPS}"])
    trainer = Trainer(cfg, RunOptions(tmp_path / name, log_out=io.StringIO()))
    trainer.warmup("sequential")
    result = trainer.run_plain(STEPS) if plain else trainer.run_pipelined(STEPS)
    assert result.step == STEPS
    return trainer


def params(trainer: Trainer, i: int = 0) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.replicas[i].named_parameters()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_two_replicas_match_one_replica_on_combined_batch(tmp_path: Path) -> None:
    reference = train(tmp_path, "plain", "[cpu]", plain=True)
    one = train(tmp_path, "one", "[cpu]")
    two = train(tmp_path, "two", "[cpu, cpu]")
    ref = params(reference)
    start = params(Trainer(load_config(TINY), RunOptions(tmp_path / "init", log_out=io.StringIO())))
    assert max_diff(ref, start) > 1e-3  # training moved the weights, so agreement means something
    assert max_diff(params(one), ref) == 0.0  # same ops, same order
    assert max_diff(params(two), ref) < 1e-5  # same maths, different summation order
    assert max_diff(params(two, 0), params(two, 1)) == 0.0  # replicas stay identical
    for a, b in zip(
        one.optimizers[0].state.values(), two.optimizers[1].state.values(), strict=True
    ):
        assert torch.allclose(a["exp_avg_sq"], b["exp_avg_sq"], rtol=1e-4, atol=1e-10)
