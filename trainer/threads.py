"""The pipeline's thread plumbing: the per-step gradient sum over replica threads (and ranks),
and the release of every worker thread when the pipeline is left for any reason."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

RELEASE_S = 60.0
"""After a failure: how long the workers get to finish their step and leave (s)."""


def release(queues: list[queue.Queue[Any]], threads: list[threading.Thread]) -> None:
    """Wake every worker (queues drained, ``None`` posted) and join them, at most ``RELEASE_S``.

    A worker still inside a torch op when the interpreter exits (daemon threads are not waited
    for) makes the C++ runtime call ``std::terminate``: exit 134 instead of the exception's 1.
    """
    for q in queues:
        with contextlib.suppress(queue.Empty):
            while True:
                q.get_nowait()
        with contextlib.suppress(queue.Full):
            q.put_nowait(None)
    deadline = time.monotonic() + RELEASE_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


class Reducer:
    """Sums one flat tensor per replica across threads (and ranks), leader-based, two barriers."""

    def __init__(self, n: int, distributed: bool) -> None:
        self.n = n
        self.distributed = distributed
        self.slots: list[torch.Tensor | None] = [None] * n
        self.barrier = threading.Barrier(n)
        self.result: torch.Tensor | None = None

    def reduce(self, i: int, vec: torch.Tensor) -> torch.Tensor:
        self.slots[i] = vec
        self.barrier.wait()
        if i == 0:
            total = vec.clone()
            for other in self.slots[1:]:
                assert other is not None
                total += other.to(total.device)
            if self.distributed:
                dist.all_reduce(total)
            self.result = total
        self.barrier.wait()
        assert self.result is not None
        return self.result.to(vec.device)
