"""The agent's run commands are typed requests (orchestrator/wire/requests.py): callers never
build agent argv, and the agent's argparse reads what each request writes, defaults included."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from orchestrator.agent.__main__ import build_parser
from orchestrator.wire import requests as rq

ROOT = Path(__file__).resolve().parents[2]
OWNERS = ("orchestrator/remote/", "orchestrator/wire/")
"""The only packages that may turn requests into argv."""


def _argv_literals(text: str) -> list[int]:
    """Lines where ``.agent(`` or ``agent_argv(`` gets a list written in place (``[...]``,
    ``[*a, "--x"]``, a comprehension): argv assembled by the caller."""
    lines = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name in ("agent", "agent_argv", "run_agent") and any(
            isinstance(a, (ast.List, ast.ListComp, ast.BinOp)) for a in node.args
        ):
            lines.append(node.lineno)
    return lines


def test_the_scan_sees_a_caller_built_argv() -> None:
    assert _argv_literals('tgt.agent(["stop", "--workdir", w])\n') == [1]
    assert _argv_literals('t.agent([*args, "--env-stdin"], stdin=b"")\n') == [1]
    assert _argv_literals('t.agent(["runs"] + more)\n') == [1]
    assert _argv_literals("t.call(StopRequest(w))\nt.agent(args)\n") == []


def test_no_caller_outside_remote_and_wire_builds_agent_argv() -> None:
    found = {
        f"{p.relative_to(ROOT)}:{n}"
        for p in sorted((ROOT / "orchestrator").rglob("*.py"))
        if not str(p.relative_to(ROOT)).startswith(OWNERS)
        for n in _argv_literals(p.read_text())
    }
    assert not found, f"build a request from orchestrator/wire/requests.py instead: {sorted(found)}"


REQUESTS = {
    rq.LaunchRequest: rq.LaunchRequest("/w", "true"),
    rq.StopRequest: rq.StopRequest("/w"),
    rq.RunsRequest: rq.RunsRequest("/w"),
    rq.LogsRequest: rq.LogsRequest("/w"),
    rq.EvidenceRequest: rq.EvidenceRequest("/w"),
}


def _dest(field: str) -> str:
    """The argparse ``dest`` of a request field (``grace_s`` is ``--grace``, ``settle_s`` ``--settle``)."""
    return field[:-2] if field.endswith("_s") else field


@pytest.mark.parametrize("cls", list(REQUESTS), ids=lambda c: c.__name__)
def test_the_agent_parses_each_request_with_the_same_defaults(cls: type) -> None:
    """Parse the plain request's argv: every field reads back as its default, so the parser's
    defaults and the request's are one (a drifted default or a renamed flag fails)."""
    parser = build_parser()
    ns = vars(parser.parse_args(REQUESTS[cls].to_argv()))
    for f in dataclasses.fields(cls):
        assert ns[_dest(f.name)] == getattr(REQUESTS[cls], f.name), f.name
    bare = vars(parser.parse_args([REQUESTS[cls].to_argv()[0], "--workdir", "/w",
                                   *(["--cmd", "true"] if cls is rq.LaunchRequest else [])]))  # fmt: skip
    for f in dataclasses.fields(cls):
        assert bare[_dest(f.name)] == rq.default(cls, f.name) or f.default is dataclasses.MISSING


def test_values_off_the_default_reach_the_agent() -> None:
    parser = build_parser()
    req = rq.LaunchRequest("/w", "python t.py", "s2", run_id="r1", gpus="0,1", force=True,
                           grace_s=5.0, settle_s=0.5, record_interval_s=3.0, no_recorder=True,
                           orch_version="9", target="ct", env_from="r0", carry_from="r0",
                           env_stdin=True)  # fmt: skip
    ns = vars(parser.parse_args(req.to_argv()))
    assert all(ns[_dest(f.name)] == getattr(req, f.name) for f in dataclasses.fields(req))
    logs = rq.LogsRequest("/w", run_id="r1", lines=7, offset=9, max_bytes=10, follow=True,
                          interval_s=0.25)  # fmt: skip
    ns = vars(parser.parse_args(logs.to_argv()))
    assert all(ns[_dest(f.name)] == getattr(logs, f.name) for f in dataclasses.fields(logs))
    ev = rq.EvidenceRequest("/w", "s", run_id="r", log_lines=1, pane_lines=2, gpu_samples=3,
                            metric_records=4)  # fmt: skip
    ns = vars(parser.parse_args(ev.to_argv()))
    assert all(ns[_dest(f.name)] == getattr(ev, f.name) for f in dataclasses.fields(ev))
