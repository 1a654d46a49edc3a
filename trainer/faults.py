"""``--fault`` injection: the failures orch must catch, on demand.

A fault named ``KIND@STEP`` fires when step ``STEP`` is about to run (``STEP - 1`` steps have
completed, been logged and heart-beaten). Symptoms are documented in ``docs/trainer.md``;
``fx-race`` lives in :mod:`trainer.fxrace`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

KINDS = ("crash", "crash-once", "hang", "silent-exit", "slow", "nan", "oom", "fx-race", "kill")

# The text a real CUDA allocator failure prints (torch 2.x), so log signatures match both.
OOM_TEXT = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 5 has a total capacity of 79.19 GiB "
    "of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory "
    "in use. Of the allocated memory 75.40 GiB is allocated by PyTorch, and 1.21 GiB is reserved "
    "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
    "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault; ``arg`` is the slow factor, the silent-exit status, the nan count or
    the rank ``kill`` fires on."""

    kind: str
    step: int
    arg: float | None = None

    def spec(self) -> str:
        """The ``KIND@STEP[:ARG]`` text this fault was given as.

        >>> Fault("slow", 9, 6.0).spec(), Fault("crash", 3).spec()
        ('slow@9:6', 'crash@3')
        """
        return f"{self.kind}@{self.step}" + (f":{self.arg:g}" if self.arg is not None else "")


def parse_fault(text: str) -> Fault:
    """Parse ``KIND@STEP[:ARG]``.

    >>> parse_fault("crash@5")
    Fault(kind='crash', step=5, arg=None)
    >>> parse_fault("slow@10:4")
    Fault(kind='slow', step=10, arg=4.0)
    >>> parse_fault("silent-exit@3:9")
    Fault(kind='silent-exit', step=3, arg=9.0)
    >>> parse_fault("nan@3:20")
    Fault(kind='nan', step=3, arg=20.0)
    >>> parse_fault("kill@5:1")
    Fault(kind='kill', step=5, arg=1.0)
    >>> parse_fault("boom@1")
    Traceback (most recent call last):
    ...
    ValueError: unknown fault 'boom' (known: crash, crash-once, hang, silent-exit, slow, nan, oom, fx-race, kill)
    >>> parse_fault("crash-once@25")
    Fault(kind='crash-once', step=25, arg=None)
    >>> parse_fault("slow@4")
    Traceback (most recent call last):
    ...
    ValueError: slow needs a factor > 1: slow@STEP:FACTOR
    >>> parse_fault("nan@4:0.5")
    Traceback (most recent call last):
    ...
    ValueError: nan takes a whole number of steps >= 1: nan@STEP[:COUNT]
    >>> parse_fault("kill@4:-1")
    Traceback (most recent call last):
    ...
    ValueError: kill takes a global rank >= 0: kill@STEP[:RANK]
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
        if kind not in ("slow", "silent-exit", "nan", "kill"):
            raise ValueError(f"{kind} takes no argument: {kind}@STEP")
    if kind == "slow" and (arg is None or arg <= 1):
        raise ValueError("slow needs a factor > 1: slow@STEP:FACTOR")
    if kind == "nan" and arg is not None and (arg < 1 or arg != int(arg)):
        raise ValueError("nan takes a whole number of steps >= 1: nan@STEP[:COUNT]")
    if kind == "kill" and arg is not None and (arg < 0 or arg != int(arg)):
        raise ValueError("kill takes a global rank >= 0: kill@STEP[:RANK]")
    return Fault(kind, int(step_s), arg)


class FaultInjector:
    """Fires the faults of a run. ``before_step`` and ``poison`` run in the thread that owns
    replica 0, ``in_target_forward`` in the coordinator; ``stretch`` in every stage.

    ``start_step``: the step the run started from (0, or the resumed checkpoint's): a
    ``crash-once`` fault fires only in a run that started from step 0, so a relaunch with
    ``--resume auto`` gets past it (the self-healing loop's end-to-end test). ``rank``: this
    process's global rank (a ``kill@S:RANK`` fault fires in that rank only).
    """

    def __init__(self, faults: list[Fault], start_step: int = 0, rank: int = 0) -> None:
        self.faults = faults
        self.start_step = start_step
        self.rank = rank

    def before_step(self, step: int) -> None:
        """Fire control faults due at ``step`` (crash, hang, silent-exit, kill)."""
        for f in self.faults:
            if f.step != step:
                continue
            if f.kind == "kill" and int(f.arg or 0) == self.rank:
                # one rank of a distributed run dies as under kill -9: no traceback, no flush
                os.kill(os.getpid(), signal.SIGKILL)
            if f.kind == "crash" or (f.kind == "crash-once" and self.start_step == 0):
                raise RuntimeError(f"injected fault: crash at step {step}")
            if f.kind == "silent-exit":
                os._exit(int(f.arg) if f.arg is not None else 0)
            if f.kind == "hang":
                threading.Event().wait()  # never set: alive, no progress

    def oom_due(self, step: int) -> bool:
        """True when the target forward of ``step`` must raise the CUDA OOM (``oom@STEP``)."""
        return any(f.kind == "oom" and f.step == step for f in self.faults)

    @staticmethod
    def raise_oom() -> None:
        """Raise ``torch.OutOfMemoryError`` with the real allocator's text.

        Raised under the name ``_OOM`` so the traceback's source line (``raise _OOM(OOM_TEXT)``)
        does not itself read like the error: log signatures match a line naming
        ``torch.OutOfMemoryError`` and must land on the error line, as in a real OOM traceback
        whose source line is the user's code. torch is imported here only: the rest of this
        module is torch-free (trainer.standin).
        """
        from torch import OutOfMemoryError as _OOM

        raise _OOM(OOM_TEXT)

    def poison(self, step: int) -> bool:
        """True when the loss of ``step`` must be NaN (``nan@STEP[:COUNT]``, COUNT steps from STEP)."""
        return any(
            f.kind == "nan" and f.step <= step < f.step + int(f.arg or 1) for f in self.faults
        )

    def factor(self, step: int) -> float:
        """How many times as long ``step`` must take (the largest ``slow`` due by then), 1.0 if none.

        >>> FaultInjector([Fault("slow", 4, 3.0)]).factor(3), FaultInjector([Fault("slow", 4, 3.0)]).factor(9)
        (1.0, 3.0)
        """
        return max(
            [f.arg or 1.0 for f in self.faults if f.kind == "slow" and f.step <= step] or [1.0]
        )

    @contextlib.contextmanager
    def stretch(self, step: int) -> Iterator[None]:
        """Make the enclosed work of ``step`` take ``factor(step)`` times as long (sleep after it).

        Every stage (the coordinator's target forward, each drafter worker's forward and
        backward, the plain loop's step) stretches its own work, so the whole pipeline slows by
        the factor, not one thread. Never wrap a wait on another stage: the stretches compound.
        """
        t0 = time.monotonic()
        yield
        self.pause(step, time.monotonic() - t0)

    def pause(self, step: int, own_s: float) -> None:
        """Sleep (factor - 1) x ``own_s``: the stretch of ``own_s`` seconds of this stage's work."""
        factor = self.factor(step)
        if factor > 1.0:
            time.sleep(own_s * (factor - 1.0))
