"""The learning-rate schedule (pure, torch-free: the pipeline and the stand-in share it)."""

from __future__ import annotations

import math

from trainer.config import TrainConfig


def lr_at(cfg: TrainConfig, step: int, total: int | None = None) -> float:
    """Learning rate for 1-based ``step``: linear warm-up, then cosine down to 10 % at ``total``
    (the schedule's length: ``train.steps``, or the one a resumed checkpoint saved), then flat.

    >>> from trainer.config import TrainConfig
    >>> c = TrainConfig()
    >>> lr_at(c, 1) < lr_at(c, 10) == c.train.lr
    True
    >>> lr_at(c, 300, total=200) == lr_at(c, 200) == c.train.lr * 0.1
    True
    """
    t = cfg.train
    total = t.steps if total is None else total
    if t.warmup_steps and step <= t.warmup_steps:
        return t.lr * step / t.warmup_steps
    frac = min(1.0, (step - t.warmup_steps) / max(1, total - t.warmup_steps))
    return t.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
