"""``python -m trainer``'s flags and the run config they name (torch-free: the stand-in,
:mod:`trainer.standin`, parses the same command line as :mod:`trainer.cli`).

Exit codes: 0 all steps done; 1 an exception; 2 bad flags, bad config or a missing optional
dependency (one ``error:`` line, no traceback); 128+signal after SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from collections.abc import Callable
from types import FrameType

from trainer._version import __version__
from trainer.config import ConfigError, TrainConfig, load_config, with_steps
from trainer.faults import Fault, parse_fault

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


def run_config(args: argparse.Namespace) -> TrainConfig:
    """The config of a run: ``--config`` with ``--set``, ``--steps`` and ``--forever`` applied.

    Raises:
        ConfigError: a bad file or value, a negative ``--steps``, ``--steps`` with ``--forever``.
    """
    cfg = load_config(args.config, args.overrides)
    if args.steps is not None:
        if args.steps < 0:
            raise ConfigError("--steps", None, "steps", f"must be >= 0, got {args.steps}")
        cfg = with_steps(cfg, args.steps)
    if args.forever:
        if args.steps is not None:
            raise ConfigError("--forever", None, "steps", "trains until stopped; drop --steps")
        cfg = with_steps(cfg, FOREVER_STEPS)
    return cfg


WARMUP_SKIPPED = (
    "trainer: warm-up skipped (--warmup none): first compiles run concurrently in worker threads"
)
"""The line ``--warmup none`` prints where the warm-up lines would be."""


def first_line(cfg: TrainConfig, args: argparse.Namespace) -> str:
    """The banner's first line: version, config, run directory and pid."""
    return (
        f"trainer: version={__version__} config={cfg.source} run_dir={args.run_dir} "
        f"pid={os.getpid()}"
    )


def run_line(
    cfg: TrainConfig,
    args: argparse.Namespace,
    *,
    world_size: int,
    rank: int,
    local_rank: int,
    per_replica: int,
    attention: str,
) -> str:
    """The banner's ``world_size=`` line: the run's shape (per_replica: sequences per replica
    and step; attention: the kernel's name)."""
    t = cfg.train
    return (
        f"trainer: world_size={world_size} rank={rank} local_rank={local_rank} "
        f"batch={t.batch_size} per_replica={per_replica} seq_len={cfg.data.seq_len} "
        f"data={cfg.data.kind} steps={_steps_word(t.steps)} attention={attention} "
        f"warmup={args.warmup} grad_checkpoint={t.grad_checkpoint} "
        f"loop={'plain' if args.plain else 'pipelined'}"
    )


def config_line(cfg: TrainConfig) -> str:
    """The banner's ``config`` line: the whole config as sorted JSON."""
    return f"trainer: config {json.dumps(cfg.to_dict(), sort_keys=True)}"


def stopped_line(signal_name: str, step: int, saved: object) -> str:
    """The last line after SIGTERM/SIGINT (``saved``: the checkpoint, or why there is none)."""
    return f"trainer: stopped by {signal_name} at step={step}; checkpoint {saved}"


def finished_line(step: int, wall_s: float, tok_s: float, saved: object) -> str:
    """The last line of a run that reached its step count (wall in s, tokens per second)."""
    return f"trainer: finished step={step} wall_s={wall_s:.2f} tok/s={tok_s:.0f} checkpoint={saved}"


def closing_banner(
    args: argparse.Namespace, resumed_from: object, start_step: int, schedule_steps: int
) -> list[str]:
    """The banner's last lines: ``resumed from PATH at step=N lr_schedule_steps=M`` (or the
    no-checkpoint line under ``--resume auto``), then ``faults SPEC...`` when faults were given.

    >>> a = build_parser().parse_args(["--config", "c", "--resume", "auto", "--fault", "crash@3"])
    >>> closing_banner(a, None, 0, 200)
    ['trainer: resume: no valid checkpoint, starting at step=0', 'trainer: faults crash@3']
    """
    lines = []
    if resumed_from is not None:
        lines.append(
            f"trainer: resumed from {resumed_from} at step={start_step} "
            f"lr_schedule_steps={schedule_steps}"
        )
    elif args.resume:
        lines.append("trainer: resume: no valid checkpoint, starting at step=0")
    if args.fault:
        lines.append("trainer: faults " + " ".join(f.spec() for f in args.fault))
    return lines


def stop_on_signals(request_stop: Callable[[str], None]) -> list[int]:
    """Handle SIGTERM and SIGINT: the first calls ``request_stop(name)`` (the run stops at the
    next step boundary and checkpoints), a second one kills the process with that signal (the
    clean stop could not finish, e.g. during a hang). Returns the list of signals seen."""
    seen: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if seen:  # second signal: give up on the clean stop
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        seen.append(signum)
        request_stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return seen
