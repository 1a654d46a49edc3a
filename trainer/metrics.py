"""The output contract with orch's monitor: log lines, ``metrics.jsonl`` and the heartbeat.

See ``docs/trainer.md``. The line format is stable: ``step=120 loss=2.3104 tau=2.31 tau_tf=2.45
tok/s=21500 lr=3.0e-04 gpu_mem=812MiB`` (``tau=-`` on a step without a measurement, ``gpu_mem=-``
when no CUDA device is used).
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

SCHEMA_VERSION = 2
"""2: ``acc_len`` became ``tau_tf`` (a 1-based proxy), ``tau`` and ``nonfinite_steps`` added."""

LINE_RE = re.compile(
    r"^step=(?P<step>\d+) loss=(?P<loss>\S+) tau=(?P<tau>\S+) tau_tf=(?P<tau_tf>\S+) "
    r"tok/s=(?P<tok_s>\d+) lr=(?P<lr>\S+) gpu_mem=(?P<gpu_mem>\d+MiB|-)$"
)


@dataclass(frozen=True, slots=True)
class StepMetrics:
    """One log interval. ``loss`` is the mean weighted cross-entropy per block (nats); ``tau`` the
    accepted length of real draft-and-verify on held-out anchors measured at ``step`` (None when
    not measured then); ``tau_tf`` its teacher-forced proxy over the interval's training blocks
    (tokens, 1..B); ``tok_s`` target tokens per wall second over the interval;
    ``nonfinite_steps`` the steps skipped so far for a non-finite gradient."""

    step: int
    loss: float
    tau: float | None
    tau_tf: float
    tok_s: float
    lr: float
    gpu_mem_mib: int | None
    time: float
    tokens: int
    nonfinite_steps: int = 0

    def line(self) -> str:
        """The stdout line.

        >>> StepMetrics(120, 2.31041, 2.314, 2.452, 21500.4, 3e-4, None, 0.0, 0).line()
        'step=120 loss=2.3104 tau=2.31 tau_tf=2.45 tok/s=21500 lr=3.0e-04 gpu_mem=-'
        >>> StepMetrics(7, float("nan"), None, 1.0, 10.0, 1e-3, 812, 0.0, 0).line()
        'step=7 loss=nan tau=- tau_tf=1.00 tok/s=10 lr=1.0e-03 gpu_mem=812MiB'
        """
        mem = "-" if self.gpu_mem_mib is None else f"{self.gpu_mem_mib}MiB"
        tau = "-" if self.tau is None else f"{self.tau:.2f}"
        return (
            f"step={self.step} loss={self.loss:.4f} tau={tau} tau_tf={self.tau_tf:.2f} "
            f"tok/s={self.tok_s:.0f} lr={self.lr:.1e} gpu_mem={mem}"
        )

    def to_dict(self) -> dict[str, object]:
        """The metrics.jsonl record (NaN/inf loss become null, JSON has no NaN)."""
        out: dict[str, object] = {"schema_version": SCHEMA_VERSION, **asdict(self)}
        for key in ("loss", "tau", "tau_tf"):
            value = out[key]
            if isinstance(value, float) and not math.isfinite(value):
                out[key] = None
        return out


def parse_line(line: str) -> dict[str, float | int | None] | None:
    """Parse one trainer log line; None when it is not a metrics line.

    >>> parse_line("step=120 loss=2.3104 tau=2.31 tau_tf=2.45 tok/s=21500 lr=3.0e-04 gpu_mem=812MiB")
    {'step': 120, 'loss': 2.3104, 'tau': 2.31, 'tau_tf': 2.45, 'tok_s': 21500, 'lr': 0.0003, 'gpu_mem_mib': 812}
    >>> parse_line("step=3 loss=2.5 tau=- tau_tf=1.10 tok/s=9 lr=1.0e-03 gpu_mem=-")["tau"] is None
    True
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
        "tau": None if m["tau"] == "-" else float(m["tau"]),
        "tau_tf": float(m["tau_tf"]),
        "tok_s": int(m["tok_s"]),
        "lr": float(m["lr"]),
        "gpu_mem_mib": None if mem == "-" else int(mem[:-3]),
    }


def gpu_mem_mib(devices: list[str]) -> int | None:
    """Peak memory allocated by this process over the CUDA devices in ``devices`` (MiB), or None."""
    cuda = sorted({d for d in devices if d.startswith("cuda")})
    if not cuda:
        return None
    import torch  # only here: the line format and Reporter stay torch-free (trainer.standin)

    if not torch.cuda.is_available():
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
        self._acc_tau_tf = 0.0
        self._tau: float | None = None  # measured within the current interval
        self._steps = 0
        self.last: StepMetrics | None = None

    def restart_clock(self) -> None:
        """Start the throughput interval now (call once the first step is about to run)."""
        self._mark_t = time.monotonic()

    def on_step(
        self,
        step: int,
        loss_sum: float,
        tau_tf_sum: float,
        lr: float,
        *,
        tau: float | None = None,
        nonfinite_steps: int = 0,
    ) -> None:
        """Record completed step ``step`` (1-based) with the summed loss/tau_tf over all blocks,
        and ``tau`` when it was measured after this step."""
        if not self.enabled:
            return
        self.heartbeat(step)
        self._acc_loss += loss_sum / self.blocks_per_step
        self._acc_tau_tf += tau_tf_sum / self.blocks_per_step
        self._steps += 1
        if tau is not None:
            self._tau = tau
        if step % self.log_every:
            return
        now = time.monotonic()
        elapsed = max(now - self._mark_t, 1e-9)
        record = StepMetrics(
            step=step,
            loss=self._acc_loss / self._steps,
            tau=self._tau,
            tau_tf=self._acc_tau_tf / self._steps,
            tok_s=self._steps * self.tokens_per_step / elapsed,
            lr=lr,
            gpu_mem_mib=gpu_mem_mib(self.devices),
            time=time.time(),
            tokens=step * self.tokens_per_step,
            nonfinite_steps=nonfinite_steps,
        )
        self.out.write(record.line() + "\n")
        self.out.flush()
        with self.metrics_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record.to_dict()) + "\n")
        self.last = record
        self._mark_t, self._acc_loss, self._acc_tau_tf, self._steps = now, 0.0, 0.0, 0
        self._tau = None

    def heartbeat(self, step: int) -> None:
        """Atomically rewrite ``heartbeat`` as ``STEP UNIX_TIME`` (its mtime is the beat)."""
        tmp = self.heartbeat_path.with_name("heartbeat.tmp")
        tmp.write_text(f"{step} {time.time():.3f}\n", encoding="utf-8")
        os.replace(tmp, self.heartbeat_path)
