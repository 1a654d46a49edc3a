"""Token data: a synthetic stream with learnable structure, or a local text file read bytewise.

Every batch is a pure function of ``(seed, step)``, so replicas, ranks and a resumed run all see
exactly the same data for a given step without any data-loader state in the checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch

from trainer.config import DataConfig


class TokenSource:
    """Produces ``(batch, seq_len)`` int64 token batches on CPU.

    ``synthetic``: a sparse Markov chain; each token has ``branching`` possible successors (drawn
    once from ``seed``) with probabilities skewed towards the first, so a drafter can learn to
    guess several tokens ahead. ``text``: random windows over the bytes of ``path`` (vocab 256).

    Raises:
        OSError: the text file cannot be read.
        ValueError: the text file is shorter than one sequence.
    """

    def __init__(self, cfg: DataConfig, vocab_size: int) -> None:
        self.cfg = cfg
        self.vocab_size = vocab_size
        gen = torch.Generator().manual_seed(cfg.seed)
        if cfg.kind == "text":
            raw = Path(str(cfg.path)).read_bytes()
            if len(raw) < cfg.seq_len + 1:
                raise ValueError(f"{cfg.path}: {len(raw)} bytes, need at least {cfg.seq_len + 1}")
            self.text = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.int64)
        else:
            k = cfg.branching
            self.successors = torch.stack(
                [torch.randperm(vocab_size, generator=gen)[:k] for _ in range(vocab_size)]
            )
            weights = torch.tensor([0.8**i for i in range(k)]) ** 3
            self.probs = weights / weights.sum()

    def batch(self, step: int, batch_size: int) -> torch.Tensor:
        """The batch for ``step`` (deterministic in ``(seed, step)``)."""
        gen = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + step)
        t = self.cfg.seq_len
        if self.cfg.kind == "text":
            starts = torch.randint(0, len(self.text) - t, (batch_size,), generator=gen)
            return torch.stack([self.text[s : s + t] for s in starts.tolist()])
        tokens = torch.empty(batch_size, t, dtype=torch.int64)
        tokens[:, 0] = torch.randint(0, self.vocab_size, (batch_size,), generator=gen)
        choice = torch.multinomial(
            self.probs, batch_size * (t - 1), replacement=True, generator=gen
        )
        choice = choice.view(batch_size, t - 1)
        for i in range(1, t):
            tokens[:, i] = self.successors[tokens[:, i - 1], choice[:, i - 1]]
        return tokens


def sample_anchors(
    seed: int, step: int, batch_size: int, blocks: int, seq_len: int, block_size: int
) -> torch.Tensor:
    """Random anchor positions ``(batch, blocks)`` in ``[1, seq_len - block_size]``, sorted per row.

    >>> a = sample_anchors(0, 5, 3, 4, 16, 4)
    >>> a.shape, bool(((a >= 1) & (a <= 12)).all())
    (torch.Size([3, 4]), True)
    """
    gen = torch.Generator().manual_seed(seed * 1_000_033 + step)
    anchors = torch.randint(1, seq_len - block_size + 1, (batch_size, blocks), generator=gen)
    return anchors.sort(dim=1).values
