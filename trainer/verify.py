"""``tau``: the acceptance length of real greedy draft-and-verify, as DFlash reports it.

For a held-out anchor ``a`` the drafter drafts the whole block at once, ``d_1 .. d_{B-1}`` from
``[x[a], MASK x (B-1)]`` and the target's features before ``a``; the target then runs on
``x[..a] + d_1 .. d_{B-1}`` and accepts drafts up to the first one that differs from its own argmax
after the tokens before it, plus its one bonus token. ``tau`` is that count averaged over the
anchors: 1 (nothing accepted) .. B. Unlike the teacher-forced ``tau_tf`` of the training loss,
slot ``k`` is judged after the drafts before it, not after the data.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.model import Drafter
from trainer.objective import Shard, block_inputs, run_target


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


def measure_tau(
    target: Any,
    drafter: Drafter,
    tokens: torch.Tensor,
    anchors: torch.Tensor,
    layers: list[int],
    device: str,
) -> float:
    """Mean accepted length (drafts accepted + the bonus token) over the anchors, 1 .. B."""
    shard = run_target(target, tokens, anchors, layers, 0).to(device)
    return 1.0 + float(accepted(target, tokens, anchors, draft(drafter, shard)).float().mean())
