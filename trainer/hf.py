"""Optional target: a local Hugging Face causal-LM checkpoint (never downloads from the hub).

Needs ``transformers``; ``target.device_map`` additionally needs ``accelerate``. A missing package
is reported as one :class:`~trainer.config.DependencyError` line before anything heavy happens.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.config import DependencyError, TrainConfig
from trainer.placement import hf_device_map


def check_dependencies(cfg: TrainConfig) -> None:
    """Fail fast on a missing optional dependency or checkpoint directory.

    Raises:
        DependencyError: transformers (or accelerate, for device_map) not installed, or no such dir.
    """
    if not cfg.target.hf_path:
        return
    where = f"{cfg.source}: target.hf_path"
    placed = cfg.target.device_map or len(cfg.devices.target) > 1
    if placed and importlib.util.find_spec("accelerate") is None:
        why = (
            f"target.device_map={cfg.target.device_map!r}"
            if cfg.target.device_map
            else f"a target split over {len(cfg.devices.target)} devices.target"
        )
        raise DependencyError(
            f"{cfg.source}: {why} needs the 'accelerate' package; pip install accelerate "
            "(or name one target device)"
        )
    if importlib.util.find_spec("transformers") is None:
        raise DependencyError(f"{where} needs the 'transformers' package; pip install transformers")
    if not Path(cfg.target.hf_path).is_dir():
        raise DependencyError(
            f"{where}: no such local directory {cfg.target.hf_path!r} (hub downloads are off)"
        )


class HFTarget(nn.Module):
    """Wraps a transformers causal LM in the :class:`~trainer.model.TargetLM` interface."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model.eval().requires_grad_(False)
        self.vocab_size = int(model.config.vocab_size)
        self.d_model = int(model.config.hidden_size)
        self.devices = [next(model.parameters()).device]
        self._placed_by_map = hasattr(model, "hf_device_map")

    @property
    def n_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    def place(self, devices: Sequence[str]) -> None:
        """Move to the first target device unless accelerate's device_map already placed it."""
        if not self._placed_by_map:
            self.model.to(devices[0])
            self.devices = [torch.device(devices[0])]

    def embedding_weight(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    def head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        out = self.model(tokens.to(self.devices[0]), output_hidden_states=True, use_cache=False)
        return out.logits, list(out.hidden_states[1:])

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        """Generation step (see :meth:`trainer.model.TargetLM.decode`); the cache is HF's own."""
        out = self.model(tokens.to(self.devices[0]), past_key_values=cache, use_cache=True)
        return out.logits[:, -1], out.past_key_values


def device_map_for(cfg: TrainConfig, n_layers: int) -> dict[str, object]:
    """The ``from_pretrained`` placement arguments: the checkpoint split over exactly
    ``devices.target``, never onto a drafter GPU.

    ``device_map`` unset with one target device: none (the model is moved there whole); unset
    with several, or ``target``: :func:`trainer.placement.hf_device_map`, the layers balanced over
    them; ``auto`` (or another accelerate strategy): accelerate's own plan, with ``max_memory``
    listing only the target GPUs (accelerate places nothing on a device missing from it).

    >>> from dataclasses import replace
    >>> from trainer.config import DevicesConfig, TargetConfig
    >>> c = replace(TrainConfig(), target=TargetConfig(hf_path="m"),
    ...             devices=DevicesConfig(target=["cuda:0", "cuda:1"], drafter=["cuda:2"]))
    >>> m = device_map_for(c, 4)["device_map"]
    >>> sorted(set(m.values())), m["model.layers.0"], m["lm_head"]
    (['cuda:0', 'cuda:1'], 'cuda:0', 'cuda:1')
    >>> c = replace(c, target=TargetConfig(hf_path="m", device_map="auto"))
    >>> device_map_for(c, 4)
    {'device_map': 'auto', 'max_memory': {0: '1000GiB', 1: '1000GiB'}}
    """
    devices = cfg.devices.target
    chosen = cfg.target.device_map
    if chosen is None and len(devices) == 1:
        return {}
    if chosen in (None, "target"):
        return {"device_map": hf_device_map(n_layers, devices)}
    gpus = [int(d[5:]) for d in devices if d.startswith("cuda:")]
    return {"device_map": chosen, "max_memory": dict.fromkeys(gpus, "1000GiB")}


def load_hf_target(cfg: TrainConfig) -> HFTarget:
    """Load ``cfg.target.hf_path`` with ``local_files_only=True``.

    Raises:
        DependencyError: see :func:`check_dependencies`.
    """
    check_dependencies(cfg)
    from transformers import AutoModelForCausalLM

    dtype = cfg.target.dtype
    kwargs: dict[str, object] = {
        "local_files_only": True,
        "torch_dtype": "auto" if dtype == "auto" else getattr(torch, dtype),
    }
    if cfg.target.device_map or len(cfg.devices.target) > 1:
        from transformers import AutoConfig

        layers = AutoConfig.from_pretrained(cfg.target.hf_path, local_files_only=True)
        kwargs.update(device_map_for(cfg, int(layers.num_hidden_layers)))
    model = AutoModelForCausalLM.from_pretrained(cfg.target.hf_path, **kwargs)
    return HFTarget(model)
