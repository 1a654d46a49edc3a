"""A frozen target whose next token depends on long context: a copy (induction) structure.

The built-in random :class:`~trainer.model.TargetLM`'s greedy continuations collapse into short
attractor cycles, so a most-frequent-successor table scores as well as a trained drafter and the
context features carry nothing a drafter needs. This target's greedy next token after position
``j`` is the token ``period`` positions back, ``x[j+1-period]`` (``x[j]`` while ``j+1 < period``):
its greedy continuation of a random prompt repeats the prompt, every sequence differently. A
drafter that drafts slot ``k`` of the block at anchor ``a`` must read ``x[a+k-period]`` from the
context features (positions ``< a``); with the context zeroed, or from a successor table shared
by all sequences, it can only guess.

Its hidden states are those of a model that does this: layer ``l`` of ``n`` holds the token at
``j`` mixed with the token it will predict (``(1 - l/(n-1))`` and ``l/(n-1)`` of each, shallow to
deep), through a fixed random rotation per layer, plus a constant offset (real LMs carry one too;
it gives the drafter's context keys a content-free part that rotary attention can place by
relative offset). Embedding rows are orthogonal, so the head's argmax is exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from trainer.config import TargetConfig

EMBED_NORM = 2.0
"""Norm of every embedding row (and head row): the head's correct logit is 4 above the rest (all others are 0), a
sure argmax, while an untrained drafter's logits stay moderate enough to learn from quickly."""


def copy_source(tokens: torch.Tensor, period: int) -> torch.Tensor:
    """The token each position predicts next: ``x[j+1-period]``, or ``x[j]`` before that exists.

    >>> copy_source(torch.tensor([[5, 6, 7, 8, 9]]), 3).tolist()
    [[5, 6, 5, 6, 7]]
    """
    t = tokens.shape[1]
    src = torch.arange(t, device=tokens.device) + 1 - period
    src = torch.where(src >= 0, src, torch.arange(t, device=tokens.device))
    return tokens[:, src]


class CopyTarget(nn.Module):
    """The copy target in the :class:`~trainer.model.TargetLM` interface (``forward``, ``decode``,
    ``place``, ``embedding_weight``, ``head_weight``); ``cfg.copy_period`` is the period.

    Raises:
        ValueError: ``cfg.d_model < cfg.vocab_size`` (the embedding rows must be orthogonal).
    """

    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        if cfg.d_model < cfg.vocab_size:
            raise ValueError("a copy target needs target.d_model >= target.vocab_size")
        gen = torch.Generator().manual_seed(cfg.seed)
        d = cfg.d_model
        self.vocab_size, self.d_model, self.period = cfg.vocab_size, d, cfg.copy_period
        basis = torch.linalg.qr(torch.randn(d, d, generator=gen))[0]
        self.register_buffer("embed", basis[: cfg.vocab_size] * EMBED_NORM)
        rot = [torch.linalg.qr(torch.randn(d, d, generator=gen))[0] for _ in range(cfg.n_layers)]
        rot[-1] = torch.eye(d)  # the last layer speaks the head's language
        self.register_buffer("rot", torch.stack(rot))
        self.register_buffer("offset", 0.3 * torch.randn(d, generator=gen))
        self.requires_grad_(False)
        self.eval()
        self.devices: list[torch.device] = [torch.device("cpu")] * (cfg.n_layers + 2)

    @property
    def n_layers(self) -> int:
        return int(self.rot.shape[0])

    def place(self, devices: Sequence[str]) -> None:
        """Everything on the first device (the copy target is a few small matrices)."""
        self.to(devices[0])
        self.devices = [torch.device(devices[0])] * (self.n_layers + 2)

    def embedding_weight(self) -> torch.Tensor:
        return self.embed

    def head_weight(self) -> torch.Tensor:
        return self.embed

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        tokens = tokens.to(self.embed.device)
        now, nxt = self.embed[tokens], self.embed[copy_source(tokens, self.period)]
        n = self.n_layers
        hidden = []
        for layer in range(n):
            mix = layer / max(1, n - 1)
            h = ((1 - mix) * now + mix * nxt) @ self.rot[layer].T
            hidden.append(h + self.offset if layer < n - 1 else h)
        return hidden[-1] @ self.embed.T, hidden

    @torch.no_grad()
    def decode(
        self, tokens: torch.Tensor, cache: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Generation step: logits ``(b, V)`` after the last token; the "cache" is the tokens."""
        seen = tokens if cache is None else torch.cat((cache, tokens.to(cache.device)), dim=1)
        logits, _ = self(seen)
        return logits[:, -1], seen
