"""Per-line cost of each progress reader, and the corpus score, side by side.

For every reader of ``orchestrator/wire/progress_readers.py``: the median microseconds of
:func:`orchestrator.wire.progress.read_line` per line over that framework's real lines from
``tests/data/progress`` (its own excerpts; the generic reader gets the bundled trainer's
``step= loss= tok/s=`` line), next to the median of a line that says nothing (a log line of
the same length without its digits); then the whole follow-a-log path the agent takes
(:class:`ProgressParser.feed`, framework detection included) per line. Finally the corpus score: step, loss and throughput (value and unit) right out of N.

Usage: ``python bench/progress.py [--repeat 2000] [--json]``; the last line with ``--json``
is ``{"readers": {name: {"us_per_line", "us_per_silent_line", "lines"}}, "feed_us_per_line",
"score": {"corpus"|"heldout"|"heldout2": {"n", "step", "loss", "throughput"}}}``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.wire.progress import ProgressParser, read_line  # noqa: E402
from orchestrator.wire.progress_readers import BY_NAME  # noqa: E402
from tests.progress.corpus import load, score  # noqa: E402

HELDOUT = ROOT / "tests" / "data" / "progress_heldout"
HELDOUT2 = ROOT / "tests" / "data" / "progress_heldout2"
TRAINER_LINE = "step=120 loss=2.3410 acc_len=3.21 tok/s=21500 lr=3.0e-04 gpu_mem=41.2"


def _median_us(fn, lines: list[str], repeat: int) -> float:
    samples = []
    for _ in range(max(5, repeat // max(1, len(lines)))):
        t = time.perf_counter()
        for line in lines:
            fn(line)
        samples.append((time.perf_counter() - t) / len(lines) * 1e6)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2000, help="lines timed per sample")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args()
    cases = load()
    by_reader: dict[str, list[str]] = {"generic": [TRAINER_LINE]}
    for c in (*cases, *load(HELDOUT2)):  # set 2 holds the only tinygrad and torch_xla lines
        p = ProgressParser()
        p.read(c.lines)
        if p.framework:
            by_reader.setdefault(p.framework, []).extend(x for x in c.lines if x.strip())
    readers = {}
    print(f"{'reader':<16} {'lines':>5} {'us/line':>9} {'us/silent':>10}")
    for name, reader in BY_NAME.items():
        lines = by_reader.get(name, [])
        if not lines:
            continue
        silent = [re.sub(r"\d", "x", x) for x in lines]
        us = _median_us(lambda x, r=reader: read_line(x, r), lines, args.repeat)
        quiet = _median_us(lambda x, r=reader: read_line(x, r), silent, args.repeat)
        readers[name] = {
            "us_per_line": round(us, 2),
            "us_per_silent_line": round(quiet, 2),
            "lines": len(lines),
        }
        print(f"{name:<16} {len(lines):>5} {us:>9.2f} {quiet:>10.2f}")
    every = [x for c in cases for x in c.lines]
    parser = ProgressParser()
    feed = _median_us(parser.feed, every, args.repeat)
    trainer = _median_us(ProgressParser().feed, [TRAINER_LINE], args.repeat)
    print(
        f"follow a log (ProgressParser.feed), all corpus lines: {feed:.2f} us/line; "
        f"the bundled trainer's line: {trainer:.2f} us/line"
    )
    right = {}
    for label, root in (("corpus", None), ("heldout", HELDOUT), ("heldout2", HELDOUT2)):
        s = score(cases if root is None else load(root))
        right[label] = {k: s[k] for k in ("n", "step", "loss", "throughput")}
        print(
            f"{label}: step {s['step']}/{s['n']}, loss {s['loss']}/{s['n']}, "
            f"throughput {s['throughput']}/{s['n']}"
        )
    if args.json:
        print(
            json.dumps(
                {
                    "readers": readers,
                    "feed_us_per_line": round(feed, 2),
                    "trainer_feed_us_per_line": round(trainer, 2),
                    "score": right,
                }
            )
        )


if __name__ == "__main__":
    main()
