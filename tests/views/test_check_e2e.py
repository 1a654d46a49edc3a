"""``orch check`` through the sandbox: real sshd, pct stand-in, fake NVML, SQLite, HTTP.

Each test leaves the fleet healthy with a fresh trainer on ct200 (the next test starts there).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def healthy(fleet):
    fleet.scenario("healthy")
    fleet.launch("ct200")
    yield fleet
    fleet.scenario("healthy")


def check(fleet, db, *args, timeout="20", **kw):
    proc = fleet.orch("check", "--db", str(db), "--timeout", timeout, *args, **kw)
    return proc.returncode, proc


def check_json(fleet, db, *args):
    rc, proc = check(fleet, db, "--json", *args)
    doc = json.loads(proc.stdout)
    return rc, doc


def test_healthy_fleet_is_ok(healthy, tmp_path):
    rc, doc = check_json(healthy, tmp_path / "orch.db")
    assert rc == 0, doc
    assert doc["status"] == "OK"
    states = {t["name"]: t["state"] for t in doc["targets"]}
    assert states == {"ct200": "running", "ct201": "idle"}
    rc, proc = check(healthy, tmp_path / "orch.db")
    assert rc == 0 and proc.stdout.startswith("ORCH OK - 2 targets")
    rc, plain = check(healthy, tmp_path / "orch.db", "--no-perfdata")
    assert rc == 0 and "|" not in plain.stdout, plain.stdout


def test_ghost_gpu_is_critical_and_alerts_once_then_recovers(healthy, tmp_path, webhook):
    db = tmp_path / "orch.db"
    assert check(healthy, db, "--notify", webhook.url)[0] == 0
    healthy.scenario("ghost")
    # the detector wants consecutive ghost samples: the history in SQLite supplies them
    rcs = []
    for _ in range(3):
        rc, doc = check_json(healthy, db, "--notify", webhook.url)
        rcs.append(rc)
        if rc == 2:
            break
    assert rcs[-1] == 2, (rcs, doc)
    ghost = [f for t in doc["targets"] for f in t["findings"] if f["kind"] == "ghost-utilization"]
    assert ghost and all(f["gpus"] == [3] and f["severity"] == "critical" for f in ghost)
    assert ghost[0]["playbook"] == "ghost-utilization" and ghost[0]["evidence"]
    assert len(webhook.bodies) == 1, webhook.bodies
    assert "ghost-utilization [GPU 3]" in webhook.bodies[0]["text"]
    # a second consecutive check with the finding still there: no second webhook
    assert check(healthy, db, "--notify", webhook.url)[0] == 2
    assert len(webhook.bodies) == 1
    healthy.scenario("healthy")
    rc, proc = check(healthy, db, "--notify", webhook.url)
    assert rc == 0, proc.stdout
    assert len(webhook.bodies) == 2
    recovery = webhook.bodies[1]
    assert {n["event"] for n in recovery["notifications"]} == {"recovered"}
    assert "RECOVERED ct200 ghost-utilization [GPU 3]" in recovery["text"]


def test_overlapping_checks_alert_once(healthy, tmp_path, webhook):
    db = tmp_path / "orch.db"
    healthy.scenario("ghost")
    check(healthy, db)  # one ghost sample in the history, no alert sinks
    cmd = [
        sys.executable,
        "-m",
        "orchestrator.cli",
        "-c",
        healthy.config,
        "check",
        "--db",
        str(db),
        "--notify",
        webhook.url,
        "--json",
    ]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [2, 2], outs
    assert len(webhook.bodies) == 1, webhook.bodies
    assert sorted(json.loads(o)["notified"] for o, _ in outs) == [0, 2]


def test_killed_trainer_is_crashed_critical(healthy, tmp_path):
    healthy.kill_trainer("ct200")
    exit_file = healthy.run_dir("ct200") / "exit_status"
    wait_for(exit_file.exists, 10, what="the wrapper to record the exit status")
    rc, doc = check_json(healthy, tmp_path / "orch.db")
    t = {t["name"]: t for t in doc["targets"]}["ct200"]
    assert rc == 2 and t["state"] == "crashed", doc
    assert any(f["kind"] == "crashed" and f["severity"] == "critical" for f in t["findings"])


def test_silent_death_is_dead_critical(healthy, tmp_path):
    healthy.vanish("ct200")
    rc, doc = check_json(healthy, tmp_path / "orch.db")
    t = {t["name"]: t for t in doc["targets"]}["ct200"]
    assert rc == 2 and t["state"] == "dead", doc
    assert [f["kind"] for f in t["findings"]][0] == "silent-death"


def test_every_target_unreachable_is_unknown(healthy, tmp_path):
    healthy.stop_sshd()
    try:
        rc, proc = check(healthy, tmp_path / "orch.db", timeout="10")
        assert rc == 3, proc.stdout + proc.stderr
        lines = proc.stdout.splitlines()
        text, _, perf = lines[0].partition(" | ")
        assert text == "ORCH UNKNOWN - 2 targets: 0 critical, 2 warning, 2 unreachable"
        assert "'targets_unknown'=2;;;0" in perf.split()
        assert "|" not in "\n".join(lines[1:])  # unreachable: no per-target data
        assert all(" unreachable" in line for line in lines[1:3])
        assert "silent-death" not in proc.stdout and "crashed" not in proc.stdout
        rc, doc = check_json(healthy, tmp_path / "orch.db", "--timeout", "10")
        assert rc == 3 and {t["state"] for t in doc["targets"]} == {"unreachable"}
    finally:
        healthy.start_sshd()
    assert check(healthy, tmp_path / "orch.db")[0] == 0


def test_unknown_target_is_unknown_with_one_line(healthy, tmp_path):
    rc, proc = check(healthy, tmp_path / "orch.db", "nosuch")
    assert rc == 3
    assert proc.stdout.startswith("ORCH UNKNOWN - ") and "nosuch" in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("path", ["host", "container"])
def test_the_first_check_of_a_ghost_gpu_is_critical(healthy, tmp_path, path):
    """No history yet: the check samples the container twice (PAIR_GAP_S apart), on either
    path, so the ghost detector's two consecutive samples come from one run; both are kept
    for the next check. On the host path the second call reads the kernel log from the same
    cursor: a host-wide Xid logged before the check shows once, not lost, not twice."""
    from pathlib import Path

    from orchestrator.config.inventory import load_inventory
    from orchestrator.monitor.history import History
    from orchestrator.sandbox import kernel

    if path == "host" and healthy.info.isolation != "lxc":
        pytest.skip("process-mode containers are observed from inside")
    db = tmp_path / "orch.db"
    config = healthy.config_for(path, tmp_path)
    inventory = load_inventory(Path(config))
    healthy.scenario("ghost")
    stray = f"NVRM: Xid (PCI:0000:ee:00): 79, pid=1, name=stray-{path}, GPU has fallen off the bus."
    kernel.append_kernel_line(healthy.state_dir, stray)
    rc, proc = check(healthy, db, "--json", config=config)
    doc = json.loads(proc.stdout)
    assert rc == 2, doc
    ct200 = next(t for t in doc["targets"] if t["name"] == "ct200")
    assert ct200["observed_from"] == path, ct200
    ghost = [f for f in ct200["findings"] if f["kind"] == "ghost-utilization"]
    assert ghost and ghost[0]["severity"] == "critical" and ghost[0]["gpus"] == [3]
    host_xids = [f for h in doc["hosts"] for f in h["findings"] if f["kind"] == "xid"]
    evidence = [line for f in host_xids for line in f["evidence"] if f"name=stray-{path}" in line]
    assert len(evidence) == 1, doc["hosts"]  # the host's own, once (the pair read it twice)
    with History.open(db, inventory=inventory) as h:
        assert len(h.snapshots("ct200")) == 2
    rc, proc = check(healthy, db, "--json", config=config)  # fresh history: one more sample
    assert rc == 2, proc.stdout
    again = json.loads(proc.stdout)["hosts"]
    assert not [
        f for h in again for f in h["findings"] if f"name=stray-{path}" in " ".join(f["evidence"])
    ]
    with History.open(db, inventory=inventory) as h:
        assert len(h.snapshots("ct200")) == 3
