"""``python -m trainer``: argument parsing, the startup banner, signals and exit codes.

Exit codes: 0 all steps done (never with ``--forever``); 1 an exception (traceback on stderr, e.g. ``--fault crash@N``);
2 bad flags, bad config or a missing optional dependency (one ``error:`` line, no traceback);
128+signal after SIGTERM/SIGINT once the checkpoint is written (143 / 130).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
from pathlib import Path
from types import FrameType

import torch

from trainer._version import __version__
from trainer.config import ConfigError, DependencyError, TrainConfig, load_config, with_steps
from trainer.faults import Fault, parse_fault
from trainer.hf import check_dependencies
from trainer.pipeline import RunOptions, Trainer

EXIT_OK, EXIT_CRASH, EXIT_USAGE = 0, 1, 2
FOREVER_STEPS = 2**62
"""``--forever``: a step count no run reaches (at 1 µs a step, 146,000 years); the cosine decay
over it stays at its start, so the learning rate holds at ``train.lr`` after the warm-up."""


def _fault(text: str) -> Fault:
    try:
        return parse_fault(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    """``--dist-timeout``: a number of seconds > 0.

    >>> _seconds("30"), _seconds("0.5")
    (30.0, 0.5)
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Train a DFlash-style speculative-decoding drafter against a frozen target LM. "
        "Output contract (log line, metrics.jsonl, heartbeat, exit codes): docs/trainer.md.",
    )
    p.add_argument(
        "--config", required=True, help="YAML config, e.g. trainer/configs/tiny-cpu.yaml"
    )
    p.add_argument("--steps", type=int, help="total steps to reach (overrides train.steps)")
    p.add_argument(
        "--forever",
        action="store_true",
        help="train until stopped (SIGTERM/SIGINT, orch stop) instead of to a step count; the "
        "learning rate holds at train.lr after the warm-up",
    )
    p.add_argument(
        "--run-dir", default="trainer-run", help="metrics.jsonl, heartbeat and checkpoints/ go here"
    )
    p.add_argument(
        "--resume",
        choices=["auto"],
        help="auto: continue from the newest valid checkpoint in --run-dir",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the drafter attention (flex_attention if available)",
    )
    p.add_argument(
        "--warmup",
        choices=["sequential", "none"],
        default="sequential",
        help="sequential (default): one forward+backward per drafter device before threads start; "
        "none: skip it (only to reproduce the multi-threaded FX tracing race)",
    )
    p.add_argument(
        "--fault",
        type=_fault,
        action="append",
        default=[],
        metavar="KIND@STEP[:ARG]",
        help="inject a failure: crash@S, crash-once@S (only in a run started from step 0: a "
        "resumed run gets past it), hang@S, silent-exit@S[:CODE], slow@S:FACTOR, "
        "nan@S[:COUNT], oom@S, fx-race@S, kill@S[:RANK] (SIGKILL in that global rank)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value (YAML syntax), e.g. --set devices.drafter=[cpu,cpu]",
    )
    p.add_argument(
        "--dist-timeout",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="under torchrun: how long a collective waits for the other ranks before it fails "
        "(default: torch's, 30 min for gloo, 10 min for NCCL)",
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="single-threaded reference loop instead of the pipeline",
    )
    return p


def _steps_word(steps: int) -> str:
    """``steps=`` in the banner: the count, or ``forever``.

    >>> _steps_word(200), _steps_word(FOREVER_STEPS)
    ('200', 'forever')
    """
    return "forever" if steps >= FOREVER_STEPS else str(steps)


def banner(cfg: TrainConfig, trainer: Trainer, args: argparse.Namespace) -> list[str]:
    """The startup banner lines (config, versions, devices)."""
    cfg = trainer.cfg  # the devices this process uses (shifted for torchrun's LOCAL_RANK)
    cuda = torch.version.cuda or "none"
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    drafter_params = sum(p.numel() for p in trainer.replicas[0].parameters() if p.requires_grad)
    target_params = sum(p.numel() for p in trainer.target.parameters())
    n_rep = len(trainer.replicas)
    per_rep = cfg.train.batch_size // (trainer.world_size * n_rep)
    lines = [
        f"trainer: version={__version__} config={cfg.source} run_dir={args.run_dir} pid={os.getpid()}",
        f"trainer: python={platform.python_version()} torch={torch.__version__} cuda={cuda} "
        f"cuda_available={torch.cuda.is_available()} gpus_visible={n_gpu}",
        f"trainer: target={'hf:' + str(cfg.target.hf_path) if cfg.target.hf_path else 'builtin'} "
        f"layers={trainer.target.n_layers} params={target_params} devices={','.join(cfg.devices.target)}",
        f"trainer: drafter layers={cfg.drafter.n_layers} d_model={cfg.drafter.d_model} "
        f"trainable_params={drafter_params} block_size={cfg.drafter.block_size} "
        f"target_layers={cfg.drafter.target_layers} replicas={n_rep} devices={','.join(cfg.devices.drafter)}",
        f"trainer: world_size={trainer.world_size} rank={trainer.rank} "
        f"local_rank={trainer.local_rank} "
        f"batch={cfg.train.batch_size} per_replica={per_rep} "
        f"seq_len={cfg.data.seq_len} data={cfg.data.kind} steps={_steps_word(cfg.train.steps)} "
        f"attention={trainer.attention_name} warmup={args.warmup} "
        f"grad_checkpoint={cfg.train.grad_checkpoint} loop={'plain' if args.plain else 'pipelined'}",
        f"trainer: config {json.dumps(cfg.to_dict(), sort_keys=True)}",
    ]
    if cfg.data.kind == "target":
        lines.append(
            f"trainer: data: {cfg.data.pool} sequences generated by the target in "
            f"{trainer.source.generate_s:.2f}s (prompt_len={cfg.data.prompt_len} "
            f"temperature={cfg.data.temperature:g})"
        )
    if trainer.heldout is not None:
        lines.append(
            f"trainer: tau = greedy draft-and-verify every {cfg.train.eval_every} steps on "
            f"{cfg.train.eval_seqs} held-out sequences x {cfg.train.blocks_per_seq} anchors"
        )
    if trainer.resumed_from is not None:
        lines.append(
            f"trainer: resumed from {trainer.resumed_from} at step={trainer.start_step} "
            f"lr_schedule_steps={trainer.schedule_steps}"
        )
    elif args.resume:
        lines.append("trainer: resume: no valid checkpoint, starting at step=0")
    if args.fault:
        lines.append("trainer: faults " + " ".join(f.spec() for f in args.fault))
    return lines


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        if args.steps is not None:
            if args.steps < 0:
                raise ConfigError("--steps", None, "steps", f"must be >= 0, got {args.steps}")
            cfg = with_steps(cfg, args.steps)
        if args.forever:
            if args.steps is not None:
                raise ConfigError("--forever", None, "steps", "trains until stopped; drop --steps")
            cfg = with_steps(cfg, FOREVER_STEPS)
        check_dependencies(cfg)
    except (ConfigError, DependencyError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        trainer = Trainer(
            cfg,
            RunOptions(
                run_dir,
                compile=args.compile,
                warmup=args.warmup,
                faults=args.fault,
                resume=bool(args.resume),
                dist_timeout_s=args.dist_timeout,
            ),
        )
    except (DependencyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    talk = trainer.local_rank == 0  # one voice per node: every node's log shows its steps

    def say(line: str) -> None:
        if talk:
            print(line, flush=True)

    for line in banner(cfg, trainer, args):
        say(line)
    signals_seen: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if signals_seen:  # second signal: give up on the clean stop
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        signals_seen.append(signum)
        trainer.request_stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        if not args.plain:
            for dev, what, secs in trainer.warmup(args.warmup):
                say(f"trainer: warm-up {dev} {what} {secs:.2f}s")
            if args.warmup == "none":
                say(
                    "trainer: warm-up skipped (--warmup none): first compiles run concurrently in worker threads"
                )
        result = (
            trainer.run_plain(cfg.train.steps)
            if args.plain
            else trainer.run_pipelined(cfg.train.steps)
        )
    finally:
        trainer.close()
    if result.stopped_by:
        saved = result.checkpoint or ("up to date" if trainer.rank == 0 else "kept by rank 0")
        say(f"trainer: stopped by {result.stopped_by} at step={result.step}; checkpoint {saved}")
        return 128 + signals_seen[0]
    saved = result.checkpoint or ("up to date" if trainer.rank == 0 else "kept by rank 0")
    say(
        f"trainer: finished step={result.step} wall_s={result.wall_s:.2f} "
        f"tok/s={result.tok_s:.0f} checkpoint={saved}"
    )
    return EXIT_OK
