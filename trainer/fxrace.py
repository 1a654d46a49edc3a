"""``--fault fx-race``: seed 002's error, raised by torch's own check on CPU.

torch.fx keeps one process-global "symbolically tracing" flag (``_is_fx_tracing_flag``). While a
thread runs ``torch.fx.symbolic_trace``, every ``torch.compile``d function entered in *any* thread
refuses with ``RuntimeError: Detected that you are using FX to symbolically trace a
dynamo-optimized function. This is not supported at the moment.`` In the seeds the FX tracing ran
inside the worker threads' lazy first compile; on torch 2.13 the compiler's own tracing is hidden
behind a process-global "compiling" flag, so the fault brings the FX trace back explicitly.

With the fault armed, the first call of the drafter attention in a worker thread (which, with
``--warmup none``, is where the attention compiles) FX-traces a probe module the way a library
that traces on first use would, and holds the trace open until every other worker thread has
entered the compiled attention (or ``timeout_s`` passes), so the race fires every time rather than
by chance. The sequential warm-up makes the first call in the main thread before any worker
exists: no worker call is ever a first one, nothing is traced, nothing races.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
from torch import nn

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class _Gate:
    """Shared by the threads of one race: who traces, who waits to race, when the trace is open."""

    def __init__(self, racers: int, timeout_s: float) -> None:
        self.racers = racers
        self.timeout_s = timeout_s
        self.cond = threading.Condition()
        self.parked = 0  # racers waiting, past their last module call, at the compiled function
        self.raced = 0  # racers that have entered it
        self.tracing = threading.Event()

    def park(self) -> None:
        """A racer arrives at the compiled function; wait until the trace is open."""
        with self.cond:
            self.parked += 1
            self.cond.notify_all()
        self.tracing.wait(self.timeout_s)

    def all_parked(self) -> None:
        """The tracer waits for every racer to arrive (past its module calls) before it opens
        the trace."""
        with self.cond:
            self.cond.wait_for(lambda: self.parked >= self.racers, self.timeout_s)

    def done(self) -> None:
        with self.cond:
            self.raced += 1
            self.cond.notify_all()

    def all_raced(self) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.raced >= self.parked, self.timeout_s)


class _Probe(nn.Module):
    """Traced by ``torch.fx.symbolic_trace``: its forward runs while the FX flag is set."""

    def __init__(self, gate: _Gate) -> None:
        super().__init__()
        self.gate = gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.gate.tracing.set()
        self.gate.all_raced()
        return x + 1


class FxRace:
    """Wraps a ``torch.compile``d attention; see the module docstring.

    Args:
        attend: the compiled attention (a dynamo-optimized function).
        workers: drafter worker threads that will call it.
        timeout_s: the longest a tracer waits for the others, and a racer for the trace.
    """

    def __init__(self, attend: Attention, workers: int, timeout_s: float = 30.0) -> None:
        self.attend = attend
        self.main = threading.get_ident()
        self.gate = _Gate(workers - 1, timeout_s)
        self.lock = threading.Lock()
        self.called = False
        self.tracer: int | None = None
        self.seen: set[int] = set()
        self.quiet = threading.Lock()
        """Held around the trace, and by the coordinator around the target forward: a module
        call in another thread while FX traces fails with FX's own NameError instead."""

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        me = threading.get_ident()
        with self.lock:
            first_here = me not in self.seen
            self.seen.add(me)
            role = None
            if me != self.main and not self.called:
                role = self.tracer = me  # the lazy first call happens in a worker thread
            elif me != self.main and first_here and self.tracer is not None:
                role = -1  # another worker's first call while the first one compiles
            self.called = True
        if role is None:
            return self.attend(q, k, v, mask)
        if role == me:
            self.gate.all_parked()
            with self.quiet:
                torch.fx.symbolic_trace(_Probe(self.gate))
            return self.attend(q, k, v, mask)
        self.gate.park()
        try:
            return self.attend(q, k, v, mask)  # enters the compiled function mid-trace: raises
        finally:
            self.gate.done()
