"""The DFlash training objective: target features -> anchored masked blocks -> loss and tau_tf.

DFlash's slot convention (arXiv 2602.06036; SpecForge ``specforge/core/dflash.py``): for an anchor
``a`` the block input is ``[x[a], MASK x (B-1)]`` at positions ``a .. a+B-1``; the drafter sees the
target's context features at positions ``< a`` and the block (bidirectionally), never other blocks.
Slot ``k`` (1..B-1) predicts the token at position ``a+k``; slot 0 is the anchor itself and carries
no loss. Its label is the target's own greedy token for ``a+k`` given the data before it (DFlash
trains on target-generated data, where that is the data token; on other data the target's choice
is what verification accepts). Slot ``k`` weighs ``exp(-(k-1)/gamma)`` (``loss_decay_gamma``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainer.model import Drafter, TargetLM


@dataclass(frozen=True, slots=True)
class Shard:
    """What one drafter replica needs for one step (CPU or its device).

    ``ctx_hidden (b, t, n_layers*d_t)``, ``tokens (b, t)``, ``greedy (b, t)`` = target argmax at
    every position, ``anchors (b, blocks)``.
    """

    step: int
    ctx_hidden: torch.Tensor
    tokens: torch.Tensor
    greedy: torch.Tensor
    anchors: torch.Tensor

    def to(self, device: torch.device | str) -> Shard:
        """Copy of this shard on ``device`` (non-blocking where the source is pinned)."""
        return Shard(
            self.step,
            *(
                x.to(device, non_blocking=True)
                for x in (self.ctx_hidden, self.tokens, self.greedy, self.anchors)
            ),
        )

    def split(self, parts: int) -> list[Shard]:
        """Split along the batch into ``parts`` equal shards (batch must divide evenly)."""
        pieces = [x.chunk(parts) for x in (self.ctx_hidden, self.tokens, self.greedy, self.anchors)]
        return [Shard(self.step, *(p[i] for p in pieces)) for i in range(parts)]

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])


@torch.no_grad()
def run_target(
    target: TargetLM, tokens: torch.Tensor, anchors: torch.Tensor, layers: list[int], step: int
) -> Shard:
    """Run the frozen target and gather the context features (concatenated on the last device)."""
    logits, hidden = target(tokens)
    dev = logits.device
    ctx = torch.cat([hidden[i].to(dev) for i in layers], dim=-1)
    return Shard(step, ctx, tokens.to(dev), logits.argmax(-1), anchors.to(dev))


def slot_weights(block_size: int, gamma: float) -> torch.Tensor:
    """Loss weight per block slot, summing to 1: 0 for the anchor, ``exp(-(k-1)/gamma)`` for slot
    ``k`` >= 1 (DFlash's position decay: early slots decide acceptance); ``gamma`` 0 = flat.

    >>> [round(w, 3) for w in slot_weights(4, 0.0).tolist()]
    [0.0, 0.333, 0.333, 0.333]
    >>> [round(w, 3) for w in slot_weights(4, 1.0).tolist()]
    [0.0, 0.665, 0.245, 0.09]
    """
    k = torch.arange(block_size, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma) if gamma > 0 else torch.ones(block_size)
    w[0] = 0.0
    return w / w.sum()


def block_inputs(
    shard: Shard, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Build ``(block_tokens, pos_block, mask, labels)`` for every anchor of ``shard``.

    Shapes: block_tokens/pos_block/labels ``(b, n*B)``, mask ``(b, n*B, t + n*B)``. The label of
    the slot at position ``p`` is ``greedy[p-1]``, the target's token for ``p`` (slot 0's is unused).

    >>> s = Shard(0, torch.zeros(1, 8, 2), torch.arange(8)[None], torch.arange(8)[None] + 100,
    ...           torch.tensor([[2, 5]]))
    >>> toks, pos, mask, labels = block_inputs(s, 2)
    >>> toks.tolist(), pos.tolist(), labels.tolist()
    ([[2, -1, 5, -1]], [[2, 3, 5, 6]], [[101, 102, 104, 105]])
    >>> mask[0, 0].int().tolist()  # block 0 sees context < 2 and itself
    [1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0]
    """
    b, t = shard.tokens.shape
    n = shard.anchors.shape[1]
    dev = shard.tokens.device
    offs = torch.arange(block_size, device=dev)
    pos = (shard.anchors[..., None] + offs).reshape(b, n * block_size)
    labels = shard.greedy.gather(1, pos - 1)
    first = shard.tokens.gather(1, shard.anchors)
    block_tokens = torch.full((b, n, block_size), -1, dtype=torch.int64, device=dev)
    block_tokens[:, :, 0] = first
    block_tokens = block_tokens.reshape(b, n * block_size)
    q_block = torch.arange(n, device=dev).repeat_interleave(block_size)
    anchor_of_q = shard.anchors.repeat_interleave(block_size, dim=1)  # (b, nB)
    ctx_ok = torch.arange(t, device=dev)[None, None, :] < anchor_of_q[..., None]
    blk_ok = (q_block[:, None] == q_block[None, :])[None].expand(b, -1, -1)
    return block_tokens, pos, torch.cat((ctx_ok, blk_ok), dim=-1), labels


def drafter_loss(
    drafter: Drafter, shard: Shard, total_blocks: int, gamma: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return ``(loss_to_backprop, loss_sum, tau_tf_sum)`` for ``shard``.

    ``loss_to_backprop`` is the sum over this shard's blocks of the per-block weighted mean
    cross-entropy (:func:`slot_weights`), divided by ``total_blocks`` (all blocks of the combined
    batch over every replica and rank), so summing gradients across replicas equals training one
    replica on the combined batch. ``tau_tf_sum`` sums, per block, 1 + the number of leading slots
    whose argmax equals the label: the teacher-forced proxy of ``tau``, scored on the data's prefix.
    """
    B = drafter.block_size
    block_tokens, pos, mask, labels = block_inputs(shard, B)
    logits = drafter(shard.ctx_hidden, block_tokens, pos, mask).float()
    ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
    per_block = (ce.view(-1, B) * slot_weights(B, gamma).to(ce.device)).sum(dim=1)
    loss_sum = per_block.sum()
    with torch.no_grad():
        match = (logits.argmax(-1) == labels).view(-1, B)[:, 1:]
        tau_tf = (1 + match.long().cumprod(dim=1).sum(dim=1)).sum()
    return loss_sum / total_blocks, loss_sum.detach(), tau_tf.float()
