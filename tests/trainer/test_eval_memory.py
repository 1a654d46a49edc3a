"""tau's evaluation runs in chunks: its peak memory does not grow with the held-out rows."""

from __future__ import annotations

import torch

from tests.trainer.procs import TINY
from trainer.config import load_config
from trainer.data import sample_anchors
from trainer.model import Drafter, TargetLM
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
