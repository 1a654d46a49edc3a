"""How fast and how right ``orch diagnose`` is: the matcher of this tree beside a baseline.

Speed: lines/s and MB/s over a synthetic 1M-line training log (every line healthy but the
last), end to end as ``orch diagnose`` runs it (read the file, match), and the matching
alone over lines already in memory; also the matching alone over DeepSpeed INFO lines (a
fifth as many), which hold a needle and so take the slow path in both matchers. Medians of
``--repeat`` runs.

Right: the corpus score of tests/data/logs (tests/detect/corpus.py): top-1 accuracy on
clear-signature and on hard (truncated or indirect) excerpts, and false matches on
healthy ones.

The baseline is the matcher and playbooks of git revision ``--baseline`` (default: the
main before the vocabularies, 425c3cc), loaded with ``git show`` into a temporary module, so both
run in the same process on the same input. Without git history the baseline is skipped.

Usage: python bench/diagnose.py [--lines N] [--repeat K] [--baseline REV] [--json]
Prints the figures, then ONE JSON object as the last line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.playbooks import loader as current  # noqa: E402  (after the path tweak)
from tests.detect.corpus import load_corpus, score  # noqa: E402

BASELINE_REV = "425c3cc"
"""main before the vocabularies (commit 425c3cc, just after the playbooks package split): the
matcher and the 27 signature playbooks it had. ``--baseline 88d45a3`` (an older main) no
longer loads: its loader lives at another path."""
HEALTHY_LINE = "step={i} loss=2.3104 acc_len=3.21 tok/s=21500 lr=3.0e-04\n"
INFO_LINE = (
    "[2024-03-01 04:51:13,576] [INFO] [logging.py:96:log_dist] [Rank 0] step={i}, skipped=0, "
    "lr=[1e-05], mom=[(0.9, 0.999)]\n"
)
"""DeepSpeed's INFO lines: "info" holds "inf", a needle of nan-loss, so every such line takes
the slow path (the regexes) in both matchers: the worst common case, reported beside."""
LAST_LINE = "OSError: [Errno 28] No space left on device\n"


def load_baseline(rev: str, workdir: Path) -> tuple[ModuleType, list[Any]] | str:
    """(the baseline's playbooks module, its playbooks), or why it could not be loaded."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
        ).stdout

    try:
        source = git("show", f"{rev}:orchestrator/playbooks/loader.py")
        names = git("ls-tree", "--name-only", rev, "playbooks/").split()
        for name in names:
            (workdir / Path(name).name).write_text(git("show", f"{rev}:{name}"), encoding="utf-8")
    except (OSError, subprocess.CalledProcessError) as exc:
        err = getattr(exc, "stderr", "") or str(exc)
        return f"git revision {rev} not available: {err.strip()[:200]}"
    try:  # since the playbooks package split, the matcher lives beside the loader: load it too
        matcher = git("show", f"{rev}:orchestrator/playbooks/matching.py")
    except subprocess.CalledProcessError:
        matcher = None
    if matcher is not None:
        mpath = workdir / "orch_baseline_matching.py"
        mpath.write_text(matcher, encoding="utf-8")
        mspec = importlib.util.spec_from_file_location("orch_baseline_matching", mpath)
        assert mspec is not None and mspec.loader is not None
        mmod = importlib.util.module_from_spec(mspec)
        sys.modules[mspec.name] = mmod
        mspec.loader.exec_module(mmod)
        source = source.replace(
            "from orchestrator.playbooks.matching import", "from orch_baseline_matching import"
        )
    path = workdir / "baseline_playbooks.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("orch_baseline_playbooks", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    return module, module.load_playbooks(workdir)


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median seconds of ``repeat`` calls, and the last call's result."""
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def measure(
    module: ModuleType,
    pbs: list[Any],
    path: str,
    lines: list[str],
    repeat: int,
    size: int,
    corpus: list[Any],
    info: list[str],
) -> dict[str, Any]:
    """One matcher's figures: end to end, matching alone, INFO lines, and its corpus score."""
    n = len(lines)
    e2e, matches = timed(lambda: module.match_log(module.iter_log_lines(path), pbs), repeat)
    alone, _ = timed(lambda: module.match_log(lines, pbs), repeat)
    slow, _ = timed(lambda: module.match_log(info, pbs), repeat)
    sigs = [p for p in pbs if p.kind == "signature"]
    return {
        "seconds": round(e2e, 3),
        "lines_per_s": round(n / e2e),
        "mb_per_s": round(size / e2e / 1e6, 1),
        "match_only_lines_per_s": round(n / alone),
        "info_lines_per_s": round(len(info) / slow),
        "signature_playbooks": len(sigs),
        "matched": [m.id for m in matches],
        "corpus": score(corpus, lambda ls: [m.id for m in module.match_log(ls, pbs)]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lines", type=int, default=1_000_000, help="healthy lines before the last")
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure; the median is shown")
    ap.add_argument("--baseline", default=BASELINE_REV, help="git revision to compare with")
    ap.add_argument("--json", action="store_true", help="only the JSON object")
    args = ap.parse_args()
    corpus = load_corpus()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "train.log"
        with open(log, "w", encoding="utf-8") as fh:
            for i in range(args.lines):
                fh.write(HEALTHY_LINE.format(i=i))
            fh.write(LAST_LINE)
        size = os.path.getsize(log)
        lines = [HEALTHY_LINE.format(i=i) for i in range(args.lines)] + [LAST_LINE]
        info = [INFO_LINE.format(i=i) for i in range(max(args.lines // 5, 1))]
        base_dir = Path(tmp) / "baseline"
        base_dir.mkdir()
        baseline = load_baseline(args.baseline, base_dir)
        new = measure(
            current, current.load_playbooks(), str(log), lines, args.repeat, size, corpus, info
        )
        old: dict[str, Any] | None = None
        if not isinstance(baseline, str):
            old = measure(*baseline, str(log), lines, args.repeat, size, corpus, info)
    result: dict[str, Any] = {
        "lines": args.lines + 1,
        "bytes": size,
        "repeat": args.repeat,
        "lines_per_s": new["lines_per_s"],
        "new": new,
        "baseline": {"rev": args.baseline, **old}
        if old
        else {"rev": args.baseline, "skipped": baseline},
        "speed_ratio": round(new["lines_per_s"] / old["lines_per_s"], 2) if old else None,
    }
    if not args.json:
        print(f"{result['lines']:,} lines ({size / 1e6:.1f} MB), median of {args.repeat} runs")
        rows = [("new (this tree)", new)] + (
            [(f"baseline {args.baseline[:7]}", old)] if old else []
        )
        for name, r in rows:
            c = r["corpus"]
            print(
                f"  {name:18s} {r['lines_per_s']:>9,} lines/s end to end ({r['mb_per_s']} MB/s), "
                f"{r['match_only_lines_per_s']:>9,} lines/s matching alone, "
                f"{r['info_lines_per_s']:>9,} on DeepSpeed INFO lines; "
                f"{r['signature_playbooks']} signature playbooks; matched {r['matched']}"
            )
            print(
                f"  {'':18s} corpus: top-1 {c['clear_top1_pct']}% of {c['clear_cases']} clear, "
                f"{c['hard_top1_pct']}% of {c['hard_cases']} hard; "
                f"{c['healthy_false_matches']} false matches on {c['healthy_cases']} healthy"
            )
        if old:
            print(f"  speed new/baseline: {result['speed_ratio']}x")
        else:
            print(f"  baseline skipped: {baseline}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
