"""The target's placement plan, its micro-batch schedule, the DFlash layer pick, the flex mask cache."""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.trainer.procs import TINY
from trainer.config import load_config
from trainer.model import BlockMaskCache, TargetLM
from trainer.placement import (
    balanced_split,
    hf_device_map,
    pipeline_schedule,
    target_layer_ids,
)

GPUS = [f"cuda:{i}" for i in range(5)]


@pytest.mark.parametrize("n_layers", [20, 28, 32, 36, 80])
def test_the_hf_map_uses_exactly_the_target_gpus_balanced(n_layers: int) -> None:
    """Every module on one of the five target GPUs and each GPU used; contiguous; no GPU holds
    more than ceil((n + 2) / 5) layer-equivalents (embedding and head count one each)."""
    m = hf_device_map(n_layers, GPUS)
    assert set(m.values()) == set(GPUS)
    layers = [m[f"model.layers.{i}"] for i in range(n_layers)]
    assert layers == sorted(layers, key=GPUS.index)  # contiguous, in order
    load = {g: layers.count(g) for g in GPUS}
    load[m["model.embed_tokens"]] += 1
    load[m["lm_head"]] += 1
    assert max(load.values()) == -(-(n_layers + 2) // 5), load
    assert m["model.norm"] == m["lm_head"] == GPUS[-1] and m["model.embed_tokens"] == GPUS[0]


def test_the_split_is_the_best_contiguous_one() -> None:
    """Against brute force over every contiguous split of small random cost lists."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):
        n = int(torch.randint(3, 9, (1,), generator=gen))
        k = int(torch.randint(1, n + 1, (1,), generator=gen))
        costs = torch.randint(1, 10, (n,), generator=gen).tolist()
        part = balanced_split(costs, k)
        assert part == sorted(part) and set(part) == set(range(k))
        worst = max(sum(c for c, p in zip(costs, part, strict=True) if p == j) for j in range(k))
        best = min(
            max(sum(costs[a:b]) for a, b in itertools.pairwise((0, *cuts, n)))
            for cuts in itertools.combinations(range(1, n), k - 1)
        )
        assert worst == best, (costs, k, part)
    with pytest.raises(ValueError, match="cannot split 2 items into 3"):
        balanced_split([1, 1], 3)


def test_the_schedule_runs_every_stage_on_every_micro_batch_in_order() -> None:
    for m, s in [(1, 1), (1, 5), (4, 5), (8, 5), (16, 3)]:
        ticks = pipeline_schedule(m, s)
        assert len(ticks) == m + s - 1
        done: dict[int, int] = {}  # micro-batch -> next stage it needs
        for tick in ticks:
            assert len({st for st, _ in tick}) == len(tick)  # one micro-batch per stage per tick
            for st, mb in tick:
                assert done.get(mb, 0) == st  # stage s after stage s-1 of the same micro-batch
            for st, mb in tick:
                done[mb] = st + 1
        assert done == dict.fromkeys(range(m), s)
        busy = sum(len(t) for t in ticks) / (len(ticks) * s)
        assert busy == pytest.approx(m / (m + s - 1))  # one stage busy at a time when m == 1


def test_a_micro_batched_forward_equals_the_one_batch_forward() -> None:
    cfg = load_config(TINY, ["target.kind=lm"]).target
    target = TargetLM(cfg)
    target.place(["cpu", "cpu"])
    tokens = torch.randint(0, cfg.vocab_size, (6, 24), generator=torch.Generator().manual_seed(1))
    logits, hidden = target(tokens)
    target.micro_batches = 4
    logits4, hidden4 = target(tokens)
    torch.testing.assert_close(logits4, logits)
    for a, b in zip(hidden4, hidden, strict=True):
        torch.testing.assert_close(a, b)


def test_the_context_layers_are_picked_as_dflash_picks_them() -> None:
    assert target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # DFlash's Qwen3-8B drafter
    assert load_config("trainer/configs/dflash-8gpu.yaml").drafter.target_layers == (
        target_layer_ids(20, 5)
    )


def test_the_flex_block_mask_is_built_once_per_mask() -> None:
    """Every drafter layer of one forward passes the same mask: one build, not one per layer;
    a new mask (the next step's anchors) builds again."""
    built: list[tuple[int, ...]] = []
    cache = BlockMaskCache(lambda mask: built.append(tuple(mask.shape)) or len(built))
    mask = torch.ones(2, 8, 12, dtype=torch.bool)
    assert [cache.get(mask) for _ in range(5)] == [1] * 5
    other = mask.clone()
    assert cache.get(other) == 2 and cache.get(other) == 2
    assert built == [(2, 8, 12)] * 2


def test_flex_attention_with_the_cached_mask_matches_sdpa_on_cpu() -> None:
    """Forward only: flex_attention has no CPU backward in torch 2.13."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    from trainer.model import flex_block_mask, sdpa_attention

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 8, generator=gen) for n in (16, 32, 32))
    mask = torch.rand(2, 16, 32, generator=gen) > 0.5
    mask[:, :, 0] = True  # every query sees something
    got = flex.flex_attention(q, k, v, block_mask=flex_block_mask(mask))
    torch.testing.assert_close(got, sdpa_attention(q, k, v, mask), atol=1e-5, rtol=1e-4)
