"""The seeds' architecture: one process, a coordinator thread and one drafter worker per device.

The coordinator (the calling thread) runs the frozen target, split across the target devices, and
feeds each worker a shard of the batch through a bounded queue, so the target works on step
``s+1`` while the drafters train on step ``s``. Each worker owns a drafter replica and optimizer.
Every step the workers sum their gradients in-process (and, under torchrun, across processes with
torch.distributed), so all replicas take the same optimizer step, which equals one replica trained
on the combined batch. :meth:`Trainer.run_plain` is the single-threaded reference loop.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer import checkpoint
from trainer.config import TrainConfig
from trainer.data import TokenSource, sample_anchors
from trainer.faults import Fault, FaultInjector
from trainer.metrics import Reporter, StepMetrics
from trainer.model import Drafter, TargetLM, make_attention
from trainer.objective import Shard, drafter_loss, run_target

_POLL_S = 0.1
_RELEASE_S = 60.0
"""After a worker failed: how long the others get to finish their step and leave (s)."""


def _release(queues: list[queue.Queue[Any]], threads: list[threading.Thread]) -> None:
    """Wake every worker (queues drained, ``None`` posted) and join them, at most ``_RELEASE_S``.

    A worker still inside a torch op when the interpreter exits (daemon threads are not waited
    for) makes the C++ runtime call ``std::terminate``: exit 134 instead of the exception's 1.
    """
    for q in queues:
        with contextlib.suppress(queue.Empty):
            while True:
                q.get_nowait()
        with contextlib.suppress(queue.Full):
            q.put_nowait(None)
    deadline = time.monotonic() + _RELEASE_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


@dataclass
class RunOptions:
    """Per-run switches from the CLI (everything else is in the config)."""

    run_dir: Path
    compile: bool = False
    warmup: str = "sequential"
    faults: list[Fault] = field(default_factory=list)
    resume: bool = False
    log_out: Any = None


@dataclass(frozen=True, slots=True)
class RunResult:
    """Outcome of a run: last completed ``step``, why it stopped early (signal name) if it did."""

    step: int
    start_step: int
    wall_s: float
    tokens: int
    stopped_by: str | None
    last: StepMetrics | None
    checkpoint: Path | None

    @property
    def tok_s(self) -> float:
        """Target tokens per wall second over the whole run (warm-up excluded)."""
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Learning rate for 1-based ``step``: linear warm-up, then cosine down to 10 %.

    >>> from trainer.config import TrainConfig
    >>> c = TrainConfig()
    >>> lr_at(c, 1) < lr_at(c, 10) == c.train.lr
    True
    """
    t = cfg.train
    if t.warmup_steps and step <= t.warmup_steps:
        return t.lr * step / t.warmup_steps
    frac = min(1.0, (step - t.warmup_steps) / max(1, t.steps - t.warmup_steps))
    return t.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


class _Reducer:
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


class Trainer:
    """Builds target, data, drafter replicas and optimizers; runs pipelined or plain.

    Raises:
        DependencyError / OSError from building the target or reading data.
    """

    def __init__(self, cfg: TrainConfig, opts: RunOptions) -> None:
        self.cfg = cfg
        self.opts = opts
        opts.run_dir.mkdir(parents=True, exist_ok=True)
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = 0
        if self.world_size > 1:
            backend = "nccl" if cfg.devices.drafter[0].startswith("cuda") else "gloo"
            if not dist.is_initialized():
                dist.init_process_group(backend=backend)
            self.rank = dist.get_rank()
        per = self.world_size * len(cfg.devices.drafter)
        if cfg.train.batch_size % per:
            raise ValueError(
                f"train.batch_size={cfg.train.batch_size} is not divisible by world size "
                f"{self.world_size} x {len(cfg.devices.drafter)} drafter devices"
            )
        if cfg.train.torch_threads:
            torch.set_num_threads(cfg.train.torch_threads)
        self.target = build_target(cfg)
        self.target.place(cfg.devices.target)
        self.source = TokenSource(cfg.data, cfg.target.vocab_size)
        self.attend, self.attention_name = make_attention(opts.compile)
        self.replicas: list[Drafter] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        for dev in cfg.devices.drafter:
            d = Drafter(cfg.drafter, self.target.embedding_weight(), self.target.head_weight()).to(
                dev
            )
            d.attend = self.attend
            d.grad_checkpoint = cfg.train.grad_checkpoint
            self.replicas.append(d)
            self.optimizers.append(
                torch.optim.AdamW(
                    d.parameters(),
                    lr=cfg.train.lr,
                    betas=(0.9, 0.95),
                    weight_decay=cfg.train.weight_decay,
                )
            )
        self.start_step = 0
        self.resumed_from: Path | None = None
        if opts.resume:
            loaded = checkpoint.load_latest(opts.run_dir)
            if loaded is not None:
                for d, opt in zip(self.replicas, self.optimizers, strict=True):
                    d.load_state_dict(loaded.state["drafter"])
                    # load_state_dict keeps the given tensors: each replica needs its own copy
                    opt.load_state_dict(copy.deepcopy(loaded.state["optimizer"]))
                self.start_step = loaded.step
                self.resumed_from = loaded.path
        self.faults = FaultInjector(opts.faults)
        self.stop_reason: str | None = None
        self.blocks_per_step = cfg.train.batch_size * cfg.train.blocks_per_seq
        self.tokens_per_step = cfg.train.batch_size * cfg.data.seq_len
        self.reporter = Reporter(
            opts.run_dir,
            log_every=cfg.train.log_every,
            tokens_per_step=self.tokens_per_step,
            blocks_per_step=self.blocks_per_step,
            devices=[*cfg.devices.target, *cfg.devices.drafter],
            enabled=self.rank == 0,
            out=opts.log_out,
        )
        self.done_step = self.start_step
        self.saved_step = self.start_step

    # ---- pieces shared by both loops -------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        """Ask the run to stop at the next step boundary (safe from a signal handler)."""
        self.stop_reason = reason

    def local_batch(self, step: int) -> Shard:
        """Target features for this rank's slice of the global batch of ``step``."""
        t = self.cfg.train
        tokens = self.source.batch(step, t.batch_size)
        anchors = sample_anchors(
            t.seed,
            step,
            t.batch_size,
            t.blocks_per_seq,
            self.cfg.data.seq_len,
            self.cfg.drafter.block_size,
        )
        local = t.batch_size // self.world_size
        sl = slice(self.rank * local, (self.rank + 1) * local)
        return run_target(
            self.target, tokens[sl], anchors[sl], self.cfg.drafter.target_layers, step
        )

    def _apply(self, i: int, flat: torch.Tensor, step: int) -> float:
        """Install summed gradient ``flat`` into replica ``i`` and take its optimizer step."""
        params = [p for p in self.replicas[i].parameters() if p.requires_grad]
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).to(p.dtype).clone()
            offset += n
        if self.cfg.train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, self.cfg.train.grad_clip)
        lr = lr_at(self.cfg, step)
        for group in self.optimizers[i].param_groups:
            group["lr"] = lr
        self.optimizers[i].step()
        self.optimizers[i].zero_grad(set_to_none=True)
        return lr

    def _grad_vector(self, i: int, loss_sum: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
        grads = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).flatten().float()
            for p in self.replicas[i].parameters()
            if p.requires_grad
        ]
        stats = torch.stack((loss_sum.float(), accepted.float())).to(grads[0].device)
        return torch.cat((*grads, stats))

    def state(self) -> dict[str, Any]:
        """Checkpoint payload from replica 0 (all replicas are identical)."""
        return {
            "drafter": self.replicas[0].state_dict(),
            "optimizer": self.optimizers[0].state_dict(),
            "config": self.cfg.to_dict(),
            "world_size": self.world_size,
        }

    def save(self, step: int) -> Path | None:
        """Checkpoint completed ``step`` (rank 0 only)."""
        if self.rank != 0:
            return None
        path = checkpoint.save(self.opts.run_dir, step, self.state(), self.cfg.train.keep_ckpts)
        self.saved_step = step
        return path

    def warmup(self, mode: str) -> list[tuple[str, float]]:
        """One forward+backward per drafter device, one device after another (no optimizer step).

        Compiles the attention on each device before any worker thread exists: concurrent first
        compiles race on torch.fx's process-global tracing flag (the seeds' incident).
        """
        if mode == "none":
            return []
        shards = self.local_batch(self.start_step + 1).split(len(self.replicas))
        timings = []
        for d, shard, dev in zip(self.replicas, shards, self.cfg.devices.drafter, strict=True):
            t0 = time.monotonic()
            d.train()
            loss, _, _ = drafter_loss(d, shard.to(dev), self.blocks_per_step)
            loss.backward()
            d.zero_grad(set_to_none=True)
            if dev.startswith("cuda"):
                torch.cuda.synchronize(dev)
            timings.append((dev, time.monotonic() - t0))
        return timings

    # ---- the pipelined multi-threaded loop -------------------------------------------------
    def run_pipelined(self, steps: int) -> RunResult:
        """Train until ``steps`` total steps are done (or a stop is requested); returns the outcome.

        Raises:
            The first exception any worker raised (its traceback intact), after stopping the rest.
        """
        n = len(self.replicas)
        queues: list[queue.Queue[Shard | None]] = [
            queue.Queue(self.cfg.train.queue_depth) for _ in range(n)
        ]
        reducer = _Reducer(n, self.world_size > 1)
        errors: list[BaseException] = []
        failed = threading.Event()

        def worker(i: int) -> None:
            dev = self.cfg.devices.drafter[i]
            if dev.startswith("cuda"):
                torch.cuda.set_device(dev)
            replica = self.replicas[i]
            replica.train()
            try:
                while (item := queues[i].get()) is not None:
                    step = item.step
                    if i == 0:
                        self.faults.before_step(step)
                    t0 = time.monotonic()
                    loss, loss_sum, accepted = drafter_loss(
                        replica, item.to(dev), self.blocks_per_step
                    )
                    if i == 0 and self.faults.poison(step):
                        loss, loss_sum = loss * float("nan"), loss_sum * float("nan")
                    loss.backward()
                    total = reducer.reduce(i, self._grad_vector(i, loss_sum, accepted))
                    lr = self._apply(i, total[:-2], step)
                    if i == 0:
                        self.done_step = step
                        self.reporter.on_step(step, float(total[-2]), float(total[-1]), lr)
                        if step % self.cfg.train.ckpt_every == 0:
                            self.save(step)
                        self.faults.after_step(time.monotonic() - t0)
            except threading.BrokenBarrierError:
                if not errors:  # aborted without a recorded cause: report it
                    errors.append(RuntimeError(f"drafter worker {i}: gradient barrier broken"))
                failed.set()
            except BaseException as exc:  # noqa: BLE001  (handed to the coordinator, re-raised there)
                errors.append(exc)
                reducer.barrier.abort()
                failed.set()

        threads = [
            threading.Thread(target=worker, args=(i,), name=f"drafter-{i}", daemon=True)
            for i in range(n)
        ]
        for t in threads:
            t.start()
        self.reporter.restart_clock()
        t_start = time.monotonic()
        start = self.done_step
        try:
            for step in range(start + 1, steps + 1):
                if self.stop_reason or failed.is_set():
                    break
                for q, part in zip(queues, self.local_batch(step).split(n), strict=True):
                    self._put(q, part, failed)
            for q in queues:
                self._put(q, None, failed)
            for t in threads:
                while t.is_alive():
                    t.join(_POLL_S)
                    if failed.is_set():
                        break
        finally:
            if failed.is_set() or errors:
                reducer.barrier.abort()
                _release(queues, threads)
        if errors:
            raise errors[0]
        return self._finish(start, t_start)

    @staticmethod
    def _put(q: queue.Queue[Shard | None], item: Shard | None, failed: threading.Event) -> None:
        while True:
            if failed.is_set():
                return
            try:
                q.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                continue

    def _finish(self, start: int, t_start: float) -> RunResult:
        wall = time.monotonic() - t_start
        path = self.save(self.done_step) if self.done_step > self.saved_step else None
        return RunResult(
            step=self.done_step,
            start_step=start,
            wall_s=wall,
            tokens=(self.done_step - start) * self.tokens_per_step,
            stopped_by=self.stop_reason,
            last=self.reporter.last,
            checkpoint=path,
        )

    # ---- the plain single-threaded reference loop ------------------------------------------
    def run_plain(self, steps: int) -> RunResult:
        """Target then drafter (replica 0, whole local batch) in one thread, no queues, no overlap."""
        replica, dev = self.replicas[0], self.cfg.devices.drafter[0]
        replica.train()
        self.reporter.restart_clock()
        t_start = time.monotonic()
        start = self.done_step
        for step in range(start + 1, steps + 1):
            if self.stop_reason:
                break
            loss, loss_sum, accepted = drafter_loss(
                replica, self.local_batch(step).to(dev), self.blocks_per_step
            )
            loss.backward()
            vec = self._grad_vector(0, loss_sum, accepted)
            if self.world_size > 1:
                dist.all_reduce(vec)
            lr = self._apply(0, vec[:-2], step)
            self.done_step = step
            self.reporter.on_step(step, float(vec[-2]), float(vec[-1]), lr)
            if step % self.cfg.train.ckpt_every == 0:
                self.save(step)
        return self._finish(start, t_start)

    def close(self) -> None:
        """Tear down torch.distributed if this trainer started it."""
        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


def build_target(cfg: TrainConfig) -> TargetLM:
    """The frozen target: the package's own LM, or a local HF checkpoint when ``hf_path`` is set."""
    if cfg.target.hf_path:
        from trainer.hf import load_hf_target

        return load_hf_target(cfg)  # type: ignore[return-value]
    return TargetLM(cfg.target)
