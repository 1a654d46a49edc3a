"""In-process cost of ``orch check``'s own work per target: ``run_check`` with ``fetch=``.

No SSH and no imports counted: a warmed-up process runs ``sweep.run_check`` over N targets
(``--targets``, default 8 and 64) on the local host, each with ``--stored`` snapshots
already in a fresh SQLite history (the recorded case ``tests/detect/healthy/steady_run.json``
repeated, shifted in time, renamed per target) and the next one as this check's answer;
then renders it as ``orch check --json`` and the plain lines would. Prints the CPU
(``time.process_time``) of each check, medians of ``--repeat``, and ms a target beyond the
smallest N; ``--json`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from orchestrator.config.inventory import LOCAL, ContainerConfig, Inventory  # noqa: E402
from orchestrator.monitor import sweep  # noqa: E402
from orchestrator.monitor.history import History  # noqa: E402
from orchestrator.views import check  # noqa: E402
from orchestrator.wire.model import Snapshot  # noqa: E402

CASE = ROOT / "tests" / "detect" / "healthy" / "steady_run.json"


def snapshots(name: str, count: int) -> list[Snapshot]:
    """``count`` snapshots of the recorded case for target ``name``, 2 s apart, ending now."""
    base = [Snapshot.from_dict(s) for s in json.loads(CASE.read_text())["snapshots"]]
    now = time.time()
    return [
        dataclasses.replace(base[i % len(base)], target=name, taken_at=now - 2.0 * (count - i))
        for i in range(count)
    ]


def one_check(n: int, stored: int, work: Path) -> float:
    """CPU ms of one check over ``n`` targets with ``stored`` snapshots each in the history."""
    names = [f"ct{i:03d}" for i in range(n)]
    inv = Inventory(
        path=None, hosts={}, containers={k: ContainerConfig(name=k, host=LOCAL) for k in names}
    )
    feeds = {k: snapshots(k, stored + 1) for k in names}
    db = Path(tempfile.mkdtemp(dir=work)) / "orch.db"
    with History.open(db, inventory=inv) as history:
        history.record([s for k in names for s in feeds[k][:-1]])
    opts = sweep.CheckOptions(names=names, db_path=db, probe_hosts=False)
    c0 = time.process_time()
    report = sweep.run_check(inv, opts, fetch=lambda k, resume: feeds[k][-1])
    json.dumps(check.to_json(report), default=str)
    "\n".join(check.lines(report, sweep.playbook_titles()))
    return (time.process_time() - c0) * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--stored", type=int, default=15, help="stored snapshots a target")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    import os

    with tempfile.TemporaryDirectory(prefix="orch-inproc-") as tmp:
        work = Path(tmp)
        one_check(min(args.targets), args.stored, work)  # warm-up: imports, playbook cache
        ms = {
            n: statistics.median(one_check(n, args.stored, work) for _ in range(args.repeat))
            for n in args.targets
        }
    lo, hi = min(args.targets), max(args.targets)
    slope = (ms[hi] - ms[lo]) / (hi - lo) if hi > lo else 0.0
    out = {
        "ms": {str(n): round(v, 1) for n, v in ms.items()},
        "ms_per_target_slope": round(slope, 2),
        "stored": args.stored,
        "repeat": args.repeat,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    for n, v in ms.items():
        print(f"{n} targets: {v:.1f} ms ({v / n:.2f} ms a target)")
    print(f"slope {slope:.2f} ms a target; load average {out['loadavg']}")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
