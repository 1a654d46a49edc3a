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
import datetime
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer import checkpoint
from trainer.build import build_target, check_cuda, enable_tf32
from trainer.checkpoint import NonFiniteError
from trainer.config import TrainConfig, anchor_range, for_local_rank
from trainer.data import TokenSource, sample_anchors
from trainer.faults import Fault, FaultInjector
from trainer.fxrace import FxRace
from trainer.metrics import Reporter, StepMetrics
from trainer.model import Drafter, make_attention
from trainer.objective import Shard, drafter_loss, run_target
from trainer.schedule import lr_at
from trainer.threads import Reducer, release
from trainer.verify import TauEval, TauResult, drafter_drafts

_POLL_S = 0.1


@dataclass
class RunOptions:
    """Per-run switches from the CLI (everything else is in the config)."""

    run_dir: Path
    compile: bool = False
    compile_backend: str = "inductor"
    warmup: str = "sequential"
    faults: list[Fault] = field(default_factory=list)
    resume: bool = False
    log_out: Any = None
    dist_timeout_s: float | None = None
    """``--dist-timeout``: seconds a collective may wait for the other ranks (None: torch's
    default, 30 min for gloo, 10 min for NCCL) before it fails on every waiting rank."""


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


class Trainer:
    """Builds target, data, drafter replicas and optimizers; runs pipelined or plain.

    ``target`` replaces the one the config describes (a test's own model in the HF interface).

    Raises:
        DependencyError / OSError from building the target or reading data.
        ValueError: the batch does not split over the replicas, or a CUDA device the config
            (shifted for torchrun's ``LOCAL_RANK``) names does not exist.
    """

    def __init__(self, cfg: TrainConfig, opts: RunOptions, target: Any = None) -> None:
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        cfg = for_local_rank(cfg, self.local_rank)
        check_cuda(cfg, self.local_rank)
        self.cfg = cfg
        self.opts = opts
        opts.run_dir.mkdir(parents=True, exist_ok=True)
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(self.world_size)))
        self.rank = 0
        if self.world_size > 1:
            backend = "nccl" if cfg.devices.drafter[0].startswith("cuda") else "gloo"
            if not dist.is_initialized():
                timeout = opts.dist_timeout_s
                dist.init_process_group(
                    backend=backend,
                    timeout=datetime.timedelta(seconds=timeout) if timeout else None,
                )
            self.rank = dist.get_rank()
        per = self.world_size * len(cfg.devices.drafter)
        if cfg.train.batch_size % per:
            raise ValueError(
                f"train.batch_size={cfg.train.batch_size} is not divisible by world size "
                f"{self.world_size} x {len(cfg.devices.drafter)} drafter devices"
            )
        if cfg.train.torch_threads:
            torch.set_num_threads(cfg.train.torch_threads)
        enable_tf32(cfg)
        self.faults = FaultInjector(opts.faults, rank=self.rank)
        self.target = target if target is not None else build_target(cfg)
        self.target.place(cfg.devices.target)
        self._in_target = threading.local()  # the step the coordinator's target forward is for
        self.target.register_forward_pre_hook(self._target_fault)
        self.source = TokenSource(cfg.data, cfg.target.vocab_size, target=self.target)
        # fx-race needs a dynamo-optimized attention; without --compile, dynamo alone (eager)
        fx_race = any(f.kind == "fx-race" for f in opts.faults)
        self.attend, self.attention_name = make_attention(
            opts.compile or fx_race, opts.compile_backend if opts.compile else "eager"
        )
        self.replicas: list[Drafter] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        for dev in cfg.devices.drafter:
            d = Drafter(cfg.drafter, self.target.embedding_weight(), self.target.head_weight()).to(
                dev
            )
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
        self.schedule_steps = cfg.train.steps
        self.resumed_from: Path | None = None
        if opts.resume:
            loaded = checkpoint.load_latest(opts.run_dir)
            if loaded is not None:
                for d, opt in zip(self.replicas, self.optimizers, strict=True):
                    d.load_state_dict(loaded.state["drafter"])
                    # load_state_dict keeps the given tensors: each replica needs its own copy
                    opt.load_state_dict(copy.deepcopy(loaded.state["optimizer"]))
                self.start_step = loaded.step
                self.schedule_steps = int(loaded.state.get("lr_schedule_steps", cfg.train.steps))
                self.resumed_from = loaded.path
                self.faults.start_step = loaded.step
        self._quiet: Any = contextlib.nullcontext()  # held around the coordinator's target forward
        if self._fx_race_armed(self.start_step + 1):
            self.attend = FxRace(self.attend, len(self.replicas))
            self._quiet = self.attend.quiet
        for d in self.replicas:
            d.attend = self.attend
        self.stop_reason: str | None = None
        self.blocks_per_step = cfg.train.batch_size * cfg.train.blocks_per_seq
        self.tokens_per_step = cfg.train.batch_size * cfg.data.seq_len
        self.heldout: tuple[torch.Tensor, torch.Tensor] | None = None
        if cfg.train.eval_every and self.rank == 0:
            lo, hi = anchor_range(cfg)
            n = cfg.train.eval_seqs
            anchors = sample_anchors(cfg.train.seed, -1, n, cfg.train.blocks_per_seq, lo, hi)
            self.heldout = (self.source.heldout(n), anchors)
        self.pending_tau: tuple[int, TauEval] | None = None  # (step of the snapshot, evaluation)
        self.last_eval: TauResult | None = None
        self.nonfinite_run = 0  # steps in a row skipped for a non-finite gradient
        self.nonfinite_total = 0
        # each node's local rank 0 reports (its own log, heartbeat and metrics.jsonl) the tokens
        # of its node's ranks; on one node that is every rank, as before
        node_tokens = self.tokens_per_step * self.local_world_size // self.world_size
        self.reporter = Reporter(
            opts.run_dir,
            log_every=cfg.train.log_every,
            tokens_per_step=node_tokens,
            blocks_per_step=self.blocks_per_step,
            devices=[*cfg.devices.target, *cfg.devices.drafter],
            enabled=self.local_rank == 0,
            out=opts.log_out,
        )
        self.done_step = self.start_step
        self.saved_step = self.start_step

    # ---- pieces shared by both loops -------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        """Ask the run to stop at the next step boundary (safe from a signal handler)."""
        self.stop_reason = reason

    def _fx_race_armed(self, first_step: int) -> bool:
        """``fx-race@N`` is armed when the run's first step (``first_step``) is N or later."""
        return any(f.kind == "fx-race" and f.step <= first_step for f in self.opts.faults)

    def _target_fault(self, _module: Any, _args: Any) -> None:
        """Forward pre-hook on the target: ``oom@N`` raises inside the coordinator's target
        forward of step N, where a real CUDA OOM of the target's GPUs is raised."""
        step = getattr(self._in_target, "step", None)
        if step is not None and self.faults.oom_due(step):
            self.faults.raise_oom()

    def local_batch(self, step: int) -> Shard:
        """Target features for this rank's slice of the global batch of ``step``."""
        t = self.cfg.train
        tokens = self.source.batch(step, t.batch_size)
        lo, hi = anchor_range(self.cfg)
        anchors = sample_anchors(t.seed, step, t.batch_size, t.blocks_per_seq, lo, hi)
        local = t.batch_size // self.world_size
        sl = slice(self.rank * local, (self.rank + 1) * local)
        self._in_target.step = step
        try:
            with self._quiet:
                return run_target(
                    self.target, tokens[sl], anchors[sl], self.cfg.drafter.target_layers, step
                )
        finally:
            self._in_target.step = None

    def _apply(self, i: int, flat: torch.Tensor, step: int) -> float | None:
        """Install summed gradient ``flat`` into replica ``i`` and take its optimizer step.

        Returns the learning rate, or None when the step was skipped: ``flat`` is not finite
        (every replica sees the same sum, so all of them skip it).
        """
        params = [p for p in self.replicas[i].parameters() if p.requires_grad]
        if not bool(torch.isfinite(flat).all()):
            self.optimizers[i].zero_grad(set_to_none=True)
            return None
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).to(p.dtype).clone()
            offset += n
        if self.cfg.train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, self.cfg.train.grad_clip)
        lr = lr_at(self.cfg, step, self.schedule_steps)
        for group in self.optimizers[i].param_groups:
            group["lr"] = lr
        self.optimizers[i].step()
        self.optimizers[i].zero_grad(set_to_none=True)
        return lr

    def _grad_vector(self, i: int, loss_sum: torch.Tensor, tau_tf: torch.Tensor) -> torch.Tensor:
        grads = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).flatten().float()
            for p in self.replicas[i].parameters()
            if p.requires_grad
        ]
        stats = torch.stack((loss_sum.float(), tau_tf.float())).to(grads[0].device)
        return torch.cat((*grads, stats))

    def _loss(self, i: int, shard: Shard) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return drafter_loss(
            self.replicas[i],
            shard.to(self.cfg.devices.drafter[i]),
            self.blocks_per_step,
            self.cfg.train.loss_decay_gamma,
        )

    def _finish_step(self, step: int, total: torch.Tensor, lr: float | None) -> None:
        """Replica 0's bookkeeping once ``step`` is applied (``lr`` None: it was skipped): the
        skip count, ``tau``, the log line, the checkpoint.

        Raises:
            NonFiniteError: ``train.max_nonfinite_steps`` steps in a row were skipped.
        """
        if lr is None:
            self._skipped(step)
            lr = lr_at(self.cfg, step, self.schedule_steps)
        else:
            self.nonfinite_run = 0
        self.done_step = step
        tau = self._advance_tau(step)
        self.reporter.on_step(
            step,
            float(total[-2]),
            float(total[-1]),
            lr,
            tau=tau,
            nonfinite_steps=self.nonfinite_total,
        )
        if step % self.cfg.train.ckpt_every == 0:
            self.save(step)

    def _skipped(self, step: int) -> None:
        self.nonfinite_run += 1
        self.nonfinite_total += 1
        limit = self.cfg.train.max_nonfinite_steps
        if self.local_rank == 0:
            print(
                f"trainer: warning: step {step}: gradient not finite, step skipped "
                f"({self.nonfinite_run} in a row of at most {limit}, {self.nonfinite_total} in all)",
                file=sys.stderr,
                flush=True,
            )
        if self.nonfinite_run >= limit:
            first = step - self.nonfinite_run + 1
            raise NonFiniteError(
                f"{self.nonfinite_run} steps in a row had a non-finite gradient (steps "
                f"{first}..{step}; train.max_nonfinite_steps={limit}); stopping. The weights are "
                f"those after step {first - 1} (skipped steps never change them); the newest "
                f"checkpoint in {checkpoint.checkpoint_dir(self.opts.run_dir)} is finite"
            )

    def _advance_tau(self, step: int) -> float | None:
        """Run the pending ``tau`` evaluation for up to ``train.eval_budget_s`` and start the one
        due after ``step``; returns the newest ``tau`` finished now (None: none finished)."""
        t = self.cfg.train
        tau = None
        if self.pending_tau is not None:  # a due evaluation finishes the pending one first
            due = bool(t.eval_every) and step % t.eval_every == 0
            tau = self._finish_tau(self.pending_tau, 0.0 if due else t.eval_budget_s)
        if self.heldout is not None and t.eval_every and step % t.eval_every == 0:
            drafter = self.replicas[0]
            if t.eval_budget_s > 0:  # later chunks run after later steps: freeze these weights
                drafter = copy.deepcopy(drafter, memo={id(drafter.attend): drafter.attend})
            tau = self._finish_tau((step, self._tau_eval(drafter)), t.eval_budget_s) or tau
        return tau

    def _tau_eval(self, drafter: Drafter, context: bool = True) -> TauEval:
        tokens, anchors = self.heldout  # type: ignore[misc]  (callers check it)
        dev = self.cfg.devices.drafter[0]
        drafts = drafter_drafts(self.target, drafter, self.cfg.drafter.target_layers, dev, context)
        rows = self.cfg.train.eval_chunk_rows
        return TauEval(self.target, drafts, tokens, anchors, drafter.block_size, rows)

    def _finish_tau(self, pending: tuple[int, TauEval], budget_s: float) -> float | None:
        step, ev = pending
        result = ev.advance(budget_s)
        if result is None:
            self.pending_tau = pending
            return None
        self.pending_tau = None
        self.last_eval = result
        if self.reporter.enabled:  # never a metric line: no step=, tau=, loss words
            self.reporter.out.write(
                f"trainer: tau eval after_step={step} value {result.tau:.2f} rows {result.rows} "
                f"chunks {result.chunks} eval_s {result.seconds:.2f} "
                f"peak_mib {result.peak_bytes / 2**20:.1f}\n"
            )
        return result.tau

    def evaluate(self, context: bool = True) -> float | None:
        """``tau`` of replica 0 on the held-out anchors now, all chunks at once (None where not
        measured: rank > 0); ``context`` False zeroes the context features (a baseline)."""
        if self.heldout is None:
            return None
        result = self._tau_eval(self.replicas[0], context).advance()
        return None if result is None else result.tau

    def state(self) -> dict[str, Any]:
        """Checkpoint payload from replica 0 (all replicas are identical)."""
        return {
            "drafter": self.replicas[0].state_dict(),
            "optimizer": self.optimizers[0].state_dict(),
            "config": self.cfg.to_dict(),
            "world_size": self.world_size,
            "lr_schedule_steps": self.schedule_steps,
        }

    def save(self, step: int) -> Path | None:
        """Checkpoint completed ``step`` (rank 0 only).

        Raises:
            NonFiniteError: the weights or optimizer state hold a NaN or infinity.
        """
        if self.rank != 0:
            return None
        path = checkpoint.save(self.opts.run_dir, step, self.state(), self.cfg.train.keep_ckpts)
        self.saved_step = step
        return path

    def warmup(self, mode: str) -> list[tuple[str, str, float]]:
        """One forward+backward per drafter device, one device after another (no optimizer step),
        then one ``tau`` measurement on the first; returns ``(device, what, seconds)``.

        Compiles the attention on each device before any worker thread exists: concurrent first
        compiles race on torch.fx's process-global tracing flag (the seeds' incident).
        """
        if mode == "none":
            return []
        shards = self.local_batch(self.start_step + 1).split(len(self.replicas))
        timings = []
        for i, (d, shard, dev) in enumerate(
            zip(self.replicas, shards, self.cfg.devices.drafter, strict=True)
        ):
            t0 = time.monotonic()
            d.train()
            loss, _, _ = self._loss(i, shard)
            loss.backward()
            d.zero_grad(set_to_none=True)
            _sync(dev)
            timings.append((dev, "forward+backward", time.monotonic() - t0))
        if self.heldout is not None:
            t0 = time.monotonic()
            self.evaluate()
            _sync(self.cfg.devices.drafter[0])
            timings.append((self.cfg.devices.drafter[0], "draft-and-verify", time.monotonic() - t0))
        return timings

    # ---- the pipelined multi-threaded loop -------------------------------------------------
    def run_pipelined(self, steps: int) -> RunResult:
        """Train until ``steps`` total steps are done (or a stop is requested); returns the outcome.

        Whatever ends the loop (a worker's exception, the coordinator's own, such as an OOM in
        the target forward, or a stop), every worker is woken and joined before this returns or
        raises: a worker left inside a torch op at interpreter exit aborts the process (134).

        Raises:
            The first exception any worker or the coordinator raised (its traceback intact).
        """
        n = len(self.replicas)
        queues: list[queue.Queue[Shard | None]] = [
            queue.Queue(self.cfg.train.queue_depth) for _ in range(n)
        ]
        reducer = Reducer(n, self.world_size > 1)
        errors: list[BaseException] = []
        failed = threading.Event()

        def worker(i: int) -> None:
            dev = self.cfg.devices.drafter[i]
            if dev.startswith("cuda"):
                torch.cuda.set_device(dev)
            self.replicas[i].train()
            try:
                while (item := queues[i].get()) is not None:
                    step = item.step
                    if i == 0:
                        self.faults.before_step(step)
                    t0 = time.monotonic()
                    loss, loss_sum, tau_tf = self._loss(i, item)
                    if i == 0 and self.faults.poison(step):
                        loss, loss_sum = loss * float("nan"), loss_sum * float("nan")
                    loss.backward()
                    vec = self._grad_vector(i, loss_sum, tau_tf)
                    t1 = time.monotonic()
                    total = reducer.reduce(i, vec)
                    t2 = time.monotonic()
                    lr = self._apply(i, total[:-2], step)
                    if i == 0:
                        self._finish_step(step, total, lr)
                    # slow@: stretch this worker's own work, never its wait for the others
                    # (stretched waits would compound from worker to worker)
                    self.faults.pause(step, (t1 - t0) + (time.monotonic() - t2))
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
                if self.faults.oom_due(step):  # fire when step-1 is done, as every fault does
                    self._wait_done(step - 1, failed)
                with self.faults.stretch(step):
                    shard = self.local_batch(step)
                for q, part in zip(queues, shard.split(n), strict=True):
                    self._put(q, part, failed)
            for q in queues:
                self._put(q, None, failed)
            for t in threads:
                while t.is_alive():
                    t.join(_POLL_S)
                    if failed.is_set():
                        break
        finally:
            if any(t.is_alive() for t in threads):
                reducer.barrier.abort()
                release(queues, threads)
        if errors:
            raise errors[0]
        return self._finish(start, t_start)

    def _wait_done(self, step: int, failed: threading.Event) -> None:
        """Block the coordinator until the workers have completed ``step`` (or one failed)."""
        while self.done_step < step and not failed.is_set():
            time.sleep(_POLL_S / 10)

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
            tokens=(self.done_step - start) * self.reporter.tokens_per_step,  # this node's
            stopped_by=self.stop_reason,
            last=self.reporter.last,
            checkpoint=path,
        )

    # ---- the plain single-threaded reference loop ------------------------------------------
    def run_plain(self, steps: int) -> RunResult:
        """Target then drafter (replica 0, whole local batch) in one thread, no queues, no overlap."""
        self.replicas[0].train()
        self.reporter.restart_clock()
        t_start = time.monotonic()
        start = self.done_step
        for step in range(start + 1, steps + 1):
            if self.stop_reason:
                break
            with self.faults.stretch(step):
                self.faults.before_step(step)
                loss, loss_sum, tau_tf = self._loss(0, self.local_batch(step))
                if self.faults.poison(step):
                    loss, loss_sum = loss * float("nan"), loss_sum * float("nan")
                loss.backward()
                vec = self._grad_vector(0, loss_sum, tau_tf)
                if self.world_size > 1:
                    dist.all_reduce(vec)
                self._finish_step(step, vec, self._apply(0, vec[:-2], step))
        return self._finish(start, t_start)

    def close(self) -> None:
        """Tear down torch.distributed if this trainer started it."""
        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _sync(dev: str) -> None:
    if dev.startswith("cuda"):
        torch.cuda.synchronize(dev)
