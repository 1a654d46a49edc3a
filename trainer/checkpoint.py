"""Atomic drafter checkpoints in ``<run-dir>/checkpoints/step_NNNNNNN.pt``.

Written to a temp file in the same directory, fsynced, then renamed, so a reader sees either the
old set or a complete new file. ``--resume auto`` loads the newest checkpoint that reads back
whole and holds only finite numbers; an unreadable (e.g. truncated) or non-finite one is skipped
with a warning, never loaded. A state with a NaN or infinity in it is never written.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.ckptfiles import (
    checkpoint_dir,
    list_checkpoints,
    warn_skipped,
    write_atomic,
)

log = logging.getLogger(__name__)

FORMAT = "trainer-drafter-v1"


class NonFiniteError(RuntimeError):
    """Training produced values that are not finite; the message says where and what to do."""


def first_nonfinite(state: Any, prefix: str = "") -> str | None:
    """Dotted name of the first floating tensor in ``state`` holding a NaN or infinity, or None.

    >>> first_nonfinite({"drafter": {"w": torch.ones(2)}, "step": 3}) is None
    True
    >>> first_nonfinite({"optimizer": {"state": {0: {"exp_avg": torch.tensor([1.0, float("nan")])}}}})
    'optimizer.state.0.exp_avg'
    """
    if isinstance(state, torch.Tensor):
        if state.is_floating_point() and not bool(torch.isfinite(state).all()):
            return prefix or "<tensor>"
        return None
    items: Any = state.items() if isinstance(state, dict) else ()
    if isinstance(state, (list, tuple)):
        items = enumerate(state)
    for key, value in items:
        found = first_nonfinite(value, f"{prefix}.{key}" if prefix else str(key))
        if found is not None:
            return found
    return None


@dataclass(frozen=True, slots=True)
class Loaded:
    """A checkpoint read back: completed ``step``, its ``path`` and the saved ``state`` dict."""

    step: int
    path: Path
    state: dict[str, Any]


def save(run_dir: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Write ``state`` for completed ``step`` atomically; keep the newest ``keep`` files.

    Raises:
        NonFiniteError: ``state`` holds a NaN or infinity (nothing is written).
        OSError: the run directory is not writable (the temp file is removed).
    """
    bad = first_nonfinite(state)
    if bad is not None:
        raise NonFiniteError(
            f"not writing the checkpoint of step {step}: {bad} holds NaN or infinity; "
            f"the newest checkpoint in {checkpoint_dir(run_dir)} is the last finite one"
        )
    payload = {"format": FORMAT, "step": step, **state}
    return write_atomic(run_dir, step, lambda fh: torch.save(payload, fh), keep)


def load_latest(run_dir: Path) -> Loaded | None:
    """Newest checkpoint that loads completely with finite values, or None; warns on stderr for
    each one skipped."""
    for path in list_checkpoints(run_dir):
        what = "unreadable"
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(state, dict) or state.get("format") != FORMAT:
                raise ValueError("not a trainer checkpoint")
            bad = first_nonfinite(state)
            if bad is not None:
                what = "non-finite"
                raise ValueError(f"{bad} holds NaN or infinity")
            return Loaded(int(state["step"]), path, state)
        except Exception as exc:  # noqa: BLE001  (any unreadable file is skipped, by contract)
            warn_skipped(what, path, exc)
    return None
