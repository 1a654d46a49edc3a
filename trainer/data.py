"""Token data: a synthetic stream, a local text file read bytewise, or the target's own output.

Every batch is a pure function of ``(seed, step)``, so replicas, ranks and a resumed run all see
exactly the same data for a given step without any data-loader state in the checkpoint. The
held-out sequences that ``tau`` is measured on come from a separate stream of the same source.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from trainer.config import DataConfig

_HELDOUT = 999_999_937
"""Stream id of the held-out sequences (training steps use their step number)."""
_POOL = 999_999_929
"""Stream id of the prompts the on-policy pool continues."""
_GEN_ROWS = 64
"""Sequences generated at once: bounds the KV cache (64 x seq_len tokens per target layer)."""


class TokenSource:
    """Produces ``(batch, seq_len)`` int64 token batches on CPU.

    ``synthetic``: a sparse Markov chain; each token has ``branching`` possible successors (drawn
    once from ``seed``) with probabilities skewed towards the first, so a drafter can learn to
    guess several tokens ahead. ``text``: random windows over the bytes of ``path`` (vocab 256).
    ``target``: on-policy, as DFlash trains on target-generated responses; ``pool`` sequences are
    generated once at start-up by ``target`` (``prompt_len`` random prompt tokens, then the
    target's continuation at ``temperature``), and each batch draws from that pool.

    Raises:
        OSError: the text file cannot be read.
        ValueError: the text file is shorter than one sequence; ``target`` kind without a target.
    """

    def __init__(self, cfg: DataConfig, vocab_size: int, target: Any = None) -> None:
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.target = target
        self.generate_s = 0.0
        gen = torch.Generator().manual_seed(cfg.seed)
        if cfg.kind == "text":
            raw = Path(str(cfg.path)).read_bytes()
            if len(raw) < cfg.seq_len + 1:
                raise ValueError(f"{cfg.path}: {len(raw)} bytes, need at least {cfg.seq_len + 1}")
            self.text = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.int64)
        elif cfg.kind == "target":
            if target is None:
                raise ValueError("data.kind 'target' needs the target model to generate from")
            t0 = time.monotonic()
            self.pool = self._generate(self._stream(_POOL), cfg.pool)
            self.generate_s = time.monotonic() - t0
        else:
            k = cfg.branching
            self.successors = torch.stack(
                [torch.randperm(vocab_size, generator=gen)[:k] for _ in range(vocab_size)]
            )
            weights = torch.tensor([0.8**i for i in range(k)]) ** 3
            self.probs = weights / weights.sum()

    def _stream(self, stream: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + stream)

    def batch(self, step: int, batch_size: int) -> torch.Tensor:
        """The batch for ``step`` (deterministic in ``(seed, step)``)."""
        gen = self._stream(step)
        if self.cfg.kind == "target":
            rows = torch.randperm(len(self.pool), generator=gen)[:batch_size]
            if len(rows) < batch_size:  # a pool smaller than a batch: draw with replacement
                rows = torch.randint(0, len(self.pool), (batch_size,), generator=gen)
            return self.pool[rows]
        return self._rows(gen, batch_size)

    def heldout(self, n: int) -> torch.Tensor:
        """``n`` sequences no training batch is drawn from (for text: windows of a separate
        random stream over the same file, so they may overlap training windows)."""
        gen = self._stream(_HELDOUT)
        if self.cfg.kind == "target":
            return self._generate(gen, n)
        return self._rows(gen, n)

    def _rows(self, gen: torch.Generator, n: int) -> torch.Tensor:
        t = self.cfg.seq_len
        if self.cfg.kind == "text":
            starts = torch.randint(0, len(self.text) - t, (n,), generator=gen)
            return torch.stack([self.text[s : s + t] for s in starts.tolist()])
        tokens = torch.empty(n, t, dtype=torch.int64)
        tokens[:, 0] = torch.randint(0, self.vocab_size, (n,), generator=gen)
        choice = torch.multinomial(self.probs, n * (t - 1), replacement=True, generator=gen)
        choice = choice.view(n, t - 1)
        for i in range(1, t):
            tokens[:, i] = self.successors[tokens[:, i - 1], choice[:, i - 1]]
        return tokens

    def _generate(self, gen: torch.Generator, n: int) -> torch.Tensor:
        prompts = torch.randint(0, self.vocab_size, (n, self.cfg.prompt_len), generator=gen)
        c = self.cfg
        return torch.cat(
            [
                generate(self.target, prompts[i : i + _GEN_ROWS], c.seq_len, c.temperature, gen)
                for i in range(0, n, _GEN_ROWS)
            ]
        )


@torch.no_grad()
def generate(
    target: Any, prompts: torch.Tensor, length: int, temperature: float, gen: torch.Generator
) -> torch.Tensor:
    """Continue ``prompts (n, p)`` with ``target`` to ``length`` tokens, one token per call of
    ``target.decode`` (KV-cached); greedy at ``temperature`` 0, else sampled on CPU from ``gen``.

    Returns the ``(n, length)`` int64 tokens on CPU.
    """
    out = [prompts]
    logits, cache = target.decode(prompts, None)
    for i in range(length - prompts.shape[1]):
        last = logits.float().cpu()
        if temperature > 0:
            nxt = torch.multinomial((last / temperature).softmax(-1), 1, generator=gen)
        else:
            nxt = last.argmax(-1, keepdim=True)
        out.append(nxt)
        if i + 1 < length - prompts.shape[1]:
            logits, cache = target.decode(nxt, cache)
    return torch.cat(out, dim=1)


def sample_anchors(
    seed: int, step: int, batch_size: int, blocks: int, lo: int, hi: int
) -> torch.Tensor:
    """Anchor positions ``(batch, blocks)`` in ``[lo, hi]``, distinct within a row, sorted per row.

    >>> a = sample_anchors(0, 5, 3, 4, 1, 12)
    >>> a.shape, bool(((a >= 1) & (a <= 12)).all())
    (torch.Size([3, 4]), True)
    >>> sample_anchors(0, 5, 2, 3, 1, 3).tolist()  # without replacement: every position once
    [[1, 2, 3], [1, 2, 3]]
    """
    gen = torch.Generator().manual_seed(seed * 1_000_033 + step)
    order = torch.rand(batch_size, hi - lo + 1, generator=gen).argsort(dim=1)
    return (order[:, :blocks] + lo).sort(dim=1).values
