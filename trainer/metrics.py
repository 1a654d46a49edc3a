"""The output contract with orch's monitor: log lines, ``metrics.jsonl`` and the heartbeat.

See ``docs/trainer.md``. The line format is stable: ``step=120 loss=2.3104 acc_len=3.21
tok/s=21500 lr=3.0e-04 gpu_mem=812MiB`` (``gpu_mem=-`` when no CUDA device is used).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

import torch

SCHEMA_VERSION = 1

LINE_RE = re.compile(
    r"^step=(?P<step>\d+) loss=(?P<loss>\S+) acc_len=(?P<acc_len>\S+) tok/s=(?P<tok_s>\d+) "
    r"lr=(?P<lr>\S+) gpu_mem=(?P<gpu_mem>\d+MiB|-)$"
)


@dataclass(frozen=True, slots=True)
class StepMetrics:
    """One log interval. ``loss`` is mean cross-entropy per block token (nats), ``acc_len`` the mean
    accepted length per block (tokens), ``tok_s`` target tokens per wall second over the interval."""

    step: int
    loss: float
    acc_len: float
    tok_s: float
    lr: float
    gpu_mem_mib: int | None
    time: float
    tokens: int

    def line(self) -> str:
        """The stdout line.

        >>> StepMetrics(120, 2.31041, 3.214, 21500.4, 3e-4, None, 0.0, 0).line()
        'step=120 loss=2.3104 acc_len=3.21 tok/s=21500 lr=3.0e-04 gpu_mem=-'
        >>> StepMetrics(7, float("nan"), 0.0, 10.0, 1e-3, 812, 0.0, 0).line()
        'step=7 loss=nan acc_len=0.00 tok/s=10 lr=1.0e-03 gpu_mem=812MiB'
        """
        mem = "-" if self.gpu_mem_mib is None else f"{self.gpu_mem_mib}MiB"
        return (
            f"step={self.step} loss={self.loss:.4f} acc_len={self.acc_len:.2f} "
            f"tok/s={self.tok_s:.0f} lr={self.lr:.1e} gpu_mem={mem}"
        )

    def to_dict(self) -> dict[str, object]:
        """The metrics.jsonl record (NaN/inf loss become null, JSON has no NaN)."""
        out: dict[str, object] = {"schema_version": SCHEMA_VERSION, **asdict(self)}
        for key in ("loss", "acc_len"):
            value = out[key]
            if isinstance(value, float) and not math.isfinite(value):
                out[key] = None
        return out


def parse_line(line: str) -> dict[str, float | int | None] | None:
    """Parse one trainer log line; None when it is not a metrics line.

    >>> parse_line("step=120 loss=2.3104 acc_len=3.21 tok/s=21500 lr=3.0e-04 gpu_mem=812MiB")
    {'step': 120, 'loss': 2.3104, 'acc_len': 3.21, 'tok_s': 21500, 'lr': 0.0003, 'gpu_mem_mib': 812}
    >>> parse_line("trainer: banner") is None
    True
    """
    m = LINE_RE.match(line.strip())
    if m is None:
        return None
    mem = m["gpu_mem"]
    return {
        "step": int(m["step"]),
        "loss": float(m["loss"]),
        "acc_len": float(m["acc_len"]),
        "tok_s": int(m["tok_s"]),
        "lr": float(m["lr"]),
        "gpu_mem_mib": None if mem == "-" else int(mem[:-3]),
    }


def gpu_mem_mib(devices: list[str]) -> int | None:
    """Peak memory allocated by this process over the CUDA devices in ``devices`` (MiB), or None."""
    cuda = sorted({d for d in devices if d.startswith("cuda")})
    if not cuda or not torch.cuda.is_available():
        return None
    return int(max(torch.cuda.max_memory_allocated(d) for d in cuda) // (1024 * 1024))


class Reporter:
    """Writes the heartbeat every step and a log line + JSON record every ``log_every`` steps.

    Called from one thread only (the worker that owns replica 0, or the plain loop). With
    ``enabled=False`` (ranks other than 0) it does nothing.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        log_every: int,
        tokens_per_step: int,
        blocks_per_step: int,
        devices: list[str],
        enabled: bool = True,
        out: TextIO | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.log_every = log_every
        self.tokens_per_step = tokens_per_step
        self.blocks_per_step = blocks_per_step
        self.devices = devices
        self.enabled = enabled
        self.out = out or sys.stdout
        self.metrics_path = run_dir / "metrics.jsonl"
        self.heartbeat_path = run_dir / "heartbeat"
        self._mark_t = time.monotonic()
        self._acc_loss = 0.0
        self._acc_len = 0.0
        self._steps = 0
        self.last: StepMetrics | None = None

    def restart_clock(self) -> None:
        """Start the throughput interval now (call once the first step is about to run)."""
        self._mark_t = time.monotonic()

    def on_step(self, step: int, loss_sum: float, accepted_sum: float, lr: float) -> None:
        """Record completed step ``step`` (1-based) with the summed loss/accepted over all blocks."""
        if not self.enabled:
            return
        self.heartbeat(step)
        self._acc_loss += loss_sum / self.blocks_per_step
        self._acc_len += accepted_sum / self.blocks_per_step
        self._steps += 1
        if step % self.log_every:
            return
        now = time.monotonic()
        elapsed = max(now - self._mark_t, 1e-9)
        record = StepMetrics(
            step=step,
            loss=self._acc_loss / self._steps,
            acc_len=self._acc_len / self._steps,
            tok_s=self._steps * self.tokens_per_step / elapsed,
            lr=lr,
            gpu_mem_mib=gpu_mem_mib(self.devices),
            time=time.time(),
            tokens=step * self.tokens_per_step,
        )
        self.out.write(record.line() + "\n")
        self.out.flush()
        with self.metrics_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record.to_dict()) + "\n")
        self.last = record
        self._mark_t, self._acc_loss, self._acc_len, self._steps = now, 0.0, 0.0, 0

    def heartbeat(self, step: int) -> None:
        """Atomically rewrite ``heartbeat`` as ``STEP UNIX_TIME`` (its mtime is the beat)."""
        tmp = self.heartbeat_path.with_name("heartbeat.tmp")
        tmp.write_text(f"{step} {time.time():.3f}\n", encoding="utf-8")
        os.replace(tmp, self.heartbeat_path)
