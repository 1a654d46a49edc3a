"""Transport faults: sshd killed during watch and check, 500 ms of added latency."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from orchestrator.monitor.observe import BACKOFF_CAP_S
from tests.reliability.conftest import ROOT, proxied

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RUNNING = re.compile(r" ct200 (running|starting)\b")
DEATH_WORDS = (" dead", " crashed", "silent-death", "CRITICAL:crashed")


@pytest.fixture(scope="module")
def running(fleet):
    fleet.scenario("healthy")
    fleet.agent_launch("ct200")
    return fleet


@pytest.mark.fault(
    area="transport",
    fault="sshd killed during `orch watch`",
    must="target shows 'unreachable since T', never dead/crashed; watch keeps running; "
    "back to its true state within the backoff cap after sshd returns",
)
def test_sshd_killed_during_watch(running, observe):
    w = running.watch("ct200")
    w.wait_line(RUNNING.search, 60)
    killed = time.monotonic()
    running.stop_sshd()
    try:
        t_down, line = w.wait_line(lambda s: " ct200 unreachable since " in s, 30, after=killed)
        observe(f"'unreachable since' shown {t_down - killed:.1f} s after the kill: {line[9:]!r}")
        time.sleep(3 * running.interval_s)  # a few more failed polls: still unreachable, no verdict
    finally:
        running.start_sshd()
    back = time.monotonic()
    t_up, line = w.wait_line(RUNNING.search, BACKOFF_CAP_S + 10, after=back)
    during = [s for t, s in w.lines if killed <= t <= t_up]
    assert not [s for s in during if any(word in s for word in DEATH_WORDS)], during
    assert w.proc.poll() is None, "watch exited"
    observe(
        f"back to {line.split()[2]!r} {t_up - back:.1f} s after sshd returned "
        f"(cap {BACKOFF_CAP_S:.0f} s); no dead/crashed line in between"
    )
    assert w.stop() == 0
    assert "Traceback" not in (w.proc.stderr.read() if w.proc.stderr else "")


@pytest.mark.fault(
    area="transport",
    fault="sshd killed during `orch check`",
    must="exit 3 UNKNOWN, every target 'unreachable' (never dead/crashed), no traceback; "
    "the next check after sshd returns shows the true state",
)
def test_sshd_killed_during_check(running, observe, tmp_path):
    db = tmp_path / "orch.db"
    cmd = [
        sys.executable,
        "-m",
        "orchestrator.cli",
        "-c",
        str(running.config),
        "check",
        "--json",
        "--db",
        str(db),
        "--timeout",
        "10",
    ]
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    time.sleep(0.4)  # mid-check: connecting or snapshotting
    running.stop_sshd()
    try:
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - started
    finally:
        running.start_sshd()
    doc = json.loads(out)
    states = {t["name"]: t["state"] for t in doc["targets"]}
    kinds = {f["kind"] for t in doc["targets"] for f in t["findings"]}
    assert "Traceback" not in err, err
    assert proc.returncode == 3, (proc.returncode, doc)
    assert set(states.values()) == {"unreachable"}, states
    assert not kinds & {"silent-death", "crashed"}, kinds
    observe(f"exit {proc.returncode} after {took:.1f} s, states {states}")
    back = time.monotonic()
    res = running.orch("check", "ct200", "--json", "--db", str(db), "--timeout", "20")
    after = {t["name"]: t["state"] for t in json.loads(res.stdout)["targets"]}
    assert after["ct200"] in ("running", "starting"), (res.returncode, res.stdout, res.stderr)
    observe(f"next check {time.monotonic() - back:.1f} s later: exit {res.returncode}, {after}")


@pytest.fixture
def delayed_config(running, tmp_path):
    """hosts.yaml pointing at a delay proxy in front of the sandbox sshd (known_hosts to match)."""
    with proxied(running, tmp_path / "delayed.yaml", delay_ms=500, connect_timeout_s=20) as path:
        yield path


@pytest.mark.fault(
    area="transport",
    fault="500 ms added latency each way (delaying TCP proxy; no netem here)",
    must="`orch check` completes inside its timeout (30 s) with the true state",
)
def test_check_completes_under_latency(running, delayed_config, observe, tmp_path):
    timeout_s = 30.0
    started = time.monotonic()
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "-c",
            str(delayed_config),
            "check",
            "ct200",
            "--json",
            "--db",
            str(tmp_path / "orch.db"),
            "--timeout",
            str(timeout_s),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    took = time.monotonic() - started
    doc = json.loads(res.stdout)
    state = doc["targets"][0]["state"]
    assert state in ("running", "starting"), (res.returncode, doc, res.stderr[-2000:])
    assert took < timeout_s + 5, took  # process start + the check's own deadline
    observe(
        f"check finished in {took:.1f} s (timeout {timeout_s:.0f} s, 1 s round trip): "
        f"exit {res.returncode}, ct200 {state}"
    )
