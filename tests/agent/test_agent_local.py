"""The agent through the operator API on this machine (LocalTransport): real tmux, real pynvml
over the fake libnvidia-ml, the sandbox's nvidia-smi stand-in for the fallback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.agent.__main__ import GPU_DEADLINE_ENV
from orchestrator.agent.procs import alive, zombie_exit
from orchestrator.agent.tmux import TmuxReader
from orchestrator.errors import AgentError, AgentProtocolError, AgentRefused
from orchestrator.monitor import observe
from orchestrator.remote import deploy
from orchestrator.remote.target import Target
from orchestrator.wire import requests as rq
from orchestrator.wire.answers import LogAnswer, RunsAnswer, RunStatus
from orchestrator.wire.model import Snapshot
from tests.agent.conftest import SCENARIOS, AgentEnv
from tests.helpers import wait_for

SCENARIO_NAMES = ["healthy", "idle", "ghost", "driver-mismatch", "gpu-lost"]


def _expected(name: str) -> dict:
    return json.loads((SCENARIOS / f"{name}.json").read_text())


def _check_gpus(snap, name: str, source: str) -> None:
    want = _expected(name)
    assert snap.nvml is not None and snap.nvml.source == source
    if want.get("init_error"):
        assert snap.nvml.ok is False
        assert snap.nvml.error_kind == want["init_error"]
        assert snap.gpus == ()
        return
    devices = want["devices"]
    assert [g.index for g in snap.gpus] == [d["index"] for d in devices], snap.nvml
    for g, d in zip(snap.gpus, devices, strict=True):
        if d.get("lost"):
            assert g.error == "gpu-lost" and g.utilization_pct is None
            continue
        assert g.error is None
        assert g.uuid == d["uuid"]
        assert g.utilization_pct == d["util_pct"]
        assert g.memory_used_mib == pytest.approx(d["mem_used_mib"], abs=1)
        assert g.memory_total_mib == pytest.approx(d["mem_total_mib"], abs=1)
        assert g.power_w == pytest.approx(d["power_w"], abs=0.01)
        assert sorted(p.pid for p in g.processes or ()) == sorted(p["pid"] for p in d["processes"])
    lost = [d["index"] for d in devices if d.get("lost")]
    assert snap.nvml.ok is (not lost)
    if lost:
        assert snap.nvml.error_kind == "gpu-lost"


@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_scenarios_through_pynvml(agent_env: AgentEnv, name: str) -> None:
    want = agent_env.set_scenario(name)
    if name == "driver-mismatch":
        assert want["init_error"] == "driver-mismatch"
    snap = Target(agent_env.inventory(), "local").snapshot()
    _check_gpus(snap, name, "nvml")
    if name == "ghost":
        g3 = snap.gpus[3]
        assert (g3.utilization_pct, g3.memory_used_mib, g3.processes) == (100.0, 0.0, ())


@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_scenarios_through_nvidia_smi_without_pynvml(agent_env: AgentEnv, name: str) -> None:
    """The bundle is sent without pynvml, so the agent cannot import it and falls back."""
    agent_env.set_scenario(name)
    target = Target(
        agent_env.inventory(), "local", bundle=deploy.build_bundle(include_pynvml=False)
    )
    snap = target.snapshot()
    _check_gpus(snap, name, "nvidia-smi")
    if snap.nvml.ok:
        assert "pynvml" in (snap.nvml.message or "")


@pytest.mark.parametrize("smi", [False, True], ids=["pynvml", "nvidia-smi"])
def test_gpu_hang_is_a_timeout_within_the_deadline(agent_env: AgentEnv, smi: bool) -> None:
    agent_env.set_scenario("gpu-hang")
    bundle = deploy.build_bundle(include_pynvml=not smi)
    target = Target(agent_env.inventory(), "local", bundle=bundle)
    target.gpu_deadline_s = 1.0
    target.bundle_dir()  # deploy first: only the snapshot is timed
    start = time.monotonic()
    snap = target.snapshot(timeout=20)
    elapsed = time.monotonic() - start
    assert snap.nvml.error_kind == "timeout", snap.nvml
    assert "1.0 s" in (snap.nvml.message or "")
    # deadline + process start-up, far below the scenario's 30 s hang
    assert elapsed < 6.0
    assert snap.cost is not None and snap.cost.wall_ms < 1000 * 1.0 + 1500


def _write_lines(path: Path, n: int, start: int = 0) -> bytes:
    data = b"".join(
        f"step={i} loss={1.0 / (i + 1):.4f} tok/s=21500\n".encode() for i in range(start, start + n)
    )
    with open(path, "ab") as fh:
        fh.write(data)
    return data


def test_a_1gb_log_costs_the_same_bytes_as_a_1kb_log(agent_env: AgentEnv) -> None:
    small_run = agent_env.new_run("r1kb")
    _write_lines(small_run / "train.log", 32)  # ~1 KB
    assert 900 < (small_run / "train.log").stat().st_size < 1500
    target = Target(agent_env.inventory(), "local")
    first_small = target.snapshot()
    big_run = agent_env.new_run("r1gb")
    with open(big_run / "train.log", "wb") as fh:
        fh.truncate(1 << 30)  # sparse: 1 GiB of holes
    _write_lines(big_run / "train.log", 32)
    first_big = target.snapshot()
    assert first_big.run.log_size_bytes > 1 << 30
    # the first read looks at the tail only, however big the file
    assert first_big.cost.bytes_read <= 16384 + 1024
    assert first_big.run.new_log_lines[-1].startswith("step=31 ")
    assert first_big.metrics.step == 31 and first_big.metrics.tokens_per_s == 21500.0

    costs = {}
    for run_id, first in (("r1kb", first_small), ("r1gb", first_big)):
        (agent_env.workdir / "runs" / "current").write_text(run_id)
        appended = _write_lines(agent_env.workdir / "runs" / run_id / "train.log", 10, start=100)
        snap = target.snapshot(first.run.log_offset, run_id=run_id)
        assert snap.run.new_log_lines[0].startswith("step=100 ")
        assert len(snap.run.new_log_lines) == 10
        assert snap.run.log_offset == first.run.log_offset + len(appended)
        costs[run_id] = snap.cost.bytes_read
    assert costs["r1gb"] == costs["r1kb"]
    assert costs["r1kb"] < 1024


def _agent_pids(workdir: Path) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if b"orchestrator.agent" in cmd and b"\0stream\0" in cmd and str(workdir).encode() in cmd:
            found.append(int(name))
    return found


def test_stream_outlives_the_traced_process_and_leaves_no_agent(agent_env: AgentEnv) -> None:
    run = agent_env.new_run("r1")
    log = run / "train.log"
    target = Target(agent_env.inventory(), "local")
    target.bundle_dir()
    cmd = f"echo step=1 loss=2.0 >> {log}; sleep 3; echo 'step=2 loss=1.5' >> {log}; exit 3"
    agent_env.tmux("new-session", "-d", "-s", "train", "-x", "80", "-y", "20", "bash", "-c", cmd)
    agent_env.tmux("set-option", "-t", "train", "remain-on-exit", "on")
    stream = observe.stream(target, 0.3)
    seen = []
    deadline = time.monotonic() + 30
    after_death = 0
    try:
        for snap in stream:
            assert snap.reachable, snap.errors
            seen.append(snap)
            if snap.session and snap.session.pane_dead:
                after_death += 1
            # three observations of the dead pane, the newest with its exit status (tmux may
            # mark the pane dead on the pty's EOF a moment before the child has exited)
            status_seen = snap.session is not None and snap.session.pane_dead_status is not None
            if (after_death >= 3 and status_seen) or time.monotonic() > deadline:
                break
        assert _agent_pids(agent_env.workdir), "the stream agent should be running before close"
    finally:
        stream.close()
    assert after_death >= 3, [s.session for s in seen]
    alive = [s for s in seen if s.session and s.session.pane_dead is False]
    assert alive and alive[0].processes and alive[0].processes[0].pid == alive[0].session.pane_pid
    dead = [s for s in seen if s.session and s.session.pane_dead][-1]
    assert dead.session.pane_dead_status == 3
    assert dead.metrics.step == 2 and dead.metrics.loss == 1.5
    lines = [line for s in seen for line in (s.run.new_log_lines if s.run else ())]
    assert lines.count("step=2 loss=1.5") == 1  # offsets kept: nothing read twice
    wait_for(lambda: not _agent_pids(agent_env.workdir), timeout_s=10, what="stream agent exit")


def _zombie(argv: list[str], kill: int | None = None) -> subprocess.Popen[bytes]:
    """A child of this process left unreaped (a zombie) once it has ended."""
    proc = subprocess.Popen(argv)
    if kill is not None:
        os.kill(proc.pid, kill)
    wait_for(
        lambda: Path(f"/proc/{proc.pid}/stat").read_text().rsplit(") ", 1)[1].startswith("Z"),
        timeout_s=10,
        what="zombie",
    )
    return proc


def test_a_zombies_exit_status_is_read_from_proc() -> None:
    exited = _zombie(["bash", "-c", "exit 3"])
    killed = _zombie(["sleep", "60"], kill=9)
    alive = subprocess.Popen(["sleep", "60"])
    try:
        assert zombie_exit(exited.pid, os.getpid()) == (3, None)
        assert zombie_exit(killed.pid) == (None, 9)
        assert zombie_exit(exited.pid, parent=1) is None  # someone else's child: a recycled pid
        assert zombie_exit(alive.pid) is None
    finally:
        alive.kill()
        for proc in (exited, killed, alive):
            proc.wait()
    assert zombie_exit(exited.pid) is None  # reaped


def test_a_dead_pane_whose_status_tmux_lost_reports_it_from_the_zombie(
    agent_env: AgentEnv,
) -> None:
    """tmux + libutempter can lose the pane child's SIGCHLD: the pane is dead, its status empty,
    the child a zombie until another child of the server exits. That state cannot be caused on
    purpose, so the reader is handed such a list-panes line for a real zombie of this process."""
    reader = TmuxReader()
    exited = _zombie(["bash", "-c", "exit 3"])
    try:
        line = f"1|||{exited.pid}|%0|{os.getpid()}"
        assert reader._unreaped("train", line, exited.pid, os.getpid()) == (
            True,
            3,
            None,
            exited.pid,
            "%0",
        )
    finally:
        exited.wait()
    # reaped since it was listed: tmux has the status now, so the panes are listed again
    agent_env.tmux("new-session", "-d", "-s", "train", "bash", "-c", "sleep 0.5; exit 4")
    agent_env.tmux("set-option", "-t", "train", "remain-on-exit", "on")

    def tmux_has_the_status() -> bool:
        """tmux's own answer, not the reader's (which reads a zombie); when tmux lost the
        SIGCHLD (the very bug above), another child of the server exiting makes it reap."""
        res = agent_env.tmux("list-panes", "-t", "=train", "-F", "#{pane_dead_status}")
        if res.stdout.strip() == "4":
            return True
        agent_env.tmux("run-shell", "true")
        return False

    wait_for(tmux_has_the_status, timeout_s=15, what="tmux to record the dead pane's status")
    state = reader.state("train", 0)
    assert (state.pane_dead, state.pane_dead_status) == (True, 4)
    line = f"1|||{exited.pid}|%9|{os.getpid()}"
    assert reader._unreaped("train", line, exited.pid, os.getpid())[:3] == (True, 4, None)


def test_the_gpu_deadline_defaults_to_the_agents_env(
    agent_env: AgentEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent_env.set_scenario("gpu-hang")
    monkeypatch.setenv(GPU_DEADLINE_ENV, "1.5")
    target = Target(agent_env.inventory(), "local")
    assert target.gpu_deadline_s is None  # no --gpu-deadline sent: the agent's default rules
    snap = target.snapshot(timeout=20)
    assert snap.nvml.error_kind == "timeout" and "1.5 s" in (snap.nvml.message or ""), snap.nvml


def test_stream_agent_exits_when_its_reader_vanishes(agent_env: AgentEnv) -> None:
    """Kill the reading side abruptly (no close): the agent notices the hang-up and exits."""
    agent_env.new_run("r1", b"hello\n")
    bundle_dir = Target(agent_env.inventory(), "local").bundle_dir()
    reader = subprocess.Popen(
        [
            "bash",
            "-c",
            f"PYTHONPATH={bundle_dir} {sys.executable} -m orchestrator.agent stream "
            f"--interval 60 --workdir {agent_env.workdir} | head -c 1 >/dev/null; sleep 60",
        ],
        start_new_session=True,
    )
    try:
        pids = wait_for(lambda: _agent_pids(agent_env.workdir), timeout_s=15, what="agent start")
        # head exits after one byte: the pipe's reader is gone while the agent sleeps 60 s
        wait_for(
            lambda: not any(alive(p) for p in pids),
            timeout_s=10,
            what="agent exit after reader hang-up",
        )
    finally:
        os.killpg(reader.pid, 9)
        reader.wait()


def test_stream_answers_a_request_at_once(agent_env: AgentEnv) -> None:
    agent_env.new_run("r1", b"hello\n")
    bundle_dir = Target(agent_env.inventory(), "local").bundle_dir()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.agent",
            "stream",
            "--interval",
            "60",
            "--workdir",
            str(agent_env.workdir),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": bundle_dir},
    )
    try:
        first = json.loads(proc.stdout.readline())
        start = time.monotonic()
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        second = json.loads(proc.stdout.readline())
        assert time.monotonic() - start < 5  # not the 60 s interval
        assert second["taken_at"] > first["taken_at"]
        assert second["run"]["new_log_lines"] == []  # the offset was kept
        proc.stdin.close()  # EOF after a request: the operator left
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_redeploys_only_when_the_hash_changes(agent_env: AgentEnv) -> None:
    target = Target(agent_env.inventory(), "local")
    first = Path(target.bundle_dir())
    assert (first / ".orch-bundle").read_text().strip() == deploy.build_bundle().hash
    marker_mtime = (first / ".orch-bundle").stat().st_mtime_ns
    deploy.forget(target.transport, str(agent_env.workdir))  # a new orch process: no cache
    assert Path(target.bundle_dir()) == first
    assert (first / ".orch-bundle").stat().st_mtime_ns == marker_mtime  # nothing re-sent
    base = deploy.build_bundle()
    files = {**base.files, "orchestrator/agent/extra.py": b"X = 1\n"}
    changed = deploy.make_bundle(files)
    second = Path(Target(agent_env.inventory(), "local", bundle=changed).bundle_dir())
    assert second != first and (second / "orchestrator/agent/extra.py").exists()


def test_a_bundle_that_does_not_match_its_hash_is_refused(agent_env: AgentEnv) -> None:
    base = deploy.build_bundle()
    bad = deploy.Bundle(files=base.files, hash="0" * 16, tarball=base.tarball)
    with pytest.raises(AgentError, match="hash mismatch"):
        Target(agent_env.inventory(), "local", bundle=bad).bundle_dir()
    assert not (agent_env.workdir / ".orch" / "agent-0000000000000000").exists()


def test_missing_python_is_one_clear_error(agent_env: AgentEnv) -> None:
    target = Target(agent_env.inventory(python="python3-nonexistent"), "local")
    with pytest.raises(AgentError, match="'python3-nonexistent' not found in the container"):
        target.snapshot()


def test_too_old_python_names_the_version(agent_env: AgentEnv, tmp_path: Path) -> None:
    """A real Python 3.8 is not installed here, so a small script answers as python3.8 would:
    the agent's boot (run with -S) stops at its version check (exit 97), and the deploy's
    version probe prints "<version> absent"."""
    old = tmp_path / "python3.8"
    old.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-S" ]; then echo "orch agent: python 3.8 is too old" >&2; exit 97; fi\n'
        "echo '3.8.10 absent'\n"
    )
    old.chmod(0o755)
    target = Target(agent_env.inventory(python=str(old)), "local")
    with pytest.raises(AgentError, match=r"is Python 3\.8\.10; orch's agent needs Python >= 3\.10"):
        target.facts()


def _garbage_bundle(body: bytes) -> deploy.Bundle:
    base = deploy.build_bundle()
    files = {**base.files, "orchestrator/agent/__main__.py": body}
    return deploy.make_bundle(files)


@pytest.mark.parametrize(
    ("program", "match"),
    [
        (b"print('Segmentation fault (core dumped)')\n", "not JSON"),
        (
            b'import sys; sys.stdout.write(\'{"schema_version": 1, "target": "x", "taken\')\n',
            "truncated JSON",
        ),
        (
            b'print(\'{"schema_version": 99, "target": "x", "taken_at": 1.0}\')\n',
            "schema_version 99 is newer",
        ),
        (
            b"import sys; sys.stdout.write('{\"a\": \"' + 'x' * (9 << 20) + '\"}')\n",
            "larger than 8 MiB",
        ),
        (b"print('[1, 2]')\n", "expected a JSON object"),
        (b'print(\'{"schema_version": 1, "target": "x", "taken_at": "soon"}\')\n', "taken_at"),
    ],
    ids=["garbage", "truncated", "future-schema", "huge", "not-object", "bad-type"],
)
def test_bad_agent_output_is_a_protocol_error(
    agent_env: AgentEnv, program: bytes, match: str
) -> None:
    target = Target(agent_env.inventory(), "local", bundle=_garbage_bundle(program))
    with pytest.raises(AgentProtocolError, match=match):
        target.snapshot()


def test_stream_turns_bad_lines_into_findings_and_goes_on(agent_env: AgentEnv) -> None:
    program = (
        b"import json, sys, time\n"
        b"print('garbage', flush=True)\n"
        b"print(json.dumps({'schema_version': 1, 'target': 'local', 'taken_at': time.time()}), flush=True)\n"
    )
    target = Target(agent_env.inventory(), "local", bundle=_garbage_bundle(program))
    stream = observe.stream(target, 0.2)
    got = [next(stream) for _ in range(3)]
    stream.close()
    assert got[0].errors[0].startswith("agent-protocol-error: not JSON")
    assert got[1].reachable and got[1].errors == ()
    assert got[2].reachable is False and "ended" in got[2].errors[0]  # the agent exited


def test_unreachable_markers_while_the_agent_cannot_start(agent_env: AgentEnv) -> None:
    target = Target(agent_env.inventory(python="python3-nonexistent"), "local")
    stream = observe.stream(target, 0.2, backoff_cap_s=0.2)
    got = [next(stream) for _ in range(2)]
    stream.close()
    assert all(not s.reachable for s in got)
    assert "not found in the container" in got[0].errors[0]


def test_facts(agent_env: AgentEnv) -> None:
    agent_env.tmux("new-session", "-d", "-s", "other", "sleep", "30")
    facts = Target(agent_env.inventory(), "local").facts()
    assert facts["python"]["version"].startswith("3.")
    assert facts["tmux"]["version"] and "other" in facts["tmux"]["sessions"]
    assert facts["nvml"]["driver_version"] == "570.172.08"
    assert len(facts["gpus"]) == 8 and facts["gpus"][0]["name"] == "NVIDIA H200"
    assert facts["disk"]["free_mib"] > 0


def test_a_typed_call_returns_its_requests_answer_type(agent_env: AgentEnv) -> None:
    """The real agent over the local transport: each request's answer comes back as its type,
    and an error document as AgentRefused with the agent's word for it."""
    tgt = Target(agent_env.inventory(), "local")
    w = str(agent_env.workdir)
    with pytest.raises(AgentRefused) as refused:
        tgt.call(rq.StopRequest(w))
    assert refused.value.kind == "no-run" and str(refused.value).startswith("local: stop: no runs")
    agent_env.new_run("r1", b"step 1 loss 2.0\nstep 2 loss 1.5\n")
    runs = tgt.call(rq.RunsRequest(w))
    assert isinstance(runs, RunsAnswer) and [r.run_id for r in runs.runs] == ["r1"]
    one = tgt.call(rq.RunRequest(w, run_id="r1", tail=5))
    assert isinstance(one, RunStatus) and one.log_tail[-1] == "step 2 loss 1.5"
    logs = tgt.call(rq.LogsRequest(w, run_id="r1", lines=1))
    assert isinstance(logs, LogAnswer) and logs.lines == ("step 2 loss 1.5",)
    snap = tgt.call(rq.SnapshotRequest(w, target="local"))
    assert isinstance(snap, Snapshot) and snap.run is not None and snap.run.run_id == "r1"
    with pytest.raises(AgentRefused) as refused:
        tgt.call(rq.LaunchRequest(w, "true", session="bad session"))
    assert refused.value.kind == "bad-session"


def test_record_appends_bounded_samples(agent_env: AgentEnv) -> None:
    run = agent_env.new_run("r1")
    bundle_dir = Target(agent_env.inventory(), "local").bundle_dir()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.agent",
            "record",
            "--run-dir",
            str(run),
            "--interval",
            "0.05",
            "--max-bytes",
            "20000",
            "--max-duration",
            "3",
            "--pid",
            str(os.getpid()),
        ],
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": bundle_dir},
    )
    assert out.returncode == 0, out.stderr
    n = json.loads(out.stdout)["samples"]
    assert n >= 5
    current, rotated = run / "gpu.jsonl", run / "gpu.jsonl.1"
    assert rotated.exists(), "20 kB should have rotated at least once"
    last = current.read_text().splitlines()[-1]
    line = len(last) + 1  # a file passes the bound by at most the line that crossed it
    assert current.stat().st_size < 20000 + line and rotated.stat().st_size < 20000 + line
    sample = json.loads(last)
    assert len(sample["gpus"]) == 8 and sample["nvml"]["ok"] is True
    assert sample["procs"][0]["pid"] == os.getpid()


def test_a_hung_gpu_times_out_alone_and_recovers_at_the_next_snapshot(
    agent_env: AgentEnv,
) -> None:
    """GPU 3 blocks 30 s per NVML call: only GPU 3 is ``timeout``, the other seven read, later
    snapshots do not wait the deadline on it again, and it reads again once the hang ends."""
    agent_env.set_scenario("gpu-hang")
    target = Target(agent_env.inventory(), "local")
    target.gpu_deadline_s = 1.0
    target.bundle_dir()
    stream = observe.stream(target, 0.5)
    hung: list = []
    try:
        for snap in stream:
            assert snap.reachable, snap.errors
            if not hung and not any(g.error for g in snap.gpus):
                continue  # the very first reading may predate the scenario switch
            if len(hung) < 3:
                hung.append(snap)
                if len(hung) == 3:
                    healed_at = time.monotonic()
                    agent_env.set_scenario("healthy")
                continue
            if all(g.error is None for g in snap.gpus) or time.monotonic() > healed_at + 10:
                recovered = snap
                break
    finally:
        stream.close()
    for snap in hung:
        assert [g.index for g in snap.gpus if g.error] == [3], snap.gpus
        assert snap.gpus[3].error == "timeout" and snap.nvml.error_kind == "timeout"
        assert "GPU 3" in (snap.nvml.message or "") and "GPU 4" not in (snap.nvml.message or "")
        assert all(g.utilization_pct is not None for g in snap.gpus if g.index != 3)
    # the first hang costs the deadline; later ones only the short probe of the hanging GPU
    assert hung[0].nvml.elapsed_ms >= 900
    assert all(s.nvml.elapsed_ms < 700 for s in hung[1:]), [s.nvml.elapsed_ms for s in hung]
    assert all(g.error is None for g in recovered.gpus), recovered.gpus
    assert time.monotonic() - healed_at < 3.0  # within a couple of 0.5 s intervals


def test_snapshot_reads_the_run_file_systems_free_space(agent_env: AgentEnv) -> None:
    run = agent_env.new_run("r1", b"step=1 loss=2.0\n")
    snap = Target(agent_env.inventory(), "local").snapshot()
    st = os.statvfs(run)
    free_mib = st.f_bavail * st.f_frsize / 1048576.0
    assert snap.run is not None and snap.run.disk_total_mib is not None
    assert snap.run.disk_total_mib == pytest.approx(st.f_blocks * st.f_frsize / 1048576.0, rel=1e-6)
    assert snap.run.disk_free_mib == pytest.approx(free_mib, abs=64)  # others write meanwhile
