"""A torch-free stand-in of ``python -m trainer`` for tests that need only its behaviour.

Selected by ``TRAINER_STAND_IN=1`` in the trainer's environment (``trainer/__main__.py``; the
test sandbox sets it in a container's hosts.yaml ``env``), never by default. It parses the same
command line (:mod:`trainer.args`) and config (:mod:`trainer.config`), prints the same metrics
line and writes the same ``metrics.jsonl`` and ``heartbeat`` (:class:`trainer.metrics.Reporter`),
fires the same ``--fault`` kinds at the same steps (:class:`trainer.faults.FaultInjector`),
writes ``checkpoints/step_NNNNNNN.pt`` atomically every ``train.ckpt_every`` steps, at the end
and on SIGTERM/SIGINT (:mod:`trainer.ckptfiles`; a small JSON document, format
:data:`FORMAT`), resumes from the newest one with ``--resume auto`` and exits with the real
trainer's codes and final lines (docs/trainer.md, "Output contract"). Nothing is learned: a step
is a sleep of ``TRAINER_STAND_IN_STEP_S`` seconds (default 0.05), the loss a fixed decay.

What only torch can do (``fx-race@`` and ``nan@`` faults, ``--compile``, a Hugging Face target,
torchrun's ``WORLD_SIZE`` > 1) runs the real trainer instead: the banner says so first.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from trainer.args import (
    EXIT_OK,
    EXIT_USAGE,
    WARMUP_SKIPPED,
    build_parser,
    closing_banner,
    config_line,
    finished_line,
    first_line,
    run_config,
    run_line,
    stop_on_signals,
    stopped_line,
)
from trainer.ckptfiles import list_checkpoints, warn_skipped, write_atomic
from trainer.config import ConfigError, TrainConfig
from trainer.faults import FaultInjector
from trainer.metrics import Reporter
from trainer.schedule import lr_at

ENV = "TRAINER_STAND_IN"
STEP_ENV = "TRAINER_STAND_IN_STEP_S"
FORMAT = "trainer-stand-in-v1"


def needs_torch(
    args: argparse.Namespace, cfg: TrainConfig, env: Mapping[str, str] = os.environ
) -> str | None:
    """Why this run needs the real trainer (what the stand-in cannot imitate), else None.
    ``env`` is the run's environment (torchrun's ``WORLD_SIZE``). The one rule: launch asks it
    too, through :func:`argv_needs_torch`, before it skips preflight's ``import torch``.

    >>> from trainer.config import TrainConfig
    >>> args = build_parser().parse_args(["--config", "c.yaml", "--fault", "fx-race@1"])
    >>> needs_torch(args, TrainConfig())
    'fx-race@1 needs torch'
    >>> needs_torch(build_parser().parse_args(["--config", "c.yaml"]), TrainConfig()) is None
    True
    """
    for f in args.fault:
        if f.kind in ("fx-race", "nan"):
            return f"{f.spec()} needs torch"
    if args.compile:
        return "--compile needs torch"
    if cfg.target.hf_path:
        return "a Hugging Face target needs torch"
    if env.get("WORLD_SIZE", "1") not in ("", "1"):
        return "torchrun (WORLD_SIZE > 1) needs torch.distributed"
    return None


def argv_needs_torch(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """:func:`needs_torch` for a command line not run yet: why ``python -m trainer ARGV`` with
    ``TRAINER_STAND_IN=1`` in ``env`` would run the real trainer, else None. Torch-free (the
    operator asks it before launch). An argument list or config the stand-in cannot read counts
    as needing torch: the real trainer is the one that reports it.

    >>> tiny = str(Path(__file__).parent / "configs" / "tiny-cpu.yaml")
    >>> argv_needs_torch(["--config", tiny], {}) is None
    True
    >>> argv_needs_torch(["--config", tiny, "--compile"], {})
    '--compile needs torch'
    >>> argv_needs_torch(["--config", tiny], {"WORLD_SIZE": "2"})
    'torchrun (WORLD_SIZE > 1) needs torch.distributed'
    >>> argv_needs_torch(["--no-such-flag"], {})
    'arguments the stand-in cannot parse'
    """
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # argparse's usage text is not ours
            args = build_parser().parse_args(list(argv))
    except SystemExit:
        return "arguments the stand-in cannot parse"
    try:
        cfg = run_config(args)
    except ConfigError as exc:
        return f"a config the stand-in cannot read ({exc})"
    return needs_torch(args, cfg, env)


def step_seconds() -> float:
    """``$TRAINER_STAND_IN_STEP_S``: seconds a step takes (a sleep), default 0.05."""
    try:
        value = float(os.environ.get(STEP_ENV, "0.05"))
    except ValueError:
        return 0.05
    return value if 0 <= value < 60 else 0.05


def loss_at(step: int) -> float:
    """The stand-in's loss after ``step`` (nats): 4.0 decaying towards 0.5, never learned.

    >>> round(loss_at(0), 2), round(loss_at(100), 2) < 2.0
    (4.0, True)
    """
    return 0.5 + 3.5 * math.exp(-step / 60.0)


def save(run_dir: Path, step: int, schedule_steps: int, keep: int) -> Path:
    """Write the stand-in checkpoint of completed ``step`` (atomic; the newest ``keep`` kept)."""
    doc = {"format": FORMAT, "step": step, "lr_schedule_steps": schedule_steps}
    data = (json.dumps(doc) + "\n").encode()
    return write_atomic(run_dir, step, lambda fh: fh.write(data), keep)


def load_latest(run_dir: Path) -> tuple[int, int, Path] | None:
    """(step, lr_schedule_steps, path) of the newest readable stand-in checkpoint, or None;
    warns on stderr, as the real trainer does, for each one skipped (one the real trainer
    wrote is not readable here)."""
    for path in list_checkpoints(run_dir):
        try:
            doc = json.loads(path.read_bytes().decode())
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise ValueError("not a trainer checkpoint")
            return int(doc["step"]), int(doc["lr_schedule_steps"]), path
        except (OSError, ValueError, KeyError, TypeError) as exc:
            warn_skipped("unreadable", path, exc)
    return None


def banner(
    cfg: TrainConfig, args: argparse.Namespace, resumed: tuple[int, int, Path] | None
) -> list[str]:
    """The startup banner: the real trainer's first and run lines, then the stand-in's own."""
    t = cfg.train
    n_rep = len(cfg.devices.drafter)
    lines = [
        first_line(cfg, args),
        f"trainer: stand-in ({ENV}=1): no torch, no model; a step is a {step_seconds():g} s sleep",
        run_line(
            cfg,
            args,
            world_size=1,
            rank=0,
            local_rank=0,
            per_replica=t.batch_size // n_rep,
            attention="none",
        ),
        config_line(cfg),
    ]
    at, schedule, path = resumed if resumed is not None else (0, t.steps, None)
    return lines + closing_banner(args, path, at, schedule)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = run_config(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    why = needs_torch(args, cfg)
    if why is not None:
        print(f"trainer: stand-in ({ENV}=1): {why}; running the real trainer", flush=True)
        from trainer.cli import main as real

        return real(argv)
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    t = cfg.train
    resumed = load_latest(run_dir) if args.resume else None
    start, schedule = (resumed[0], resumed[1]) if resumed else (0, t.steps)
    for line in banner(cfg, args, resumed):
        print(line, flush=True)
    stop = stop_on_signals(lambda _name: None)  # the loop reads ``stop`` itself
    if not args.plain:
        if args.warmup == "none":
            print(WARMUP_SKIPPED, flush=True)
        for dev in cfg.devices.drafter if args.warmup == "sequential" else ():
            print(f"trainer: warm-up {dev} forward+backward 0.00s", flush=True)
    return _train(cfg, args, run_dir, start, schedule, stop)


def _train(
    cfg: TrainConfig,
    args: argparse.Namespace,
    run_dir: Path,
    start: int,
    schedule: int,
    stop: list[int],
) -> int:
    """Steps ``start + 1`` .. ``train.steps`` (a sleep each, stretched by ``slow@``), the
    faults of each step before it, the log line and checkpoint after it; the exit code."""
    t = cfg.train
    faults = FaultInjector(args.fault, start_step=start)
    blocks = t.batch_size * t.blocks_per_seq
    reporter = Reporter(
        run_dir,
        log_every=t.log_every,
        tokens_per_step=t.batch_size * cfg.data.seq_len,
        blocks_per_step=blocks,
        devices=[*cfg.devices.target, *cfg.devices.drafter],
    )
    pause = step_seconds()
    done = saved = start
    reporter.restart_clock()
    t0 = time.monotonic()
    for step in range(start + 1, t.steps + 1):
        if stop:
            break
        with faults.stretch(step):
            faults.before_step(step)
            if faults.oom_due(step):
                faults.raise_oom()
            time.sleep(pause)
        lr = lr_at(cfg, step, schedule)
        tau_tf = min(float(cfg.drafter.block_size), 1.0 + step / 50.0)
        tau = tau_tf if t.eval_every and step % t.eval_every == 0 else None
        reporter.on_step(step, loss_at(step) * blocks, tau_tf * blocks, lr, tau=tau)
        done = step
        if step % t.ckpt_every == 0:
            save(run_dir, step, schedule, t.keep_ckpts)
            saved = step
    wall = time.monotonic() - t0
    path = save(run_dir, done, schedule, t.keep_ckpts) if done > saved else None
    if stop:
        name = signal.Signals(stop[0]).name
        print(stopped_line(name, done, path or "up to date"), flush=True)
        return 128 + stop[0]
    tok_s = (done - start) * reporter.tokens_per_step / wall if wall > 0 else 0.0
    print(finished_line(done, wall, tok_s, path or "up to date"), flush=True)
    return EXIT_OK
