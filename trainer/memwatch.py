"""Peak bytes of the tensors a piece of code creates, on CPU and CUDA alike.

torch's CPU allocator keeps no statistics, and ``torch.cuda.max_memory_allocated`` is one
process-wide peak that every thread's work lands in (resetting it would lose the run's own
``gpu_mem``). :class:`PeakMeter` instead watches the operators the calling thread runs (a
``TorchDispatchMode``: modes are per thread, so the drafter workers' concurrent steps do not
count): every tensor an operator returns is counted by its storage until the last tensor on that
storage is freed, and the peak of that sum over operator boundaries is the figure. Memory held
before the meter started is not counted; scratch space inside one kernel is not seen.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class PeakMeter(TorchDispatchMode):
    """``with PeakMeter() as m: ...`` then ``m.peak_bytes`` (bytes, >= 0).

    >>> with PeakMeter() as m:
    ...     x = torch.zeros(1024)  # 4 KiB
    ...     y = x + 1              # 8 KiB live
    ...     del x, y
    ...     z = torch.zeros(256)
    >>> m.peak_bytes, m.live_bytes
    (8192, 1024)
    """

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self._refs: dict[tuple[str, int], list[int]] = {}  # storage -> [nbytes, tensors alive]
        self._lock = threading.Lock()

    def _release(self, key: tuple[str, int]) -> None:
        with self._lock:
            entry = self._refs.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                self.live_bytes -= entry[0]
                del self._refs[key]

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr == 0:  # empty tensors allocate nothing
            return
        key = (str(t.device), ptr)
        with self._lock:
            entry = self._refs.get(key)
            if entry is None:
                entry = self._refs[key] = [storage.nbytes(), 0]
                self.live_bytes += entry[0]
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            entry[1] += 1
        weakref.finalize(t, self._release, key)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out
