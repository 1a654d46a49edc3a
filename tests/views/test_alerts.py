"""Alert deduplication (pure, table-driven) and delivery to a real HTTP server and command."""

from __future__ import annotations

import json
import socket
import sys

import pytest

from orchestrator.monitor import alerts
from orchestrator.monitor.history import AlertState
from orchestrator.wire.model import Finding, Severity

GHOST = Finding("ghost-utilization", Severity.CRITICAL, "ct200", "GPU 3 ghost", gpus=(3,))
STALL = Finding("stall", Severity.WARNING, "ct200", "no step for 700 s")
UNREACH = Finding("unreachable", Severity.WARNING, "ct200", "unreachable since 12:00:00")
HOUR = 3600.0


def state_of(
    f: Finding, *, notified: float | None = 0.0, severity: Severity | None = None
) -> AlertState:
    return AlertState(f.target, f.kind, f.gpus, severity or f.severity, f.summary, 0.0, notified)


CASES = [
    # (name, previous states, findings, held targets, now, expected events)
    ("new finding", [], [GHOST], [], 10.0, [("new", "ghost-utilization")]),
    ("still active, within renotify", [state_of(GHOST)], [GHOST], [], HOUR - 1, []),
    (
        "still active, renotify elapsed",
        [state_of(GHOST)],
        [GHOST],
        [],
        HOUR,
        [("repeat", "ghost-utilization")],
    ),
    (
        "severity changed",
        [state_of(GHOST, severity=Severity.WARNING)],
        [GHOST],
        [],
        10.0,
        [("changed", "ghost-utilization")],
    ),
    ("recovered", [state_of(GHOST)], [], [], 10.0, [("recovered", "ghost-utilization")]),
    (
        "undelivered earlier: announce as new",
        [state_of(GHOST, notified=None)],
        [GHOST],
        [],
        10.0,
        [("new", "ghost-utilization")],
    ),
    ("never announced, gone: nothing", [state_of(GHOST, notified=None)], [], [], 10.0, []),
    (
        "info findings are not alerts",
        [],
        [Finding("finished", Severity.INFO, "ct200", "done")],
        [],
        10.0,
        [],
    ),
    (
        "unreachable holds GPU findings",
        [state_of(GHOST)],
        [UNREACH],
        ["ct200"],
        10.0,
        [("new", "unreachable")],
    ),
    (
        "back online: unreachable recovers",
        [state_of(UNREACH), state_of(GHOST)],
        [GHOST],
        [],
        10.0,
        [("recovered", "unreachable")],
    ),
    (
        "other findings are independent",
        [state_of(GHOST)],
        [GHOST, STALL],
        [],
        10.0,
        [("new", "stall")],
    ),
]


@pytest.mark.parametrize(
    ("name", "prev", "findings", "held", "now", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_plan(name, prev, findings, held, now, expected):
    previous = {s.key: s for s in prev}
    notes, states = alerts.plan(
        previous, findings, checked=["ct200"], held=held, now=now, renotify_s=HOUR
    )
    assert [(n.event, n.kind) for n in notes] == expected
    # the planned state holds exactly the active (or held) findings
    active = {f.key for f in findings if f.severity >= Severity.WARNING}
    held_keys = {
        s.key for s in prev if s.target in held and s.kind not in alerts.CONNECTIVITY_KINDS
    }
    assert set(states) == active | held_keys


def test_targets_not_checked_are_left_alone():
    other = AlertState("ct999", "stall", (), Severity.WARNING, "x", 0.0, 0.0)
    notes, states = alerts.plan(
        {other.key: other}, [], checked=["ct200"], now=10.0, renotify_s=HOUR
    )
    assert notes == [] and states == {}


def test_settle_keeps_failed_announcements_for_the_next_check():
    prev = {state_of(STALL).key: state_of(STALL)}
    notes, planned = alerts.plan(prev, [GHOST], checked=["ct200"], now=10.0, renotify_s=HOUR)
    assert {n.event for n in notes} == {"new", "recovered"}
    kept = alerts.settle(prev, planned, notes, delivered=False)
    assert kept[GHOST.key].last_notified is None  # announce again next time
    assert kept[STALL.key] == prev[STALL.key]  # recovery not yet told
    again, _ = alerts.plan(kept, [GHOST], checked=["ct200"], now=20.0, renotify_s=HOUR)
    assert {(n.event, n.kind) for n in again} == {
        ("new", "ghost-utilization"),
        ("recovered", "stall"),
    }
    assert alerts.settle(prev, planned, notes, delivered=True) == planned


def test_webhook_receives_slack_text_and_structured_notifications(webhook):
    notes, _ = alerts.plan({}, [GHOST], checked=["ct200"], now=10.0, renotify_s=HOUR)
    body = alerts.payload(notes, status="CRITICAL", titles={"ghost-utilization": "Ghost GPU"})
    result = alerts.Notifier(webhook_url=webhook.url).deliver(body)
    assert result == [alerts.Delivery("webhook", True)]
    assert len(webhook.bodies) == 1
    got = webhook.bodies[0]
    assert got["text"].startswith("orch check: CRITICAL\nCRITICAL ct200 ghost-utilization [GPU 3]")
    assert got["notifications"][0]["kind"] == "ghost-utilization"
    assert got["notifications"][0]["gpus"] == [3]


def test_webhook_failure_is_retried_then_succeeds(webhook):
    webhook.statuses = [500, 503]
    sleeps: list[float] = []
    n = alerts.Notifier(webhook_url=webhook.url, _sleep=sleeps.append)
    assert n.deliver({"text": "x"}) == [alerts.Delivery("webhook", True)]
    assert webhook.requests == 3 and len(sleeps) == 2
    assert sleeps[1] > sleeps[0]  # exponential backoff


def test_webhook_failure_is_reported_not_raised(webhook):
    webhook.statuses = [500, 500, 500]
    n = alerts.Notifier(webhook_url=webhook.url, _sleep=lambda s: None)
    [d] = n.deliver({"text": "x"})
    assert not d.ok and d.detail == "HTTP 500 Internal Server Error"
    assert webhook.requests == 3


def test_refused_connection_is_reported_without_the_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    url = f"http://127.0.0.1:{port}/services/T000/SECRETPATH"
    [d] = alerts.Notifier(webhook_url=url, attempts=2, _sleep=lambda s: None).deliver({"text": "x"})
    assert not d.ok and "cannot connect" in d.detail and "SECRETPATH" not in d.detail


def test_command_hook_gets_the_json_on_stdin(tmp_path):
    out = tmp_path / "got.json"
    script = f"import sys; open({str(out)!r}, 'w').write(sys.stdin.read())"
    n = alerts.Notifier(command=[sys.executable, "-c", script])
    assert n.deliver({"text": "hello", "notifications": []}) == [alerts.Delivery("command", True)]
    assert json.loads(out.read_text())["text"] == "hello"


def test_failing_command_hook_is_reported(tmp_path):
    n = alerts.Notifier(
        command=[sys.executable, "-c", "import sys; sys.exit('boom')"], _sleep=lambda s: None
    )
    [d] = n.deliver({"text": "x"})
    assert not d.ok and d.detail == "exit status 1: boom"
    [d] = alerts.Notifier(command=[str(tmp_path / "nope")], attempts=1).deliver({"text": "x"})
    assert not d.ok and "nope" in d.detail


def test_secret_env_values_never_reach_the_payload(webhook, monkeypatch):
    """The environment is the input here: setenv plants a secret the way a shell would."""
    monkeypatch.setenv("HF_TOKEN", "hf_plantedsecret123")
    leaky = Finding(
        "log-signature",
        Severity.CRITICAL,
        "ct200",
        "auth failed for hf_plantedsecret123",
        evidence=("HTTP 401 with token hf_plantedsecret123", "WANDB key wb-9876543"),
    )
    notes, _ = alerts.plan({}, [leaky], checked=["ct200"], now=1.0, renotify_s=HOUR)
    secrets = alerts.environment_secrets([{"WANDB_API_KEY": "wb-9876543"}])
    alerts.Notifier(webhook_url=webhook.url).deliver(
        alerts.payload(notes, status="CRITICAL", secrets=secrets)
    )
    raw = json.dumps(webhook.bodies)
    assert "hf_plantedsecret123" not in raw and "wb-9876543" not in raw
    assert raw.count("***") == 4  # text, summary and both evidence lines
