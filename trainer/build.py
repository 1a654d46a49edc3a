"""Building the frozen target and checking the devices a config names (before anything starts)."""

from __future__ import annotations

import torch

from trainer.config import TrainConfig
from trainer.copytarget import CopyTarget
from trainer.model import TargetLM


def check_cuda(cfg: TrainConfig, local_rank: int) -> None:
    """Refuse CUDA devices this torch cannot see, naming the torchrun shift when there is one."""
    cuda = sorted(
        {int(d[5:]) for d in (*cfg.devices.target, *cfg.devices.drafter) if d.startswith("cuda:")}
    )
    if not cuda:
        return
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cuda[-1] < seen:
        return
    shifted = f" (LOCAL_RANK={local_rank}: each local rank gets its own set)" if local_rank else ""
    raise ValueError(
        f"devices: the run needs cuda:{cuda[0]}..cuda:{cuda[-1]}{shifted}, "
        f"but torch sees {seen} CUDA device(s)"
    )


def enable_tf32(cfg: TrainConfig) -> None:
    """Drafters on CUDA: their float32 matmuls and convolutions on TF32 tensor cores (the
    target runs in its own dtype, bf16 by default on the 8-GPU config)."""
    if any(d.startswith("cuda") for d in cfg.devices.drafter):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def build_target(cfg: TrainConfig) -> TargetLM:
    """The frozen target: the package's own LM, or a local HF checkpoint when ``hf_path`` is set."""
    if cfg.target.hf_path:
        from trainer.hf import load_hf_target

        return load_hf_target(cfg)  # type: ignore[return-value]
    if cfg.target.kind == "copy":
        return CopyTarget(cfg.target)  # type: ignore[return-value]
    target = TargetLM(cfg.target)
    if cfg.target.dtype not in ("auto", "float32"):
        target.to(getattr(torch, cfg.target.dtype))
    return target
