"""What naming the GPU processes costs the host observer per document (agent/procdetails.py).

``N`` real processes (``sleep``) stand for the GPU processes of a host (one per GPU of an
8-GPU host by default); one :class:`~orchestrator.agent.procdetails.ProcDetails` fills their
user, CPU % and command the way ``HostObserver.observe`` does, once per document:

- ``cold_ms``: the first document that sees them (per process: stat, status, uid_map,
  cmdline, the root opened and its /etc/passwd read), median over ``--repeat`` fresh readers;
- ``warm_ms``: every later document (per process: stat only; the rest is kept per PID and
  start time), median over ``--repeat`` documents;
- ``per_process_warm_us``: ``warm_ms`` over ``N``.

CPU time (``time.process_time``), so the machine's load barely moves it. Equivalent of a warm
document: one ``cat /proc/PID/stat`` per GPU process.

Usage: ``python bench/gpu_procs.py [-n 8] [--repeat 50] [--json]``; with ``--json`` the last line
is ``{"processes", "cold_ms", "warm_ms", "ratio_cold_vs_warm", "per_process_warm_us", "load1"}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.agent.procdetails import ProcDetails
from orchestrator.wire.model import GpuProcess, GpuSample


def _cpu_ms(fn) -> float:
    t0 = time.process_time()
    fn()
    return (time.process_time() - t0) * 1000.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=8, help="GPU processes (one per GPU)")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    kids = [subprocess.Popen(["sleep", "600"]) for _ in range(args.n)]
    try:
        samples = tuple(
            GpuSample(i, processes=(GpuProcess(k.pid, used_memory_mib=1024.0),))
            for i, k in enumerate(kids)
        )
        cold = [_cpu_ms(lambda: ProcDetails().fill(samples)) for _ in range(args.repeat)]
        warm_reader = ProcDetails()
        warm_reader.fill(samples)
        warm = [_cpu_ms(lambda: warm_reader.fill(samples)) for _ in range(args.repeat)]
        filled = warm_reader.fill(samples)
        assert all(p.command and p.user for g in filled for p in g.processes or ()), filled
    finally:
        for k in kids:
            k.kill()
            k.wait()
    out = {
        "processes": args.n,
        "cold_ms": round(statistics.median(cold), 3),
        "warm_ms": round(statistics.median(warm), 3),
        "ratio_cold_vs_warm": round(
            statistics.median(cold) / max(statistics.median(warm), 1e-9), 1
        ),
        "per_process_warm_us": round(statistics.median(warm) / args.n * 1000.0, 1),
        "load1": float(Path("/proc/loadavg").read_text().split()[0]),
    }
    print(f"{args.n} GPU processes, median of {args.repeat} (CPU ms), load {out['load1']}")
    print(f"  first document (cold)  {out['cold_ms']:8.3f} ms")
    print(
        f"  later documents (warm) {out['warm_ms']:8.3f} ms   ({out['per_process_warm_us']} us a process)"
    )
    print(f"  cold / warm            {out['ratio_cold_vs_warm']:8.1f}x")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
