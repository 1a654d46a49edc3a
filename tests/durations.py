"""Writes tests/durations.txt, the order in which ``./dev test`` hands modules to its xdist
workers (tests/conftest.py: the longest first), from the JUnit XML of a run::

    ./dev test --junitxml=/tmp/junit.xml   # or any pytest run of the modules to rank
    python -m tests.durations /tmp/junit.xml > tests/durations.txt

A module's seconds are the sum of its tests' ``time`` (pytest's default
``junit_duration_report = total``: setup, call and teardown), its fixtures' set-up counted
with the test that first needed it. Only the order matters; modules absent from the XML are
estimated (5 s an end-to-end test).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

TOP = 60
"""Modules listed: the longest; the rest are short enough for the estimate."""


def module_totals(xml_text: str) -> dict[str, float]:
    """``tests/x/test_y.py`` -> seconds, from JUnit XML (``classname`` ``tests.x.test_y``, or
    ``tests.x.test_y.Class``; doctests of ``orchestrator`` modules are left out).

    >>> doc = ('<testsuites><testsuite><testcase classname="tests.a.test_b" name="t" time="2.5"/>'
    ...        '<testcase classname="tests.a.test_b.C" name="u" time="1"/></testsuite></testsuites>')
    >>> module_totals(doc)
    {'tests/a/test_b.py': 3.5}
    """
    out: dict[str, float] = defaultdict(float)
    for case in ET.fromstring(xml_text).iter("testcase"):
        parts = case.get("classname", "").split(".")
        while parts and not parts[-1].startswith("test_"):
            parts.pop()  # a class name after the module
        if len(parts) < 2 or parts[0] != "tests":
            continue
        out["/".join(parts) + ".py"] += float(case.get("time") or 0.0)
    return dict(out)


def render(totals: dict[str, float], source: str) -> str:
    """The durations.txt text: a header, then ``SECONDS PATH`` lines, longest first."""
    head = (
        "# Seconds each test module took in one run (tests/durations.py; source: "
        f"{source}).\n# Only the order counts: ./dev test hands the longest modules out first.\n"
    )
    rows = sorted(totals.items(), key=lambda kv: -kv[1])[:TOP]
    return head + "".join(f"{s:.0f} {m}\n" for m, s in rows)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.durations JUNIT.xml > tests/durations.txt", file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        text = path.read_text()
        totals = module_totals(text)
    except (OSError, ET.ParseError) as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(render(totals, path.name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
