"""tau's evaluation runs in chunks: its peak memory does not grow with the held-out rows."""

from __future__ import annotations

import io
from pathlib import Path

import torch

from tests.trainer.procs import TINY, read_metrics
from trainer.config import load_config
from trainer.data import sample_anchors
from trainer.model import Drafter, TargetLM
from trainer.pipeline import RunOptions, Trainer
from trainer.verify import drafter_drafts, evaluate


def _peak(seqs: int, chunk_rows: int) -> tuple[int, int]:
    cfg = load_config(TINY)
    target = TargetLM(cfg.target)
    drafter = Drafter(cfg.drafter, target.embedding_weight(), target.head_weight())
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.target.vocab_size, (seqs, cfg.data.seq_len), generator=gen)
    anchors = sample_anchors(0, -1, seqs, 4, 16, cfg.data.seq_len - 4)
    drafts = drafter_drafts(target, drafter, cfg.drafter.target_layers, "cpu")
    result = evaluate(target, drafts, tokens, anchors, 4, chunk_rows)
    assert result.rows == seqs * 4 and 1.0 <= result.tau <= 4.0
    return result.peak_bytes, result.chunks


def test_the_peak_is_flat_in_the_number_of_rows() -> None:
    """8 and 128 held-out sequences (32 and 512 rows) in chunks of 32 rows peak alike; the same
    128 sequences in one pass peak over 8 x higher, so the meter would see a peak that grew."""
    small, small_chunks = _peak(8, 32)
    large, large_chunks = _peak(128, 32)
    whole, whole_chunks = _peak(128, 10_000)
    assert (small_chunks, large_chunks, whole_chunks) == (1, 16, 1)
    assert small > 0
    assert large <= small * 1.1, (small, large)
    assert whole > 8 * small, (small, whole)


def test_a_budgeted_evaluation_spreads_over_the_next_steps(tmp_path: Path) -> None:
    """One chunk per step (a budget any chunk exceeds): the evaluation due after step 5 runs
    on over steps 6..9 and is finished by the one due after step 10 (on the drafter as it was
    after step 5), which is itself still pending when step 12 ends."""
    cfg = load_config(
        TINY,
        [
            "train.eval_every=5",
            "train.log_every=1",
            "train.eval_seqs=8",
            "train.eval_chunk_rows=4",
            "train.eval_budget_s=1.0e-9",
            "data.pool=16",
        ],
    )
    out = io.StringIO()
    trainer = Trainer(cfg, RunOptions(tmp_path, log_out=out))
    trainer.run_plain(12)
    taus = {r["step"]: r["tau"] for r in read_metrics(tmp_path)}
    assert [s for s, t in taus.items() if t is not None] == [10]
    assert trainer.pending_tau is not None and trainer.pending_tau[0] == 10
    evals = [x for x in out.getvalue().splitlines() if x.startswith("trainer: tau eval ")]
    assert len(evals) == 1 and evals[0].startswith("trainer: tau eval after_step=5 value ")
    assert " rows 32 chunks 8 " in evals[0]
