"""Container and run faults: pct stop, tmux server killed, SIGKILL (+ OOM killer), log gone,
disk full, agent killed mid-stream. Verdicts are read from ``orch check --json`` and
``orch watch --plain``, as an operator would see them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.monitor.observe import BACKOFF_CAP_S
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def check(fleet, db: Path, *names: str, timeout_s: float = 20.0) -> tuple[int, dict]:
    res = fleet.orch("check", "--json", "--db", str(db), "--timeout", str(timeout_s), *names)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, json.loads(res.stdout)


def target(doc: dict, name: str = "ct200") -> dict:
    return {t["name"]: t for t in doc["targets"]}[name]


def kinds(t: dict) -> list[str]:
    return [f["kind"] for f in t["findings"]]


@pytest.fixture
def fresh_run(fleet):
    """A live fake trainer on ct200 (container started, healthy GPUs)."""
    fleet.start_container("ct200")
    fleet.scenario("idle")
    run_id = fleet.agent_launch("ct200")
    wait_for(
        lambda: "step=" in (fleet.run_dir("ct200") / "train.log").read_text(),
        20,
        what="the trainer's first step",
    )
    yield run_id
    fleet.start_container("ct200")


@pytest.mark.fault(
    area="container and run",
    fault="`pct stop` of the container during a run",
    must="'container-stopped' (state 'stopped'), distinct from a dead run: never silent-death",
)
def test_pct_stop_is_container_stopped(fleet, fresh_run, observe, tmp_path):
    db = tmp_path / "orch.db"
    assert check(fleet, db, "ct200")[1]["targets"][0]["state"] in ("running", "starting")
    fleet.stop_container("ct200")
    rc, doc = check(fleet, db, "ct200")
    t = target(doc)
    observe(
        f"exit {rc}, state {t['state']!r}, findings {kinds(t)}: "
        f"{[f['summary'][:80] for f in t['findings']]}"
    )
    assert "silent-death" not in kinds(t)
    assert t["state"] == "stopped" and "container-stopped" in kinds(t), t
    status = json.loads(fleet.orch("status", "ct200", "--json").stdout)[0]
    w = fleet.watch("ct200")
    try:
        _, line = w.wait_line(re.compile(r" ct200 (stopped|unreachable)\b").search, 30)
    finally:
        w.stop()
    observe(f"orch status: {status['state']!r}; orch watch: {line.strip()[:80]!r}")
    assert status["state"] == "stopped" and " ct200 stopped" in line, (status, line)


@pytest.mark.fault(
    area="container and run",
    fault="tmux server killed (SIGKILL) under a running run, the wrapper left alive",
    must="the run is reported dead: 'crashed' with 129 (SIGHUP) when the wrapper outlives the "
    "server long enough to record it, else silent-death; never 'unreachable' or 'running'",
)
def test_tmux_server_killed_is_a_death(fleet, fresh_run, observe, tmp_path):
    db = tmp_path / "orch.db"
    check(fleet, db, "ct200")
    pid = fleet.kill_tmux("ct200")
    exit_file = fleet.run_dir("ct200") / "exit_status"
    wait_for(
        lambda: not _alive_pid(fleet, fleet.run_dir("ct200") / "wrapper.pid"),
        10,
        what="the wrapper to go with its pane",
    )
    rc, doc = check(fleet, db, "ct200")
    t = target(doc)
    status = exit_file.read_text().split()[0] if exit_file.exists() else "missing"
    observe(
        f"tmux server {pid} killed: check exit {rc}, state {t['state']!r}, findings "
        f"{kinds(t)}, exit_status file {status}"
    )
    expected = ("crashed", "crashed") if status == "129" else ("dead", "silent-death")
    assert (t["state"], kinds(t)[0]) == expected, t
    assert rc == 2


def _alive_pid(fleet, pidfile: Path) -> bool:
    """Whether the process whose container PID ``pidfile`` holds still runs in ct200."""
    from orchestrator.agent.procs import alive

    try:
        host = fleet.info.host_pid("ct200", int(pidfile.read_text().split()[0]))
    except (OSError, ValueError):
        return False
    return host is not None and alive(host)


@pytest.mark.fault(
    area="container and run",
    fault="tmux server, wrapper and trainer SIGKILLed together (nothing left to record an exit)",
    must="silent death: state 'dead', silent-death finding first, CRITICAL (exit 2)",
)
def test_everything_killed_is_silent_death(fleet, fresh_run, observe, tmp_path):
    db = tmp_path / "orch.db"
    check(fleet, db, "ct200")
    fleet.vanish("ct200")
    rc, doc = check(fleet, db, "ct200")
    t = target(doc)
    observe(
        f"check exit {rc}, state {t['state']!r}, findings {kinds(t)}: "
        f"{t['findings'][0]['summary'][:90] if t['findings'] else ''}"
    )
    assert t["state"] == "dead" and kinds(t)[0] == "silent-death", t
    assert rc == 2


@pytest.mark.fault(
    area="container and run",
    fault="silent death: the postmortem",
    must="`orch postmortem` names the silent death (no session, no process, no exit status)",
)
def test_silent_death_postmortem_says_so(fleet, fresh_run, observe, tmp_path):
    fleet.vanish("ct200")
    res = fleet.orch("postmortem", "ct200", "--json", "--out", str(tmp_path / "pm"))
    assert "Traceback" not in res.stderr, res.stderr
    doc = json.loads(res.stdout)
    verdict = doc["verdict"]
    observe(
        f"orch postmortem: exit {res.returncode}, verdict {verdict.get('kind')!r}: "
        f"{str(verdict.get('summary', ''))[:100]}"
    )
    assert res.returncode == 0 and verdict["kind"] == "silent-death", doc


@pytest.mark.fault(
    area="container and run",
    fault="trainer SIGKILLed (no kernel log line)",
    must="'crashed', exit status 137 (SIGKILL) recorded by the wrapper",
)
def test_trainer_sigkill_is_crashed_137(fleet, fresh_run, observe, tmp_path):
    fleet.kill_trainer("ct200", signal.SIGKILL)
    exit_file = fleet.run_dir("ct200") / "exit_status"
    wait_for(exit_file.exists, 10, what="the wrapper's exit_status")
    rc, doc = check(fleet, tmp_path / "orch.db", "ct200")
    t = target(doc)
    crashed = [f for f in t["findings"] if f["kind"] == "crashed"]
    observe(
        f"exit_status file {exit_file.read_text().split()[0]}; check exit {rc}, state "
        f"{t['state']!r}: {crashed[0]['summary'][:100] if crashed else kinds(t)}"
    )
    assert t["state"] == "crashed" and crashed, t
    assert "exit status 137" in crashed[0]["summary"] and "SIGKILL" in crashed[0]["summary"]
    assert "oom-killer" not in kinds(t)


@pytest.mark.fault(
    area="container and run",
    fault="trainer SIGKILLed with an OOM-killer line in the host kernel log",
    must="verdict 'oom-killer': the crash is explained by the kernel OOM killer",
)
def test_trainer_sigkill_with_oom_line_is_oom_killer(fleet, fresh_run, observe, tmp_path):
    """The kernel names the victim by its host PID (no task_memcg line here): the host
    observer saw that PID among the run's processes (NSpid) at the check before."""
    db = tmp_path / "orch.db"
    check(fleet, db, "ct200")
    pgid = int((fleet.run_dir("ct200") / "pgid").read_text().split()[0])
    victim = fleet.info.host_pid("ct200", pgid)  # the kernel names the host PID, as on Proxmox
    fleet.kernel_line(
        f"Out of memory: Killed process {victim} (python3) total-vm:53312244kB, "
        "anon-rss:31451456kB, file-rss:74816kB, shmem-rss:12296kB, UID:0 pgtables:69068kB "
        "oom_score_adj:0"
    )
    fleet.kill_trainer("ct200", signal.SIGKILL)
    wait_for((fleet.run_dir("ct200") / "exit_status").exists, 10, what="the exit_status")
    rc, doc = check(fleet, db, "ct200")
    t = target(doc)
    crashed = [f for f in t["findings"] if f["kind"] == "crashed"]
    oom = [f for f in t["findings"] if f["kind"] == "oom-killer"]
    observe(
        f"findings {kinds(t)}; crashed playbook {crashed[0]['playbook'] if crashed else None!r}; "
        f"{oom[0]['summary'][:90] if oom else 'no oom-killer finding'}"
    )
    assert oom and oom[0]["severity"] == "critical", t
    assert crashed and crashed[0]["playbook"] == "oom-killer", crashed


@pytest.mark.fault(
    area="container and run",
    fault="train.log deleted during a run",
    must="flagged (log-missing), and the agent keeps answering",
)
def test_log_deleted_is_flagged_agent_keeps_working(fleet, fresh_run, observe, tmp_path):
    db = tmp_path / "orch.db"
    log = fleet.run_dir("ct200") / "train.log"
    log.unlink()
    rc, doc = check(fleet, db, "ct200")
    t = target(doc)
    rc2, doc2 = check(fleet, db, "ct200")
    t2 = target(doc2)
    observe(
        f"after deleting train.log: state {t['state']!r}, findings {kinds(t)}; "
        f"next check reachable={t2['reachable']} state {t2['state']!r}"
    )
    assert t["reachable"] and t2["reachable"], (t, t2)
    assert "log-missing" in kinds(t), t
    assert t2["state"] in ("running", "starting", "stalled"), t2


@pytest.fixture
def tiny_disk(fleet):
    """ct201's runs/ on a 256 KiB tmpfs (a full disk in seconds); unmounted afterwards.

    In an LXC container the tmpfs is mounted in its mount namespace (nsenter), where its
    processes see it; the host reaches it through /proc/<init>/root."""
    runs = fleet.info.workdir("ct201") / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    init = fleet.info.init_pid("ct201")
    inside = ["nsenter", "-t", str(init), "-m"] if init else []
    where = fleet.info.container_workdir("ct201") + "/runs"
    res = subprocess.run(
        [*inside, "mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", where],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield Path(f"/proc/{init}/root{where}") if init else runs
    finally:
        fleet.orch("stop", "ct201", "--grace", "2")
        subprocess.run([*inside, "umount", "-l", where], capture_output=True)


@pytest.mark.fault(
    area="container and run",
    fault="the log's disk fills up during a run (256 KiB tmpfs)",
    must="flagged (the disk-full signature), and the agent keeps answering",
)
def test_disk_full_is_flagged_agent_keeps_working(fleet, tiny_disk, observe, tmp_path):
    fleet.scenario("idle")
    pad = "x" * 200
    fleet.agent_launch(
        "ct201",
        cmd=f'i=0; while true; do i=$((i+1)); echo "step=$i loss=2.0 tok/s=21500 {pad}"; '
        "sleep 0.005; done",
    )
    wait_for(lambda: os.statvfs(tiny_disk).f_bavail == 0, 30, what="the tmpfs to fill up")
    db = tmp_path / "orch.db"
    rc, doc = check(fleet, db, "ct201")
    t = target(doc, "ct201")
    rc2, doc2 = check(fleet, db, "ct201")
    t2 = target(doc2, "ct201")
    flagged = [
        f
        for f in t2["findings"]
        if "space" in (f["summary"] + f["kind"]).lower() or f.get("playbook") == "disk-full"
    ]
    observe(
        f"disk full: check exit {rc2}, state {t2['state']!r}, findings {kinds(t2)}"
        + (f"; {flagged[0]['summary'][:90]!r}" if flagged else "")
    )
    assert t["reachable"] and t2["reachable"], (t, t2)
    assert flagged, t2


def _agent_streams(fleet) -> list[int]:
    """Host PIDs of the agent streams that observe ct200: the host observer (``host-stream``,
    on the host, from the sandbox's agent_dir) or, observed from inside, the agent ``stream``
    in the container (by cmdline)."""
    found = []
    inside = set(fleet.info.container_pids("ct200"))
    mine = str(fleet.info.state_dir).encode()
    for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        agent = any(b"orchestrator.agent" in a for a in argv)
        on_host = b"host-stream" in argv and any(mine in a for a in argv)
        if on_host or (pid in inside and b"stream" in argv and agent):
            found.append(pid)
    return found


@pytest.mark.fault(
    area="container and run",
    fault="the agent killed (SIGKILL) mid-stream",
    must="orch restarts the agent and the stream resumes (run still 'running'), "
    "within the backoff cap",
)
def test_agent_killed_mid_stream_resumes(fleet, fresh_run, observe):
    w = fleet.watch("ct200")
    w.wait_line(re.compile(r" ct200 (running|starting)\b").search, 60)
    old = wait_for(lambda: _agent_streams(fleet), 10, what="the agent stream process")
    killed = time.monotonic()
    for pid in old:
        os.kill(pid, signal.SIGKILL)
    new = wait_for(
        lambda: [p for p in _agent_streams(fleet) if p not in old],
        BACKOFF_CAP_S,
        what="a restarted agent stream",
    )
    restarted = time.monotonic() - killed
    n = len(w.lines)
    wait_for(
        lambda: any("step=" in line for _, line in w.lines[n:]) or len(w.lines) > n,
        10,
        what="a new watch line",
    )
    lines = [line for t, line in w.lines if t >= killed]
    assert not [s for s in lines if " dead" in s or " crashed" in s], lines
    assert w.proc.poll() is None
    observe(
        f"agent pid(s) {old} killed; new agent {new} after {restarted:.1f} s; "
        f"watch lines since: {[s[9:40] for s in lines][:4]}"
    )
