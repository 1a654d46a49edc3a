"""The progress corpus: real console excerpts of progressing runs, ``tests/data/progress/<framework>/``.

Each file starts with ``# key: value`` lines, then the excerpt, verbatim:

* ``# source: URL`` (required, first): the public thread the excerpt was copied from;
* ``# expect: step=N total=N loss=X rate=V unit=U``: what the log says, read by a person
  (docs/progress.md, "What is right"); a key left out means the log does not say;
* ``# note: ...``: why the expectation is what it is, where that is not obvious.

:func:`score` reads every excerpt as ``orch diagnose LOG --json`` does
(:func:`orchestrator.wire.progress.read_log`) and counts step, loss and throughput (value
and unit) right; ``bench/progress.py`` prints it.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator.wire.progress import Reading, read_log

DATA = Path(__file__).resolve().parent.parent / "data" / "progress"
_HEADER = re.compile(r"^# (\w+): (.*)$")


@dataclass(frozen=True)
class Case:
    """One excerpt and what it says."""

    path: Path
    source: str
    expect: dict[str, str]
    lines: tuple[str, ...]
    framework: str = ""
    """``# framework:`` as written (held-out sets name the framework and its reader)."""

    @property
    def name(self) -> str:
        return f"{self.path.parent.name}/{self.path.stem}"


def load(root: Path = DATA) -> list[Case]:
    """Every excerpt under ``root``, sorted by path.

    Raises:
        ValueError: a file without ``# source:`` first or without ``# expect:``.
    """
    out = []
    for path in sorted(root.glob("*/*.log")):
        head: dict[str, str] = {}
        lines = path.read_text(encoding="utf-8").splitlines()
        body_at = 0
        for i, line in enumerate(lines):
            m = _HEADER.match(line)
            if m is None:
                body_at = i
                break
            head[m.group(1)] = m.group(2)
        if not lines or not lines[0].startswith("# source: ") or "expect" not in head:
            raise ValueError(f"{path}: needs '# source: URL' first and '# expect: ...'")
        expect = dict(kv.split("=", 1) for kv in head["expect"].split())
        out.append(
            Case(path, head["source"], expect, tuple(lines[body_at:]), head.get("framework", ""))
        )
    return out


def _same(want: str | None, got: float | None, rel: float) -> bool:
    if want is None or got is None:
        return want is None and got is None
    w = float(want)
    if w == got:  # inf == inf (inf - inf is nan)
        return True
    if math.isnan(w) or math.isnan(got):
        return math.isnan(w) and math.isnan(got)
    return abs(w - got) <= rel * max(abs(w), 1e-12)


def judge(case: Case, r: Reading) -> dict[str, bool]:
    """Whether ``r`` has the step, the loss and the throughput (value and unit) ``case`` says."""
    e = case.expect
    step = (int(e["step"]) if "step" in e else None) == r.step
    loss = _same(e.get("loss"), r.loss, 1e-6)
    rate = _same(e.get("rate"), r.rate, 1e-3) and e.get("unit") == (
        r.unit if r.rate is not None else None
    )
    return {"step": step, "loss": loss, "throughput": rate}


def score(cases: list[Case] | None = None) -> dict[str, object]:
    """``{"n", "step", "loss", "throughput", "misses": [...]}`` over the corpus."""
    cases = load() if cases is None else cases
    right = {"step": 0, "loss": 0, "throughput": 0}
    misses = []
    for c in cases:
        framework, r = read_log(c.lines)
        verdict = judge(c, r)
        for k, ok in verdict.items():
            right[k] += ok
        if not all(verdict.values()):
            bad = [k for k, ok in verdict.items() if not ok]
            misses.append(f"{c.name} ({framework or 'generic'}): {', '.join(bad)} -> {r}")
    return {"n": len(cases), **right, "misses": misses}


def score_cli(cases: list[Case], python: str = sys.executable) -> dict[str, object]:
    """:func:`score` read through ``orch diagnose LOG --json``'s ``progress`` object, one
    process per excerpt, exactly as a user would check a log (``{"n", "step", "loss",
    "throughput", "frameworks", "misses"}``; ``frameworks`` counts the reader named by each
    file's ``# framework: ... (reader: X)`` that the CLI reported). A ``loss=nan`` or
    ``loss=inf`` label is judged against ``loss_nonfinite``, JSON's ``loss`` being null then.

    Raises:
        subprocess.CalledProcessError: ``orch diagnose`` failed on an excerpt.
    """
    right = {"step": 0, "loss": 0, "throughput": 0, "frameworks": 0}
    misses = []
    with tempfile.TemporaryDirectory() as tmp:
        for c in cases:
            p = _diagnose(c, Path(tmp), python)
            rate = p["throughput"] or {}
            nonfinite = p.get("loss_nonfinite")  # JSON's null loss where it is nan or inf
            loss = p["loss"] if nonfinite is None else float(str(nonfinite))
            r = Reading(p["step"], p["total_steps"], loss, rate.get("value"), rate.get("unit"))
            verdict = judge(c, r)
            for k, ok in verdict.items():
                right[k] += ok
            want = re.search(r"\(reader: ([\w-]+)\)", c.framework)
            right["frameworks"] += bool(want and want.group(1) == (p["framework"] or "generic"))
            if not all(verdict.values()):
                bad = [k for k, ok in verdict.items() if not ok]
                misses.append(f"{c.name} ({p['framework'] or 'generic'}): {', '.join(bad)} -> {p}")
    return {"n": len(cases), **right, "misses": misses}


def _diagnose(case: Case, tmp: Path, python: str) -> dict[str, object]:
    """``orch diagnose --json``'s ``progress`` for the excerpt's body alone: the ``# expect:``
    header must not be read as a log line (it holds the answer)."""
    log = tmp / f"{case.path.parent.name}-{case.path.name}"
    log.write_text("\n".join(case.lines) + "\n", encoding="utf-8")
    out = subprocess.run(
        [python, "-m", "orchestrator.cli", "diagnose", "--json", str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    progress: dict[str, object] = json.loads(out)["progress"]
    return progress
