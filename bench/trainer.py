"""Throughput of the pipelined multi-threaded trainer vs a plain single-threaded loop.

Both train the same drafter on the same target and data (same config, same seeds) for the same
number of steps; the figure is target tokens per wall second, warm-up and construction excluded.
The plain loop runs the target, then the drafter on the whole batch, in one thread with no queues.
Beside it, ``tau``: the acceptance length of real greedy draft-and-verify on held-out anchors at
the end of the same runs (the last measurement; ``train.eval_every`` must divide ``--steps``), and
two baselines on the same held-out anchors after the pipelined runs: ``tau_no_context`` (the same
drafter with the target's context features zeroed) and ``tau_bigram`` (drafts chained through the
most frequent successor of each token in the training data; no context, no training). With them
the evaluation's wall time and peak tensor memory (``tau_eval_s``, ``tau_eval_peak_mib``).

    python bench/trainer.py                      # CPU, trainer/configs/tiny-cpu.yaml
    python bench/trainer.py --json               # ... one JSON object printed last
    python bench/trainer.py --config trainer/configs/dflash-8gpu.yaml --steps 50 --json   # on a GPU box
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.config import load_config, with_steps  # noqa: E402  (after the path tweak)
from trainer.pipeline import RunOptions, Trainer  # noqa: E402
from trainer.verify import bigram_drafts, evaluate, successor_table  # noqa: E402

GPU_COMMAND = (
    "python bench/trainer.py --config trainer/configs/dflash-8gpu.yaml --steps 50 --compile --json"
)


def measure(
    config: str, overrides: list[str], steps: int, plain: bool, compile_: bool
) -> tuple[float, dict[str, float | None]]:
    """Target tokens/s of one run of ``steps`` steps (fresh trainer, temp run dir), and its last
    tau; a pipelined run adds the baselines and the evaluation's cost (see the docstring)."""
    cfg = with_steps(load_config(config, overrides), steps)
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        trainer = Trainer(cfg, RunOptions(Path(tmp), compile=compile_, log_out=io.StringIO()))
        try:
            trainer.warmup("sequential")
            result = trainer.run_plain(steps) if plain else trainer.run_pipelined(steps)
            taus = {"tau": result.last.tau if result.last is not None else None}
            if not plain:
                taus.update(baselines(trainer))
        finally:
            trainer.close()
    return result.tok_s, taus


def baselines(trainer: Trainer) -> dict[str, float | None]:
    """``tau_no_context``, ``tau_bigram`` and the last evaluation's cost for a trained trainer."""
    if trainer.heldout is None:
        return {}
    tokens, anchors = trainer.heldout
    source, vocab = trainer.source, trainer.cfg.target.vocab_size
    train_tokens = source.pool if trainer.cfg.data.kind == "target" else source.batch(1, 256)
    table = successor_table(train_tokens, vocab)
    block = trainer.cfg.drafter.block_size
    rows = trainer.cfg.train.eval_chunk_rows
    bigram = evaluate(trainer.target, bigram_drafts(table, block), tokens, anchors, block, rows)
    last = trainer.last_eval
    return {
        "tau_no_context": trainer.evaluate(context=False),
        "tau_bigram": bigram.tau,
        "tau_eval_s": None if last is None else last.seconds,
        "tau_eval_peak_mib": None if last is None else last.peak_bytes / 2**20,
    }


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "trainer/configs/tiny-cpu.yaml"))
    p.add_argument("--steps", type=int, default=60, help="steps per measured run")
    p.add_argument("--repeats", type=int, default=3, help="runs per loop; the median is reported")
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE"
    )
    p.add_argument("--compile", action="store_true", help="torch.compile the drafter attention")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    args = p.parse_args(argv)

    cfg = load_config(args.config, args.overrides)
    print(
        f"bench: config={args.config} steps={args.steps} repeats={args.repeats} "
        f"drafter_devices={','.join(cfg.devices.drafter)} target_devices={','.join(cfg.devices.target)} "
        f"torch={torch.__version__} torch_threads={cfg.train.torch_threads or torch.get_num_threads()}"
    )
    pipelined: list[float] = []
    plain: list[float] = []
    runs: list[dict[str, float | None]] = []
    plain_taus: list[float | None] = []
    for _ in range(args.repeats):  # interleaved so a noisy neighbour hits both loops alike
        tok_s, taus = measure(args.config, args.overrides, args.steps, False, args.compile)
        pipelined.append(tok_s)
        runs.append(taus)
        tok_s, taus = measure(args.config, args.overrides, args.steps, True, args.compile)
        plain.append(tok_s)
        plain_taus.append(taus["tau"])
    best_pipe, best_plain = statistics.median(pipelined), statistics.median(plain)
    ratio = best_pipe / best_plain if best_plain else 0.0
    figures = {k: _median([r.get(k) for r in runs]) for k in FIGURES}
    tau, plain_tau = figures["tau"], _median(plain_taus)
    print(
        f"pipelined: {best_pipe:.0f} tok/s median  (runs: {', '.join(f'{x:.0f}' for x in pipelined)})"
    )
    print(
        f"plain:     {best_plain:.0f} tok/s median  (runs: {', '.join(f'{x:.0f}' for x in plain)})"
    )
    print(f"ratio pipelined/plain: {ratio:.2f}x")
    print(
        f"tau after {args.steps} steps (greedy draft-and-verify, held-out): pipelined "
        f"{_fmt(tau)}, plain {_fmt(plain_tau)}"
    )
    print(
        f"baselines on the same anchors: context zeroed {_fmt(figures['tau_no_context'])}, "
        f"most-frequent successor {_fmt(figures['tau_bigram'])}; evaluation "
        f"{figures['tau_eval_s'] or 0:.2f} s, peak {figures['tau_eval_peak_mib'] or 0:.1f} MiB"
    )
    if not torch.cuda.is_available():
        print(f"no GPU here; on a GPU machine run: {GPU_COMMAND}")
    if args.json:
        print(
            json.dumps(
                {
                    "pipelined_tok_s": round(best_pipe, 1),
                    "plain_tok_s": round(best_plain, 1),
                    "ratio": round(ratio, 3),
                    **{k: None if v is None else round(v, 3) for k, v in figures.items()},
                }
            )
        )
    return 0


FIGURES = ("tau", "tau_no_context", "tau_bigram", "tau_eval_s", "tau_eval_peak_mib")


def _fmt(tau: float | None) -> str:
    return "not measured (eval_every does not divide --steps)" if tau is None else f"{tau:.2f}"


if __name__ == "__main__":
    sys.exit(main())
