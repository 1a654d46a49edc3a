"""tau: real greedy draft-and-verify against the target, and the objective it should agree with."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
import torch

from tests.trainer.procs import TINY, read_metrics
from trainer.config import load_config
from trainer.data import TokenSource, generate
from trainer.model import Drafter, TargetLM
from trainer.pipeline import RunOptions, Trainer
from trainer.verify import accepted, bigram_drafts, evaluate, measure_tau, successor_table


@pytest.fixture(scope="module")
def target() -> TargetLM:
    return TargetLM(load_config(TINY).target)


def greedy_rows(target: TargetLM, n: int, length: int) -> torch.Tensor:
    prompts = torch.randint(
        0, target.vocab_size, (n, 4), generator=torch.Generator().manual_seed(7)
    )
    return generate(target, prompts, length, 0.0, torch.Generator())


def test_the_target_accepts_its_own_continuation_up_to_the_first_wrong_draft(
    target: TargetLM,
) -> None:
    """Drafts equal to the target's greedy continuation are all accepted; a wrong draft at slot
    k stops acceptance there, whatever follows (the drafts after it are still right)."""
    tokens = greedy_rows(target, 3, 24)
    anchors = torch.tensor([[5, 11], [7, 9], [12, 16]])
    k = 5  # drafts per block (B = 6)
    right = torch.stack(
        [
            torch.stack([tokens[i, a + 1 : a + 1 + k] for a in row])
            for i, row in enumerate(anchors.tolist())
        ]
    )
    assert accepted(target, tokens, anchors, right).tolist() == [[5, 5], [5, 5], [5, 5]]
    wrong = right.clone()
    wrong[0, 0, 2] = (wrong[0, 0, 2] + 1) % target.vocab_size  # slot 3 of block (0, 0)
    wrong[2, 1, 0] = (wrong[2, 1, 0] + 1) % target.vocab_size  # slot 1 of block (2, 1)
    assert accepted(target, tokens, anchors, wrong).tolist() == [[2, 5], [5, 5], [5, 0]]


def test_greedy_generation_with_the_kv_cache_is_the_full_forward_argmax(target: TargetLM) -> None:
    tokens = greedy_rows(target, 4, 32)
    logits, _ = target(tokens)
    assert torch.equal(logits.argmax(-1)[:, 3:-1], tokens[:, 4:])


def test_heldout_sequences_are_not_training_sequences(target: TargetLM) -> None:
    cfg = load_config(TINY, ["data.pool=32"])
    source = TokenSource(cfg.data, cfg.target.vocab_size, target=target)
    train = {tuple(r) for r in source.pool.tolist()}
    held = source.heldout(8).tolist()
    assert not any(tuple(r) in train for r in held)
    assert source.batch(3, 8).tolist() == source.batch(3, 8).tolist()  # a pure function of step


def test_tau_rises_with_training_and_needs_the_context(tmp_path: Path) -> None:
    """The bundled tiny-cpu config (a copy target, on-policy data): tau, measured by real
    verification on held-out anchors, starts near 1 and passes 2.5 within 60 steps; the same
    drafter with the context features zeroed, and a most-frequent-successor table on the same
    anchors, stay near 1 (each next token is the one 16 positions back, which only the context
    holds); the teacher-forced proxy rises too."""
    cfg = load_config(TINY, ["train.eval_every=30", "train.eval_seqs=16", "train.log_every=30"])
    trainer = Trainer(cfg, RunOptions(tmp_path, log_out=io.StringIO()))
    before = trainer.evaluate()
    t0 = time.monotonic()
    trainer.run_pipelined(60)
    wall_s = time.monotonic() - t0
    records = read_metrics(tmp_path)
    taus = [r["tau"] for r in records]
    assert [r["step"] for r in records] == [30, 60]
    assert before is not None and before < 1.2, before
    tau = taus[-1]
    no_context = trainer.evaluate(context=False)
    tokens, anchors = trainer.heldout  # type: ignore[misc]
    table = successor_table(trainer.source.pool, cfg.target.vocab_size)
    bigram = evaluate(trainer.target, bigram_drafts(table, 4), tokens, anchors, 4, 64).tau
    assert tau >= 2.5 and tau > taus[0], (before, taus)
    assert no_context is not None and tau > no_context + 1.0, (tau, no_context)
    assert tau > bigram + 1.0, (tau, bigram)
    assert records[-1]["tau_tf"] > records[0]["tau_tf"], records  # an interval mean: it lags
    print(
        f"tau {before:.2f} -> {taus} in 60 steps ({wall_s:.1f} s); context zeroed "
        f"{no_context:.2f}, bigram {bigram:.2f}"
    )


def test_an_untrained_drafter_gets_tau_near_one(target: TargetLM) -> None:
    """tau = 1 + mean accepted drafts: between 1 and B, near 1 before any training."""
    cfg = load_config(TINY)
    tokens = greedy_rows(target, 4, 64)
    anchors = torch.tensor([[8, 20, 30, 40]] * 4)
    drafter = Drafter(cfg.drafter, target.embedding_weight(), target.head_weight())
    tau = measure_tau(target, drafter, tokens, anchors, cfg.drafter.target_layers, "cpu")
    assert 1.0 <= tau < 1.5, tau
