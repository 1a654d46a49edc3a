"""The frozen target LM, the DFlash-style drafter, and the attention kernel they share.

Shapes use ``b`` batch, ``t`` sequence length, ``h`` heads, ``d`` model width, ``V`` vocabulary.
The drafter follows DFlash (arXiv 2602.06036): hidden states from a fixed set of target layers are
concatenated and projected into a context feature; every drafter layer attends to that context as
extra keys/values, and a whole masked block of ``B`` tokens after an anchor is predicted in one
forward pass, bidirectionally inside the block.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainer.config import DrafterConfig, TargetConfig
from trainer.placement import balanced_split, pipeline_schedule

log = logging.getLogger(__name__)

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Masked attention; ``mask`` is bool ``(b, q_len, k_len)``, True where a query may look."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, :, :])


def make_attention(compile_: bool, backend: str = "inductor") -> tuple[Attention, str]:
    """Return (attention function, name) for the drafter.

    Without ``compile_`` it is eager SDPA. With it, flex_attention compiled by torch.compile on
    CUDA devices when this torch has it, else (and always on CPU) SDPA compiled. Compilation
    happens lazily on first call per device, which is why the trainer warms every drafter device
    up sequentially before threads start. ``backend`` is torch.compile's (``eager``: dynamo
    only, no code generation, seconds instead of minutes on CPU; the name then says so).
    """
    if not compile_:
        return sdpa_attention, "sdpa"
    tag = "" if backend == "inductor" else f"({backend})"
    compiled_sdpa = torch.compile(sdpa_attention, dynamic=False, backend=backend)
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError:
        return compiled_sdpa, f"sdpa+compile{tag}"
    flex = torch.compile(flex_attention, dynamic=False, backend=backend)
    masks = BlockMaskCache(flex_block_mask)

    def flex_attend(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        if q.device.type == "cpu":  # flex_attention has no CPU backward (torch 2.13)
            return compiled_sdpa(q, k, v, mask)
        return flex(q, k, v, block_mask=masks.get(mask))

    return flex_attend, f"flex_attention+compile{tag}|cpu:sdpa+compile{tag}"


def flex_block_mask(mask: torch.Tensor) -> object:
    """flex_attention's BlockMask for a bool ``(b, q_len, k_len)`` mask (True: may look)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q_idx, kv_idx):  # flex's index tensors
        return mask[b, q_idx, kv_idx]

    b, q_len, k_len = mask.shape
    return create_block_mask(mask_mod, b, None, q_len, k_len, device=str(mask.device))


class BlockMaskCache:
    """The last mask's BlockMask, built once: every drafter layer of a forward passes the same
    mask tensor, so the block mask is built once per forward (per step and shape), not once per
    layer. Keyed by the tensor's identity, storage, version counter and shape; thread-safe
    (replicas on several devices share one cache, each keeps its own entry)."""

    def __init__(self, build: Callable[[torch.Tensor], object]) -> None:
        self.build = build
        self._last: dict[str, tuple[tuple[object, ...], object]] = {}
        self._lock = threading.Lock()

    def get(self, mask: torch.Tensor) -> object:
        key = (id(mask), mask.data_ptr(), mask._version, tuple(mask.shape))
        dev = str(mask.device)
        with self._lock:
            hit = self._last.get(dev)
        if hit is not None and hit[0] == key:
            return hit[1]
        value = self.build(mask)
        with self._lock:
            self._last[dev] = (key, value)
        return value


def rotary(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Apply rotary position embedding to ``x (b, h, t, dh)`` at integer ``positions`` (b, t) or (t,)."""
    dh = x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, dh, 2, device=x.device, dtype=torch.float32) / dh))
    ang = positions.to(x.device, torch.float32)[..., None] * inv  # (.., t, dh/2)
    if ang.dim() == 3:
        ang = ang[:, None]  # (b, 1, t, dh/2)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class MLP(nn.Module):
    """SiLU-gated feed-forward block."""

    def __init__(self, d: int, d_ff: int) -> None:
        super().__init__()
        self.gate = nn.Linear(d, d_ff, bias=False)
        self.up = nn.Linear(d, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class TargetBlock(nn.Module):
    """Pre-norm causal transformer block with rotary attention."""

    def __init__(self, d: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm1 = nn.RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.norm2 = nn.RMSNorm(d)
        self.mlp = MLP(d, d_ff)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, cache: list[torch.Tensor] | None = None
    ) -> torch.Tensor:
        """``cache`` (generation): ``[]`` to fill with this call's keys/values, or the ``[k, v]``
        of the tokens before; a cached call takes one new token."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.n_heads, d // self.n_heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        q, k = rotary(q, positions), rotary(k, positions)
        causal = True
        if cache is not None:
            if cache:
                k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
                causal = False  # the one new token may see every cached one
            cache[:] = [k, v]
        a = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TargetLM(nn.Module):
    """A small frozen causal LM, random init from ``cfg.seed``, layers split across devices.

    ``forward(tokens)`` returns ``(logits (b, t, V), hidden)`` where ``hidden`` holds the output of
    every layer (index i = after block i), each on the device of that layer.
    """

    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(cfg.seed)
        self.vocab_size, self.d_model = cfg.vocab_size, cfg.d_model
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(
            TargetBlock(cfg.d_model, cfg.n_heads, cfg.d_ff) for _ in range(cfg.n_layers)
        )
        self.norm = nn.RMSNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.5 / p.shape[1] ** 0.5)
        nn.init.normal_(self.embed.weight, std=1.0)
        torch.random.set_rng_state(gen_state)
        self.requires_grad_(False)
        self.eval()
        self.devices: list[torch.device] = [torch.device("cpu")] * (cfg.n_layers + 2)
        self.micro_batches = cfg.micro_batches

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    def place(self, devices: Sequence[str]) -> None:
        """Split the layers contiguously across ``devices`` (embedding on the first, head on the
        last), balanced by parameter count (:func:`trainer.placement.balanced_split`; the
        embedding, a lookup, costs nothing, the head as a layer of its size)."""
        devs = [torch.device(d) for d in devices]
        block = sum(p.numel() for p in self.blocks[0].parameters())
        costs = [0.0, *([float(block)] * self.n_layers), float(self.head.weight.numel())]
        part = balanced_split(costs, len(devs)) if len(devs) > 1 else [0] * len(costs)
        self.devices = [devs[i] for i in part]
        self.embed.to(self.devices[0])
        for blk, dev in zip(self.blocks, self.devices[1:-1], strict=True):
            blk.to(dev)
        self.norm.to(self.devices[-1])
        self.head.to(self.devices[-1])

    def stages(self) -> list[range]:
        """Block index ranges that share a device, in order (one pipeline stage each)."""
        out: list[range] = []
        for i, dev in enumerate(self.devices[1:-1]):
            if out and self.devices[out[-1].start + 1] == dev:
                out[-1] = range(out[-1].start, i + 1)
            else:
                out.append(range(i, i + 1))
        return out

    def embedding_weight(self) -> torch.Tensor:
        return self.embed.weight

    def head_weight(self) -> torch.Tensor:
        """Head of the final norm folded in, so the drafter can reuse it as ``logits = h @ W.T``."""
        return self.head.weight * self.norm.weight[None, :]

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``micro_batches`` > 1 splits the rows and runs the stages in GPipe order
        (:func:`trainer.placement.pipeline_schedule`): CUDA kernels launch asynchronously, so
        while stage ``s`` works on micro-batch ``m`` its neighbour works on ``m - 1`` on another
        GPU. The result equals the one-batch forward (rows are independent)."""
        positions = torch.arange(tokens.shape[1])
        micro = list(tokens.chunk(max(1, min(self.micro_batches, tokens.shape[0]))))
        xs = [self.embed(m.to(self.devices[0])) for m in micro]
        hidden: list[list[torch.Tensor]] = [[] for _ in micro]
        stages = self.stages()
        for tick in pipeline_schedule(len(micro), len(stages)):
            for stage, m in tick:
                for i in stages[stage]:
                    xs[m] = self.blocks[i](
                        xs[m].to(self.devices[i + 1], non_blocking=True), positions
                    )
                    hidden[m].append(xs[m])
        x = torch.cat([x.to(self.devices[-1], non_blocking=True) for x in xs])
        layers = [torch.cat([h[i] for h in hidden]) for i in range(self.n_layers)]
        return self.head(self.norm(x)), layers

    @torch.no_grad()
    def decode(
        self, tokens: torch.Tensor, cache: list[list[torch.Tensor]] | None
    ) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
        """Generation step: logits ``(b, V)`` after the last of ``tokens``, and the KV cache.

        ``cache`` None: ``tokens`` is the whole prompt; else one new token per row after it.
        """
        start = 0 if cache is None else int(cache[0][0].shape[2])
        if cache is not None and tokens.shape[1] != 1:
            raise ValueError("a cached decode step takes one token per row")
        cache = cache if cache is not None else [[] for _ in self.blocks]
        positions = torch.arange(start, start + tokens.shape[1])
        x = self.embed(tokens.to(self.devices[0]))
        for block, dev, kv in zip(self.blocks, self.devices[1:-1], cache, strict=True):
            x = block(x.to(dev, non_blocking=True), positions, kv)
        x = x[:, -1].to(self.devices[-1], non_blocking=True)
        return self.head(self.norm(x)), cache


class DrafterLayer(nn.Module):
    """A drafter block: queries from the block, keys/values from [context ; block]."""

    def __init__(self, d: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm1 = nn.RMSNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.norm2 = nn.RMSNorm(d)
        self.mlp = MLP(d, d_ff)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        return x.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        ctx: torch.Tensor,
        pos_block: torch.Tensor,
        pos_ctx: torch.Tensor,
        mask: torch.Tensor,
        attend: Attention,
    ) -> torch.Tensor:
        h = self.norm1(x)
        q = rotary(self._heads(self.q(h)), pos_block)
        k_ctx = rotary(self._heads(self.k(ctx)), pos_ctx)
        k_blk = rotary(self._heads(self.k(h)), pos_block)
        v = torch.cat((self._heads(self.v(ctx)), self._heads(self.v(h))), dim=2)
        a = attend(q, torch.cat((k_ctx, k_blk), dim=2), v, mask)
        b, _, t, _ = a.shape
        x = x + self.out(a.transpose(1, 2).reshape(b, t, -1))
        return x + self.mlp(self.norm2(x))


class Drafter(nn.Module):
    """The trainable drafter; token embedding and LM head are frozen copies of the target's.

    Args:
        cfg: drafter shape.
        embed_weight: target token embedding ``(V, d_t)``.
        head_weight: target LM head with its final norm folded in ``(V, d_t)``.
    """

    def __init__(
        self, cfg: DrafterConfig, embed_weight: torch.Tensor, head_weight: torch.Tensor
    ) -> None:
        super().__init__()
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(cfg.seed)
        d_t, d = embed_weight.shape[1], cfg.d_model
        self.block_size = cfg.block_size
        self.register_buffer("embed_weight", embed_weight.detach().clone().cpu(), persistent=False)
        self.register_buffer("head_weight", head_weight.detach().clone().cpu(), persistent=False)
        self.mask_embed = nn.Parameter(torch.zeros(d_t))
        self.in_proj = nn.Linear(d_t, d, bias=False)
        self.ctx_proj = nn.Linear(len(cfg.target_layers) * d_t, d, bias=False)
        self.ctx_norm = nn.RMSNorm(d)
        self.layers = nn.ModuleList(
            DrafterLayer(d, cfg.n_heads, cfg.d_ff) for _ in range(cfg.n_layers)
        )
        self.norm = nn.RMSNorm(d)
        self.out_proj = nn.Linear(d, d_t, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(
                    p,
                    std=(0.02 if name.endswith(("out.weight", "down.weight")) else 1.0)
                    / p.shape[1] ** 0.5,
                )
        torch.random.set_rng_state(gen_state)
        self.grad_checkpoint = False
        self.attend: Attention = sdpa_attention

    def forward(
        self,
        ctx_hidden: torch.Tensor,
        block_tokens: torch.Tensor,
        pos_block: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Logits ``(b, n_blocks * B, V)`` for every block position (in the features' dtype:
        a bf16/fp16 target's features run the drafter under autocast to that dtype).

        Args:
            ctx_hidden: concatenated target hidden states ``(b, t, n_layers * d_t)``.
            block_tokens: block inputs ``(b, n_blocks * B)``; mask positions hold -1.
            pos_block: absolute positions of the block tokens ``(b, n_blocks * B)``.
            mask: bool ``(b, n_blocks * B, t + n_blocks * B)``, True where attention is allowed.
        """
        low = ctx_hidden.dtype if ctx_hidden.dtype in (torch.bfloat16, torch.float16) else None
        # a bf16/fp16 target: float32 weights, the maths in the target's dtype
        with torch.autocast(ctx_hidden.device.type, dtype=low, enabled=low is not None):
            is_mask = block_tokens < 0
            emb = F.embedding(block_tokens.clamp(min=0), self.embed_weight)
            emb = torch.where(is_mask[..., None], self.mask_embed.to(emb.dtype), emb)
            x = self.in_proj(emb)
            ctx = self.ctx_norm(self.ctx_proj(ctx_hidden))
            pos_ctx = torch.arange(ctx_hidden.shape[1], device=ctx_hidden.device)
            for layer in self.layers:
                if self.grad_checkpoint and self.training:
                    x = checkpoint(
                        layer, x, ctx, pos_block, pos_ctx, mask, self.attend, use_reentrant=False
                    )
                else:
                    x = layer(x, ctx, pos_block, pos_ctx, mask, self.attend)
            return self.out_proj(self.norm(x)) @ self.head_weight.T
