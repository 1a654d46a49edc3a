"""``tau``: the acceptance length of real greedy draft-and-verify, as DFlash reports it.

For a held-out anchor ``a`` the drafter drafts the whole block at once, ``d_1 .. d_{B-1}`` from
``[x[a], MASK x (B-1)]`` and the target's features before ``a``; the target then runs on
``x[..a] + d_1 .. d_{B-1}`` and accepts drafts up to the first one that differs from its own argmax
after the tokens before it, plus its one bonus token. ``tau`` is that count averaged over the
anchors: 1 (nothing accepted) .. B. Unlike the teacher-forced ``tau_tf`` of the training loss,
slot ``k`` is judged after the drafts before it, not after the data.

The held-out rows go through in chunks of about ``chunk_rows`` verification rows (whole
sequences; a sequence's anchors stay together): each chunk's target features, drafts and
verification forward are dropped before the next chunk starts, so the evaluation's memory is that
of one chunk whatever the number of held-out rows, and each sequence is cut after its last
anchor's block. Two baselines score on the same anchors: the same drafter with the context
features zeroed (``tau_no_context``) and a most-frequent-successor table (``tau_bigram``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainer.memwatch import PeakMeter
from trainer.model import Drafter
from trainer.objective import Shard, block_inputs, run_target

Drafts = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(tokens (b, t), anchors (b, n)) -> drafts (b, n, B-1)``: who drafts (drafter or baseline)."""


@torch.no_grad()
def draft(drafter: Drafter, shard: Shard) -> torch.Tensor:
    """The drafter's greedy drafts ``(b, n, B-1)`` for every anchor of ``shard`` (int64, CPU)."""
    B = drafter.block_size
    block_tokens, pos, mask, _ = block_inputs(shard, B)
    was_training = drafter.training
    drafter.eval()
    try:
        logits = drafter(shard.ctx_hidden, block_tokens, pos, mask)
    finally:
        drafter.train(was_training)
    b, n = shard.anchors.shape
    return logits.argmax(-1).view(b, n, B)[:, :, 1:].cpu()


@torch.no_grad()
def accepted(
    target: Any, tokens: torch.Tensor, anchors: torch.Tensor, drafts: torch.Tensor
) -> torch.Tensor:
    """Drafts the target accepts per anchor ``(b, n)``, 0 .. B-1 (the bonus token not counted).

    One target forward over ``b * n`` rows: row ``(i, j)`` is ``tokens[i]`` up to its anchor's
    last draft with the drafts written in; causal attention makes what follows irrelevant.
    """
    b, n = anchors.shape
    k = drafts.shape[-1]
    flat_anchors = anchors.reshape(-1).cpu()
    length = int(flat_anchors.max()) + k + 1
    rows = tokens[:, :length].cpu().repeat_interleave(n, dim=0)
    where = flat_anchors[:, None] + 1 + torch.arange(k)  # positions of d_1 .. d_{B-1}
    rows.scatter_(1, where, drafts.reshape(-1, k))
    logits, _ = target(rows)
    choice = logits.argmax(-1).cpu().gather(1, where - 1)  # the target's token for each position
    return (choice == drafts.reshape(-1, k)).long().cumprod(dim=1).sum(dim=1).view(b, n)


@dataclass(frozen=True, slots=True)
class TauResult:
    """One evaluation: ``tau`` (1..B), ``rows`` anchors, ``chunks`` target passes, wall
    ``seconds``, ``peak_bytes`` of the tensors it created at once (:class:`PeakMeter`)."""

    tau: float
    rows: int
    chunks: int
    seconds: float
    peak_bytes: int


def chunks(n_seqs: int, anchors_per_seq: int, chunk_rows: int) -> list[range]:
    """Sequence ranges of about ``chunk_rows`` verification rows each (at least one sequence).

    >>> chunks(5, 4, 8)
    [range(0, 2), range(2, 4), range(4, 5)]
    >>> chunks(2, 32, 8)  # a sequence with more anchors than a chunk: one sequence per chunk
    [range(0, 1), range(1, 2)]
    """
    per = max(1, chunk_rows // anchors_per_seq)
    return [range(i, min(n_seqs, i + per)) for i in range(0, n_seqs, per)]


class TauEval:
    """One ``tau`` evaluation of ``drafts``, run chunk by chunk (see the module docstring).

    :meth:`advance` runs chunks until ``budget_s`` seconds have passed (at least one chunk; 0 =
    all of them) and returns the :class:`TauResult` once the last chunk is done, else None: the
    trainer calls it between steps, so a large evaluation never stalls one step for long.
    """

    def __init__(
        self,
        target: Any,
        drafts: Drafts,
        tokens: torch.Tensor,
        anchors: torch.Tensor,
        block_size: int,
        chunk_rows: int,
    ) -> None:
        self.target, self.drafts, self.tokens, self.anchors = target, drafts, tokens, anchors
        self.block_size = block_size
        self.parts = chunks(anchors.shape[0], anchors.shape[1], chunk_rows)
        self.done = 0
        self.accepted = 0.0
        self.seconds = 0.0
        self.peak_bytes = 0

    def advance(self, budget_s: float = 0.0) -> TauResult | None:
        t0 = time.monotonic()
        with PeakMeter() as meter:
            while self.done < len(self.parts):
                part = self.parts[self.done]
                a = self.anchors[part.start : part.stop]
                length = min(self.tokens.shape[1], int(a.max()) + self.block_size)
                toks = self.tokens[part.start : part.stop, :length]
                self.accepted += float(accepted(self.target, toks, a, self.drafts(toks, a)).sum())
                self.done += 1
                if budget_s > 0 and time.monotonic() - t0 >= budget_s:
                    break
        self.seconds += time.monotonic() - t0
        self.peak_bytes = max(self.peak_bytes, meter.peak_bytes)
        if self.done < len(self.parts):
            return None
        rows = self.anchors.numel()
        tau = 1.0 + self.accepted / rows
        return TauResult(tau, rows, len(self.parts), self.seconds, self.peak_bytes)


def evaluate(*args: Any, **kwargs: Any) -> TauResult:
    """A whole :class:`TauEval` (its arguments) at once."""
    result = TauEval(*args, **kwargs).advance()
    assert result is not None  # no budget: every chunk ran
    return result


def drafter_drafts(
    target: Any, drafter: Drafter, layers: list[int], device: str, context: bool = True
) -> Drafts:
    """The drafter's drafts; ``context`` False zeroes the target's context features."""

    def run(tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        shard = run_target(target, tokens, anchors, layers, 0).to(device)
        if not context:
            shard = dataclasses.replace(shard, ctx_hidden=torch.zeros_like(shard.ctx_hidden))
        return draft(drafter, shard)

    return run


def successor_table(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Most frequent successor of every token in ``tokens (n, t)`` (ties: the lowest id; a token
    never followed by anything: itself).

    >>> successor_table(torch.tensor([[0, 1, 0, 1, 0, 2]]), 3).tolist()
    [1, 0, 2]
    """
    pairs = tokens[:, :-1].reshape(-1) * vocab_size + tokens[:, 1:].reshape(-1)
    counts = torch.bincount(pairs, minlength=vocab_size * vocab_size).view(vocab_size, vocab_size)
    best = counts.argmax(dim=1)
    return torch.where(counts.sum(dim=1) > 0, best, torch.arange(vocab_size))


def bigram_drafts(table: torch.Tensor, block_size: int) -> Drafts:
    """Drafts chained through ``table`` from each anchor token: no context, no training."""

    def run(tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        cur = tokens.gather(1, anchors)
        out = []
        for _ in range(block_size - 1):
            cur = table[cur]
            out.append(cur)
        return torch.stack(out, dim=-1)

    return run


def measure_tau(
    target: Any,
    drafter: Drafter,
    tokens: torch.Tensor,
    anchors: torch.Tensor,
    layers: list[int],
    device: str,
    chunk_rows: int = 64,
) -> float:
    """Mean accepted length (drafts accepted + the bonus token) over the anchors, 1 .. B."""
    run = drafter_drafts(target, drafter, layers, device)
    return evaluate(target, run, tokens, anchors, drafter.block_size, chunk_rows).tau
