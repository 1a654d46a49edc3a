"""The diagnosis corpus: real log excerpts under ``tests/data/logs/<playbook>/*.log``.

Each file starts with a header of ``# key: value`` lines, then the excerpt, verbatim:

* ``# source: URL`` (required, first): the public thread the excerpt was copied from;
* ``# case: clear | hard (why) | healthy (why)``: ``clear`` when the failure's signature is
  plainly in the excerpt, ``hard`` when the log is cut short or shows the failure in
  another form (a stack without its message, a generic symptom); absent means ``clear``,
  or ``healthy`` under ``healthy/``;
* ``# family: NAME (detail)``: which failure family the case stands for
  (:data:`FAMILIES`); optional for the cases that predate it;
* any other ``# ...`` line before the excerpt is a note.

The folder names the playbook the excerpt must be diagnosed as (best match); nothing may
match under ``healthy/``. :func:`score` is the figure ``bench/diagnose.py`` reports.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

LOGS = Path(__file__).resolve().parent.parent / "data" / "logs"
HEALTHY = "healthy"
FAMILIES = ("launchers", "pytorch-versions", "stack-only", "divergence", "accelerate", "truncated")
"""The failure families: one failure as each launcher/framework/shell reports it; old and new
PyTorch wordings (``stack-only``: failures visible only as a call stack); training that
diverged; transformers asking for accelerate; logs that end before the cause."""
_HEADER = re.compile(r"^# (\w+): (.*)$")


@dataclass(frozen=True)
class Case:
    """One excerpt: where from, what it must be diagnosed as (``None``: nothing), its lines."""

    path: Path
    source: str
    kind: str  # clear | hard | healthy
    family: str | None
    expected: str | None
    lines: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}"

    @property
    def project(self) -> str:
        """``owner/repo`` of the source thread (the path for a local source).

        >>> Case(Path("x"), "https://github.com/NVIDIA/apex/issues/318", "clear", None, None, ()).project
        'NVIDIA/apex'
        """
        m = re.match(r"https://github\.com/([^/]+/[^/#\s]+)", self.source)
        return m.group(1) if m else self.source.split()[0]


def parse_case(path: Path) -> Case:
    """Read one corpus file: header, then the excerpt lines (without their newlines)."""
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    header: dict[str, str] = {}
    n = 0
    while n < len(lines) and lines[n].startswith("# "):
        m = _HEADER.match(lines[n])
        if m:
            header.setdefault(m.group(1), m.group(2))
        n += 1
    healthy = path.parent.name == HEALTHY
    kind = header.get("case", HEALTHY if healthy else "clear").split()[0]
    family = header["family"].split()[0] if "family" in header else None
    return Case(
        path=path,
        source=header.get("source", ""),
        kind=kind,
        family=family,
        expected=None if healthy else path.parent.name,
        lines=tuple(lines[n:]),
    )


def load_corpus(root: Path = LOGS) -> list[Case]:
    """Every case, sorted by folder and file name."""
    return [parse_case(p) for p in sorted(root.glob("*/*.log"))]


def score(
    cases: Sequence[Case], diagnose: Callable[[Sequence[str]], list[str]]
) -> dict[str, object]:
    """Top-1 accuracy on clear and hard cases, and false matches on healthy ones.

    ``diagnose`` maps an excerpt's lines to playbook ids, best first. Percentages are
    rounded to 0.1; ``misses`` names each wrong case as ``folder/file: got``.
    """
    tally = {"clear": [0, 0], "hard": [0, 0], HEALTHY: [0, 0]}
    misses: list[str] = []
    for case in cases:
        got = diagnose(case.lines)
        bucket = tally[case.kind if case.kind in tally else "clear"]
        bucket[1] += 1
        ok = not got if case.expected is None else bool(got) and got[0] == case.expected
        bucket[0] += ok
        if not ok:
            misses.append(f"{case.name}: {got[:3] or 'nothing'}")

    def pct(k: str) -> float:
        right, total = tally[k]
        return round(100.0 * right / total, 1) if total else 100.0

    return {
        "clear_top1_pct": pct("clear"),
        "clear_cases": tally["clear"][1],
        "hard_top1_pct": pct("hard"),
        "hard_cases": tally["hard"][1],
        "healthy_false_matches": tally[HEALTHY][1] - tally[HEALTHY][0],
        "healthy_cases": tally[HEALTHY][1],
        "misses": misses,
    }
