"""A hostile container: what the training code (or a non-root user) writes can never change a
verdict, reach the operator's terminal, or exhaust orch. Each probe runs on both observation
paths: from the Proxmox host (the host observer) and from inside (``observe: container``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEP_400 = "step=" + "9" * 400 + " loss=2.0"
ESC = "\x1b]0;pwned\x07\x1b]52;c;ZXZpbA==\x07\x1b[2J\x9b31m\u202e"
FAKE_TMUX = (
    "setsid python3 -c \"import ctypes, time; ctypes.CDLL(None).prctl(15, b'tmux: server'); "
    'time.sleep(600)" </dev/null >/dev/null 2>&1 &'
)
"""A process whose comm is ``tmux: server`` that is no tmux (its own session and group)."""


@pytest.fixture(scope="module", params=["host", "container"])
def path(fleet, request, tmp_path_factory):  # type: ignore[no-untyped-def]
    """The observation path under test; ``fleet.config`` points at its hosts.yaml."""
    if request.param == "host" and fleet.info.isolation != "lxc":
        pytest.skip("process-mode containers are observed from inside")
    original = fleet.config
    if request.param == "container":
        doc = yaml.safe_load(Path(original).read_text())
        for h in doc["hosts"].values():
            h["observe"] = "container"
        fleet.config = tmp_path_factory.mktemp("inside") / "hosts.yaml"
        fleet.config.write_text(yaml.safe_dump(doc, sort_keys=False))
    yield request.param
    fleet.config = original


def _check(fleet, tmp_path: Path) -> tuple[int, dict, str]:  # type: ignore[no-untyped-def]
    res = fleet.orch("check", "--json", "--db", str(tmp_path / "orch.db"), "ct200")
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.returncode != 70, res.stderr[-2000:]
    text = fleet.orch("check", "--db", str(tmp_path / "text.db"), "ct200")
    return res.returncode, json.loads(res.stdout)["targets"][0], text.stdout


def _kinds(t: dict) -> list[str]:
    return [f["kind"] for f in t["findings"]]


@pytest.mark.fault(
    area="hostile container",
    fault="a log line `step=` followed by 400 digits, in a live run and in one that exited 1",
    must="the live run stays running (never idle, never unreachable) with 'bad-metrics'; the "
    "exited one is crashed; on both paths",
)
def test_a_400_digit_step_changes_no_verdict(fleet, path, observe, tmp_path):  # type: ignore[no-untyped-def]
    fleet.scenario("idle")
    fleet.agent_launch("ct200", cmd=f"echo '{STEP_400}'; sleep 600")
    wait_for(lambda: "step=999" in (fleet.run_dir("ct200") / "train.log").read_text(), 20)
    rc, live, _ = _check(fleet, tmp_path)
    fleet.agent_launch("ct200", cmd=f"echo '{STEP_400}'; sleep 1; exit 1")
    wait_for(lambda: (fleet.run_dir("ct200") / "exit_status").exists(), 20, what="exit 1")
    rc2, dead, _ = _check(fleet, tmp_path / "x")
    observe(
        f"{path} path: live -> exit {rc}, state {live['state']!r}, {_kinds(live)}; "
        f"exited 1 -> exit {rc2}, state {dead['state']!r}"
    )
    assert live["reachable"] and live["state"] in ("running", "starting"), live
    assert "bad-metrics" in _kinds(live) and rc != 0, live
    assert dead["state"] == "crashed" and rc2 == 2, dead


@pytest.mark.fault(
    area="hostile container",
    fault="a silent death while another process of the container is named `tmux: server`",
    must="silent-death (state dead, exit 2): only the run's own tmux server counts; both paths",
)
def test_a_fake_tmux_server_does_not_hide_a_silent_death(fleet, path, observe, tmp_path):  # type: ignore[no-untyped-def]
    fleet.scenario("idle")
    trainer = 'i=0; while true; do i=$((i+1)); echo "step=$i loss=2.0"; sleep 0.5; done'
    fleet.agent_launch("ct200", cmd=f"{FAKE_TMUX} {trainer}")
    wait_for(lambda: "step=" in (fleet.run_dir("ct200") / "train.log").read_text(), 20)
    fleet.vanish("ct200")
    rc, t, _ = _check(fleet, tmp_path)
    deadline = time.monotonic() + 30
    while t["state"] != "dead" and time.monotonic() < deadline:
        rc, t, _ = _check(fleet, tmp_path)
    observe(f"{path} path: exit {rc}, state {t['state']!r}, findings {_kinds(t)}")
    assert t["state"] == "dead" and "silent-death" in _kinds(t) and rc == 2, t


@pytest.mark.fault(
    area="hostile container",
    fault="escape sequences (OSC 0 title, OSC 52 clipboard, clear screen, C1 CSI, bidi) in "
    "train.log, tee.err and a process name of the run",
    must="no ESC, BEL, C1 or bidi byte on stdout of check, watch --plain, status, runs, logs "
    "or the postmortem; shown as visible characters",
)
def test_escapes_from_the_container_never_reach_the_terminal(fleet, path, observe, tmp_path):  # type: ignore[no-untyped-def]
    fleet.scenario("idle")
    name = "\x1b[2Jpy\u202e"
    cmd = (
        f"printf '%s\\n' '{ESC} step=1 loss=2.0'; printf '%s' '{ESC}' > \"$ORCH_RUN_DIR/tee.err\"; "
        f'exec -a x python3 -c "import ctypes, time; ctypes.CDLL(None).prctl(15, {name.encode()!r}); '
        'time.sleep(600)"'
    )
    fleet.agent_launch("ct200", cmd=cmd)
    wait_for(lambda: "step=1" in (fleet.run_dir("ct200") / "train.log").read_text(), 20)
    outs = {"check": _check(fleet, tmp_path)[2]}
    for args in (("status", "ct200"), ("runs", "ct200"), ("logs", "ct200")):
        res = fleet.orch(*args)
        assert "Traceback" not in res.stderr and res.returncode != 70, res.stderr[-2000:]
        outs[args[0]] = res.stdout
    w = fleet.watch("ct200")
    try:
        outs["watch"] = w.wait_line(lambda line: " ct200 " in line, 30)[1]
    finally:
        w.stop()
    fleet.kill_trainer("ct200")
    wait_for(lambda: (fleet.run_dir("ct200") / "exit_status").exists(), 20)
    res = fleet.orch("postmortem", "ct200", "--out", str(tmp_path / "pm"))
    outs["postmortem"] = res.stdout
    bad = {k: [c for c in ("\x1b", "\x07", "\x9b", "\u202e") if c in v] for k, v in outs.items()}
    observe(
        f"{path} path: control bytes on stdout {bad}; logs shows "
        f"{outs['logs'].strip().splitlines()[-1][:60]!r}"
    )
    assert not any(bad.values()), bad
    # C0 was already replaced where the log is read (U+FFFD); C1 and bidi are shown escaped
    assert "\\x9b31m" in outs["logs"] and "\\u202e" in outs["logs"], outs["logs"][-300:]


@pytest.mark.fault(
    area="hostile container",
    fault="metrics.jsonl records whose `time` is in milliseconds and nanoseconds",
    must="the postmortem ends in seconds with the records dropped and said (bad data), never a "
    "timeline of centuries (it took 176 s and 5.6 GB before)",
)
def test_a_ms_timestamp_in_metrics_jsonl_is_dropped_not_drawn(fleet, path, observe, tmp_path):  # type: ignore[no-untyped-def]
    fleet.scenario("idle")
    recs = [
        {"time": time.time(), "step": 1, "tok_s": 100.0},
        {"time": time.time() * 1000, "step": 2, "tok_s": 100.0},
        {"time": time.time() * 1e9, "step": 3, "tok_s": 100.0},
    ]
    lines = "\\n".join(json.dumps(r) for r in recs)
    fleet.agent_launch(
        "ct200",
        cmd=f"printf '{lines}\\n' > \"$ORCH_RUN_DIR/metrics.jsonl\"; echo step=1 loss=2.0; exit 1",
    )
    wait_for(lambda: (fleet.run_dir("ct200") / "exit_status").exists(), 20)
    t0 = time.monotonic()
    res = fleet.orch("postmortem", "ct200", "--out", str(tmp_path / "pm"), timeout_s=120)
    took = time.monotonic() - t0
    report = next((tmp_path / "pm").rglob("report.md")).read_text()
    html = next((tmp_path / "pm").rglob("report.html")).stat().st_size
    observe(
        f"{path} path: exit {res.returncode} in {took:.1f} s, report.html {html} bytes, "
        f"{'bad data' in report and 'said' or 'not said'}"
    )
    assert "Traceback" not in res.stderr and res.returncode != 70, res.stderr[-2000:]
    assert took < 60 and html < 2_000_000, (took, html)
    assert "metrics.jsonl: 2 of 3 records dropped" in report
