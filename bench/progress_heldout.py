"""Score a held-out excerpt set through ``orch diagnose LOG --json``, one process per file.

The readers' score on excerpts they were not written from: each file of the set (default
``tests/data/progress_heldout2``) is read by ``python -m orchestrator.cli diagnose --json``
and its ``progress`` object judged against the file's hand label
(:func:`tests.progress.corpus.score_cli`). Prints step, loss and throughput right out of N,
the readers detected as labelled, and every miss.

Usage: ``python bench/progress_heldout.py [DIR] [--json]``; with ``--json`` the last line is
``{"n", "step", "loss", "throughput", "frameworks", "misses": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.progress.corpus import load, score_cli  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", nargs="?", default=str(ROOT / "tests" / "data" / "progress_heldout2"))
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args()
    s = score_cli(load(Path(args.dir)))
    n = s["n"]
    print(
        f"step {s['step']}/{n}  loss {s['loss']}/{n}  throughput {s['throughput']}/{n}  "
        f"reader as labelled {s['frameworks']}/{n}"
    )
    for m in s["misses"]:  # type: ignore[attr-defined]
        print(f"  miss: {m}")
    if args.json:
        print(json.dumps(s))


if __name__ == "__main__":
    main()
