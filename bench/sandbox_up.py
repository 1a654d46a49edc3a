"""Time of ``orch sandbox up`` (and ``down``) in LXC mode and in process mode, side by side.

Each sample is one fresh state directory: ``manager.up(D, containers=C)`` from nothing
(fake NVML already compiled into D/lib: copied from a warm-up sandbox, so the figure is
the sandbox's own start, not gcc), then ``manager.down(D)``. LXC samples run only where
LXC can (root, the lxc package); the ratio is LXC over process.

Usage: ``python bench/sandbox_up.py [-n 7] [--containers 3] [--json]``; the last line with
``--json`` is ``{"n", "containers", "lxc_up_s", "process_up_s", "lxc_down_s",
"process_down_s", "ratio_up_lxc_vs_process", "lxc"}`` (medians; ``lxc`` is null and the
LXC figures absent where LXC cannot run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.sandbox import lxc, manager


def sample(base: Path, i: int, mode: str, containers: int, lib: Path) -> tuple[float, float]:
    state = base / f"{mode}{i}"
    shutil.copytree(lib, state / "lib")  # a built libnvidia-ml/init: no compiler in the figure
    start = time.perf_counter()
    info = manager.up(state, containers=containers, gpus=8, scenario="healthy", isolation=mode)
    up_s = time.perf_counter() - start
    assert info.isolation == mode
    start = time.perf_counter()
    manager.down(state)
    return up_s, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=7, help="samples per mode")
    ap.add_argument("--containers", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="orch-bench-up-", dir="/tmp"))
    reason = lxc.unavailable()
    modes = ["process"] + (["lxc"] if reason is None else [])
    warm = base / "warm"
    manager.up(warm, containers=1, gpus=1, isolation=modes[-1])  # builds lib/ (and init)
    manager.down(warm)
    figures: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    try:
        for i in range(args.n):  # interleaved: load on this shared machine hits both alike
            for mode in modes:
                figures[mode].append(sample(base, i, mode, args.containers, warm / "lib"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    med = statistics.median
    doc: dict[str, object] = {"n": args.n, "containers": args.containers, "lxc": reason is None}
    for mode in modes:
        doc[f"{mode}_up_s"] = round(med(u for u, _ in figures[mode]), 3)
        doc[f"{mode}_down_s"] = round(med(d for _, d in figures[mode]), 3)
        print(
            f"{mode:<8} up {doc[f'{mode}_up_s']:.2f} s  down {doc[f'{mode}_down_s']:.2f} s  "
            f"(median of {args.n}, {args.containers} containers)"
        )
    if reason is None:
        doc["ratio_up_lxc_vs_process"] = round(
            float(doc["lxc_up_s"]) / float(doc["process_up_s"]),  # type: ignore[arg-type]
            2,
        )
        print(f"lxc/process up: {doc['ratio_up_lxc_vs_process']}x")
    else:
        print(f"no LXC figures: {reason}")
    if args.json:
        print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
