"""``--fault`` injection: the failures orch must catch, on demand.

A fault named ``KIND@STEP`` fires when step ``STEP`` is about to run (``STEP - 1`` steps have
completed, been logged and heart-beaten). Symptoms are documented in ``docs/trainer.md``.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import torch

KINDS = ("crash", "hang", "silent-exit", "slow", "nan", "oom")

# The text a real CUDA allocator failure prints (torch 2.x), so log signatures match both.
OOM_TEXT = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 5 has a total capacity of 79.19 GiB "
    "of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory "
    "in use. Of the allocated memory 75.40 GiB is allocated by PyTorch, and 1.21 GiB is reserved "
    "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
    "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)


_OOM = torch.OutOfMemoryError
"""Raised under this name so the traceback's source line (``raise _OOM(OOM_TEXT)``) does not
itself read like the error: log signatures match a line naming ``torch.OutOfMemoryError`` and
must land on the error line, as in a real OOM traceback whose source line is the user's code."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault; ``arg`` is the slow factor or the silent-exit status."""

    kind: str
    step: int
    arg: float | None = None


def parse_fault(text: str) -> Fault:
    """Parse ``KIND@STEP[:ARG]``.

    >>> parse_fault("crash@5")
    Fault(kind='crash', step=5, arg=None)
    >>> parse_fault("slow@10:4")
    Fault(kind='slow', step=10, arg=4.0)
    >>> parse_fault("silent-exit@3:9")
    Fault(kind='silent-exit', step=3, arg=9.0)
    >>> parse_fault("boom@1")
    Traceback (most recent call last):
    ...
    ValueError: unknown fault 'boom' (known: crash, hang, silent-exit, slow, nan, oom)
    >>> parse_fault("slow@4")
    Traceback (most recent call last):
    ...
    ValueError: slow needs a factor > 1: slow@STEP:FACTOR
    """
    kind, at, rest = text.partition("@")
    if kind not in KINDS:
        raise ValueError(f"unknown fault {kind!r} (known: {', '.join(KINDS)})")
    step_s, colon, arg_s = rest.partition(":")
    if not at or not step_s.isdigit() or int(step_s) < 1:
        raise ValueError(f"expected {kind}@STEP with STEP >= 1, got {text!r}")
    arg = None
    if colon:
        try:
            arg = float(arg_s)
        except ValueError:
            raise ValueError(f"bad argument {arg_s!r} in {text!r}") from None
        if kind not in ("slow", "silent-exit"):
            raise ValueError(f"{kind} takes no argument: {kind}@STEP")
    if kind == "slow" and (arg is None or arg <= 1):
        raise ValueError("slow needs a factor > 1: slow@STEP:FACTOR")
    return Fault(kind, int(step_s), arg)


class FaultInjector:
    """Fires the faults of a run; called by the drafter worker that owns replica 0."""

    def __init__(self, faults: list[Fault]) -> None:
        self.faults = faults
        self.slow_factor = 1.0

    def before_step(self, step: int) -> None:
        """Fire control faults due at ``step`` (crash, hang, silent-exit, oom, slow start)."""
        for f in self.faults:
            if f.step != step:
                continue
            if f.kind == "crash":
                raise RuntimeError(f"injected fault: crash at step {step}")
            if f.kind == "oom":
                raise _OOM(OOM_TEXT)
            if f.kind == "silent-exit":
                os._exit(int(f.arg) if f.arg is not None else 0)
            if f.kind == "hang":
                threading.Event().wait()  # never set: alive, no progress
            if f.kind == "slow":
                self.slow_factor = float(f.arg or 1.0)

    def poison(self, step: int) -> bool:
        """True when the loss of ``step`` must be NaN (``nan@STEP``)."""
        return any(f.kind == "nan" and f.step == step for f in self.faults)

    def after_step(self, step_s: float) -> None:
        """Stretch a step of ``step_s`` seconds by the active slow factor."""
        if self.slow_factor > 1.0:
            time.sleep(step_s * (self.slow_factor - 1.0))
