"""How fast ``orch diagnose`` streams a log: lines/s and MB/s over a synthetic training log.

Usage: python bench/diagnose.py [--lines N] [--json]
Prints the figures, then ONE JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from orchestrator.playbooks import iter_log_lines, load_playbooks, match_log


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true", help="only the JSON object")
    args = ap.parse_args()
    pbs = load_playbooks()
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as fh:
        for i in range(args.lines):
            fh.write(f"step={i} loss=2.3104 acc_len=3.21 tok/s=21500 lr=3.0e-04\n")
        fh.write("OSError: [Errno 28] No space left on device\n")
        path = fh.name
    try:
        size = os.path.getsize(path)
        t0 = time.perf_counter()
        matches = match_log(iter_log_lines(path), pbs)
        elapsed = time.perf_counter() - t0
    finally:
        os.unlink(path)
    result = {
        "lines": args.lines + 1,
        "bytes": size,
        "seconds": round(elapsed, 3),
        "lines_per_s": round((args.lines + 1) / elapsed),
        "mb_per_s": round(size / elapsed / 1e6, 1),
        "signature_playbooks": sum(1 for p in pbs if p.kind == "signature"),
        "matched": [m.id for m in matches],
    }
    if not args.json:
        print(
            f"{result['lines']:,} lines ({size / 1e6:.1f} MB) in {elapsed:.2f} s: "
            f"{result['lines_per_s']:,} lines/s, {result['mb_per_s']} MB/s, "
            f"{result['signature_playbooks']} signature playbooks; matched {result['matched']}"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
