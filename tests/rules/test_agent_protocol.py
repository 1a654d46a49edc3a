"""The agent's commands are typed requests (orchestrator/wire/requests.py): every command but
the wrapper's recorder has one, callers never build agent argv nor read its JSON, and the
agent's argparse reads what each request writes, defaults included."""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.__main__ import build_parser, gpu_deadline_default
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


def test_no_caller_outside_remote_decodes_an_agent_answer() -> None:
    """``Target.call`` returns the request's answer type; nobody else reads the agent's JSON
    (``preflight`` parses its own ``python -c`` import check with ``parse_document``)."""
    readers = {"read_reply", "parse_answer", "parse_document"}
    found = sorted(
        f"{p.relative_to(ROOT)}:{node.lineno} {alias.name}"
        for p in sorted((ROOT / "orchestrator").rglob("*.py"))
        if not str(p.relative_to(ROOT)).startswith(OWNERS)
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module == "orchestrator.remote.target"
        for alias in node.names
        if alias.name in readers
    )
    allowed = [f for f in found if f.startswith("orchestrator/lifecycle/preflight.py:")]
    assert [f for f in found if f not in allowed] == [], "use Target.call(request) instead"
    assert [f.split()[-1] for f in allowed] == ["parse_document"]


SAMPLES: dict[type, rq.AgentRequest[Any]] = {
    rq.LaunchRequest: rq.LaunchRequest("/w", "true"),
    rq.StopRequest: rq.StopRequest("/w"),
    rq.RunsRequest: rq.RunsRequest("/w"),
    rq.RunRequest: rq.RunRequest("/w", run_id="r1"),
    rq.LogsRequest: rq.LogsRequest("/w"),
    rq.EvidenceRequest: rq.EvidenceRequest("/w"),
    rq.SnapshotRequest: rq.SnapshotRequest("/w"),
    rq.StreamRequest: rq.StreamRequest("/w"),
    rq.FactsRequest: rq.FactsRequest("/w"),
    rq.ProbeRequest: rq.ProbeRequest(),
    rq.HostObserveRequest: rq.HostObserveRequest("[]"),
    rq.HostStreamRequest: rq.HostStreamRequest("[]"),
}
"""Each request with its required fields only."""

OFF_DEFAULT: list[rq.AgentRequest[Any]] = [
    rq.LaunchRequest(
        "/w",
        "python t.py",
        "s2",
        run_id="r1",
        gpus="0,1",
        force=True,
        grace_s=5.0,
        settle_s=0.5,
        record_interval_s=3.0,
        no_recorder=True,
        orch_version="9",
        target="ct",
        env_from="r0",
        carry_from="r0",
        env_stdin=True,
    ),
    rq.StopRequest("/w", run_id="r1", grace_s=3.0, by="orch stop by u@h"),
    rq.RunsRequest("/w", "s2"),
    rq.RunRequest("/w", "s2", run_id="r1", tail=30),
    rq.LogsRequest(
        "/w", run_id="r1", lines=7, offset=9, max_bytes=10, follow=True, interval_s=0.25
    ),
    rq.EvidenceRequest(
        "/w", "s", run_id="r", log_lines=1, pane_lines=2, gpu_samples=3, metric_records=4
    ),
    rq.SnapshotRequest(
        "/w",
        "s2",
        target="ct",
        tail_lines=3,
        offset=5,
        run_id="r1",
        log_patterns='{"loss": "l=(\\S+)"}',
        socket_name="n",
        socket_path="/p",
        gpu_deadline_s=7.5,
        gpu_source="nvidia-smi",
    ),
    rq.StreamRequest(
        "/w",
        "s2",
        target="ct",
        tail_lines=3,
        offset=5,
        run_id="r1",
        log_patterns="{}",
        socket_name="n",
        socket_path="/p",
        gpu_deadline_s=7.5,
        gpu_source="nvml",
        interval_s=0.5,
        count=3,
        ignore_stdin=True,
    ),
    rq.FactsRequest(
        "/w",
        torch=True,
        torch_timeout_s=5.0,
        socket_name="n",
        socket_path="/p",
        gpu_deadline_s=3.0,
        gpu_source="nvml",
    ),
    rq.ProbeRequest(
        host="pve1",
        vmids=(200, 201),
        since=12.5,
        timeout_s=4.0,
        proc_root="/hp",
        previous_boot=True,
        gpu_deadline_s=3.0,
        gpu_source="auto",
    ),
    rq.HostObserveRequest(
        '[{"name": "ct"}]',
        host="pve1",
        since=1.5,
        cursor="s=1",
        timeout_s=3.0,
        state="/s.json",
        gpu_deadline_s=3.0,
        gpu_source="nvml",
    ),
    rq.HostStreamRequest(
        "[]",
        host="pve1",
        since=1.5,
        cursor="s=1",
        timeout_s=3.0,
        state="/s.json",
        gpu_deadline_s=3.0,
        gpu_source="nvml",
        interval_s=0.5,
        count=2,
        ignore_stdin=True,
    ),
]
"""Each request with every field off its default."""

NOT_REQUESTED = {
    "record": "started by the run's wrapper in the container (agent/wrapper.py), not by orch"
}
"""Agent commands no operator code sends."""

RENAMED = {"vmids": "vmid"}
"""Fields whose argparse ``dest`` is not the field's name less its ``_s``."""


def _dest(field: str) -> str:
    """The argparse ``dest`` of a request field (``grace_s`` is ``--grace``, ``vmids`` ``--vmid``)."""
    return RENAMED.get(field, field[:-2] if field.endswith("_s") else field)


def _agent_value(req: Any, field: str) -> Any:
    """What the agent should parse for ``field``: the value, a list for a tuple, and for an
    unset GPU deadline the agent's own default (2 s or its env)."""
    value = getattr(req, field)
    if field == "gpu_deadline_s" and value is None:
        return gpu_deadline_default()
    return list(value) if isinstance(value, tuple) else value


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_agent_command_has_a_request_class_and_an_answer_type() -> None:
    assert set(SAMPLES) == set(rq.REQUESTS)
    assert {cls.command for cls in rq.REQUESTS} | set(NOT_REQUESTED) == set(_subcommands())
    for cls, req in SAMPLES.items():
        assert req.to_argv()[0] == cls.command, cls.__name__
        assert isinstance(cls.answer, type) and hasattr(cls, "read"), cls.__name__
    assert {type(r) for r in OFF_DEFAULT} == set(rq.REQUESTS)


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda c: c.__name__)
def test_the_agent_parses_each_request_with_the_same_defaults(cls: type) -> None:
    """Parse the plain request's argv: every field reads back as its default, so the parser's
    defaults and the request's are one (a drifted default or a renamed flag fails)."""
    parser = build_parser()
    req = SAMPLES[cls]
    ns = vars(parser.parse_args(req.to_argv()))
    for f in dataclasses.fields(cls):
        assert ns[_dest(f.name)] == _agent_value(req, f.name), f.name
    fields = dataclasses.fields(cls)
    plain = cls(
        **{f.name: getattr(req, f.name) for f in fields if f.default is dataclasses.MISSING}
    )
    required = [
        a
        for f in fields
        if f.default is dataclasses.MISSING
        for a in (f"--{f.name}", str(getattr(req, f.name)))
    ]
    bare = vars(parser.parse_args([cls.command, *required]))
    for f in fields:
        assert bare[_dest(f.name)] == _agent_value(plain, f.name), f"{cls.__name__}.{f.name}"


@pytest.mark.parametrize("req", OFF_DEFAULT, ids=lambda r: type(r).__name__)
def test_values_off_the_default_reach_the_agent(req: Any) -> None:
    ns = vars(build_parser().parse_args(req.to_argv()))
    for f in dataclasses.fields(req):
        assert ns[_dest(f.name)] == _agent_value(req, f.name), f.name
        assert f.default is dataclasses.MISSING or getattr(req, f.name) != f.default, f.name
