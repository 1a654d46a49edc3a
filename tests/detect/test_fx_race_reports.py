"""fx-tracing-race against the public reports of the versions it really happened on.

The trainer's ``--fault fx-race`` stages the race on torch 2.13 (docs/trainer.md says why it no
longer happens there by itself); these tests pin the playbook to the reports instead: the
message torch raises (read from the installed torch's own source, not copied) is the one in
pytorch/pytorch#126024 (torch 2.4, threads) and in michaelfeil/infinity#583 (a real stack through
``torch/_dynamo/eval_frame.py``), and each of those excerpts is diagnosed as fx-tracing-race
first.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from orchestrator.playbooks.loader import load_playbooks
from orchestrator.playbooks.matching import match_log

LOGS = Path(__file__).parent.parent / "data" / "logs" / "fx-tracing-race"
REPORTS = {
    "pytorch-126024-threads.log": "https://github.com/pytorch/pytorch/issues/126024",
    "01.log": "https://github.com/michaelfeil/infinity/issues/583",
}


def _excerpt(name: str) -> list[str]:
    lines = (LOGS / name).read_text(encoding="utf-8").splitlines()
    assert lines[0] == f"# source: {REPORTS[name]}"
    return [x for x in lines if not x.startswith("# ")]


def test_the_reports_carry_the_message_torch_raises() -> None:
    torch = pytest.importorskip("torch")
    source = inspect.getsource(torch._dynamo.eval_frame)
    pieces = re.search(
        r'"(Detected that you are using FX to symbolically trace )"\s*"(a dynamo-optimized '
        r'function\. This is not supported at the moment\.)"',
        source,
    )
    assert pieces, "torch's eval_frame.py no longer raises the message this playbook matches"
    message = f"RuntimeError: {pieces.group(1)}{pieces.group(2)}"
    for name in REPORTS:
        assert any(line.strip() == message for line in _excerpt(name)), name


def test_the_real_stack_runs_through_dynamo_eval_frame() -> None:
    lines = _excerpt("01.log")
    frame = next(x for x in lines if "torch/_dynamo/eval_frame.py" in x)
    assert re.search(r'eval_frame\.py", line \d+, in _fn', frame)


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_each_report_is_diagnosed_as_the_race(name: str) -> None:
    matches = match_log(_excerpt(name), load_playbooks())
    assert matches and matches[0].id == "fx-tracing-race", [m.id for m in matches]
