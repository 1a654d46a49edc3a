"""Where the target's layers go, and in what order its micro-batches run: pure plans.

- :func:`target_layer_ids`: the target layers whose hidden states feed the drafter, picked as
  DFlash picks them (z-lab/dflash ``model/utils.py`` ``build_target_layer_ids``; the same
  function in vllm-project/speculators ``src/speculators/models/dflash/utils.py``): evenly from
  layer 1 to layer ``n - 3``, one per drafter layer.
- :func:`balanced_split` / :func:`hf_device_map`: the target split contiguously over exactly the
  target devices with the largest per-device cost as small as it can be (embedding and head
  counted as layers of their own), as an accelerate ``device_map`` dict for a Hugging Face model,
  so ``device_map: auto`` never spills onto the drafter GPUs.
- :func:`pipeline_schedule`: GPipe's forward schedule (fill, steady state, drain): at tick ``t``
  stage ``s`` runs micro-batch ``t - s``, so with ``m`` micro-batches over ``s`` stages every
  stage is busy for ``m`` of the ``m + s - 1`` ticks instead of 1 in ``s``.
"""

from __future__ import annotations

from collections.abc import Sequence


def target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """DFlash's choice of context layers (0-based: index ``i`` = the output of block ``i``).

    >>> target_layer_ids(36, 5)   # Qwen3-8B with a 5-layer drafter, as DFlash ships it
    [1, 9, 17, 25, 33]
    >>> target_layer_ids(20, 5), target_layer_ids(4, 3), target_layer_ids(28, 1)
    ([1, 5, 9, 13, 17], [1, 1, 1], [14])
    """
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def balanced_split(costs: Sequence[float], parts: int) -> list[int]:
    """Part index of every item: contiguous, non-decreasing, each of the ``parts`` parts non-empty,
    the largest part's summed cost minimal, then the sum of squared part costs (the most even
    split among those; remaining ties: the earlier parts take more items).

    Raises:
        ValueError: fewer items than parts, or no parts.

    >>> balanced_split([1] * 10, 4)
    [0, 0, 0, 1, 1, 1, 2, 2, 3, 3]
    >>> balanced_split([3, 1, 1, 1, 1, 1, 1, 3], 3)   # heavy ends get fewer neighbours
    [0, 0, 1, 1, 1, 1, 2, 2]
    """
    n = len(costs)
    if parts < 1 or n < parts:
        raise ValueError(f"cannot split {n} items into {parts} non-empty parts")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = (float("inf"), float("inf"))
    # best[k][i]: (max, sum of squares) splitting the first i items into k parts; cut: last cut
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = (0.0, 0.0)
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for j in range(i - 1, k - 2, -1):
                part = prefix[i] - prefix[j]
                cost = (max(best[k - 1][j][0], part), best[k - 1][j][1] + part * part)
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    out = [0] * n
    i = n
    for k in range(parts, 0, -1):
        j = cut[k][i]
        out[j:i] = [k - 1] * (i - j)
        i = j
    return out


def hf_device_map(
    n_layers: int, devices: Sequence[str], embed_cost: float = 1.0, head_cost: float = 1.0
) -> dict[str, str]:
    """An accelerate ``device_map`` for a Llama-layout causal LM (``model.embed_tokens``,
    ``model.layers.N``, ``model.norm``, ``model.rotary_emb``, ``lm_head``; Qwen2/3 and Mistral
    use the same names) over exactly ``devices``, balanced by :func:`balanced_split`; the
    embedding and head weigh ``embed_cost`` / ``head_cost`` layers.

    >>> m = hf_device_map(8, ["cuda:0", "cuda:1", "cuda:2"])
    >>> [m[f"model.layers.{i}"] for i in range(8)]
    ['cuda:0', 'cuda:0', 'cuda:0', 'cuda:1', 'cuda:1', 'cuda:1', 'cuda:2', 'cuda:2']
    >>> m["model.embed_tokens"], m["lm_head"], m["model.norm"]
    ('cuda:0', 'cuda:2', 'cuda:2')
    """
    costs = [embed_cost, *([1.0] * n_layers), head_cost]
    part = balanced_split(costs, len(devices))
    out = {"model.embed_tokens": devices[part[0]], "model.rotary_emb": devices[part[0]]}
    out.update({f"model.layers.{i}": devices[part[i + 1]] for i in range(n_layers)})
    out["model.norm"] = out["lm_head"] = devices[part[-1]]
    return out


def pipeline_schedule(micro_batches: int, stages: int) -> list[list[tuple[int, int]]]:
    """GPipe forward ticks: each tick lists the ``(stage, micro_batch)`` pairs that run at once.

    >>> pipeline_schedule(3, 2)
    [[(0, 0)], [(0, 1), (1, 0)], [(0, 2), (1, 1)], [(1, 2)]]
    """
    ticks = []
    for t in range(micro_batches + stages - 1):
        ticks.append([(s, t - s) for s in range(stages) if 0 <= t - s < micro_batches])
    return ticks
