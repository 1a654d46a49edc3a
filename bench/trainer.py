"""Throughput of the pipelined multi-threaded trainer vs a plain single-threaded loop.

Both train the same drafter on the same target and data (same config, same seeds) for the same
number of steps; the figure is target tokens per wall second, warm-up and construction excluded.
The plain loop runs the target, then the drafter on the whole batch, in one thread with no queues.

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

GPU_COMMAND = (
    "python bench/trainer.py --config trainer/configs/dflash-8gpu.yaml --steps 50 --compile --json"
)


def measure(config: str, overrides: list[str], steps: int, plain: bool, compile_: bool) -> float:
    """Target tokens/s of one run of ``steps`` steps (fresh trainer, temp run dir)."""
    cfg = with_steps(load_config(config, overrides), steps)
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        trainer = Trainer(cfg, RunOptions(Path(tmp), compile=compile_, log_out=io.StringIO()))
        try:
            if plain:
                trainer.warmup("sequential")
                result = trainer.run_plain(steps)
            else:
                trainer.warmup("sequential")
                result = trainer.run_pipelined(steps)
        finally:
            trainer.close()
    return result.tok_s


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
    for _ in range(args.repeats):  # interleaved so a noisy neighbour hits both loops alike
        pipelined.append(measure(args.config, args.overrides, args.steps, False, args.compile))
        plain.append(measure(args.config, args.overrides, args.steps, True, args.compile))
    best_pipe, best_plain = statistics.median(pipelined), statistics.median(plain)
    ratio = best_pipe / best_plain if best_plain else 0.0
    print(
        f"pipelined: {best_pipe:.0f} tok/s median  (runs: {', '.join(f'{x:.0f}' for x in pipelined)})"
    )
    print(
        f"plain:     {best_plain:.0f} tok/s median  (runs: {', '.join(f'{x:.0f}' for x in plain)})"
    )
    print(f"ratio pipelined/plain: {ratio:.2f}x")
    if not torch.cuda.is_available():
        print(f"no GPU here; on a GPU machine run: {GPU_COMMAND}")
    if args.json:
        print(
            json.dumps(
                {
                    "pipelined_tok_s": round(best_pipe, 1),
                    "plain_tok_s": round(best_plain, 1),
                    "ratio": round(ratio, 3),
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
