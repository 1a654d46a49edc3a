"""The agent end to end through the sandbox: real sshd, the pct stand-in, real pynvml over the
fake libnvidia-ml, the nvidia-smi / journalctl stand-ins on the "host"."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from orchestrator.config.inventory import load_inventory
from orchestrator.monitor import observe
from orchestrator.remote import deploy
from orchestrator.remote.target import Host, Target
from orchestrator.sandbox import manager
from orchestrator.sandbox.kernel import append_kernel_line
from tests.agent.test_agent_local import SCENARIO_NAMES, _check_gpus, _write_lines
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def inv(sandbox):  # type: ignore[no-untyped-def]
    return load_inventory(sandbox.config_path)


def _new_run(sandbox, run_id: str) -> Path:  # type: ignore[no-untyped-def]
    workdir = sandbox.workdir("ct200")
    run = workdir / "runs" / run_id
    run.mkdir(parents=True, exist_ok=True)
    (run / "train.log").write_bytes(b"")
    (workdir / "runs" / "current").write_text(run_id + "\n")
    return run


@pytest.mark.parametrize("name", SCENARIO_NAMES)
@pytest.mark.parametrize("smi", [False, True], ids=["pynvml", "nvidia-smi"])
def test_scenarios_through_the_sandbox(inv, sandbox_scenario, name: str, smi: bool) -> None:  # type: ignore[no-untyped-def]
    sandbox_scenario(name)
    bundle = deploy.build_bundle(include_pynvml=not smi)
    snap = Target(inv, "ct200", bundle=bundle).snapshot()
    assert snap.target == "ct200" and snap.reachable
    _check_gpus(snap, name, "nvidia-smi" if smi else "nvml")


def test_gpu_hang_reports_timeout_within_the_deadline(inv, sandbox_scenario) -> None:  # type: ignore[no-untyped-def]
    target = Target(inv, "ct200")
    target.gpu_deadline_s = 1.0
    target.bundle_dir()
    sandbox_scenario("gpu-hang")
    start = time.monotonic()
    snap = target.snapshot(timeout=20)
    assert time.monotonic() - start < 8.0  # the scenario blocks NVML for 30 s
    assert snap.nvml.error_kind == "timeout" and "1.0 s" in snap.nvml.message


def test_1gb_log_costs_the_same_bytes_read_as_1kb(sandbox, inv) -> None:  # type: ignore[no-untyped-def]
    target = Target(inv, "ct200")
    small = _new_run(sandbox, "e2e-1kb")
    _write_lines(small / "train.log", 32)
    first_small = target.snapshot()
    big = _new_run(sandbox, "e2e-1gb")
    with open(big / "train.log", "wb") as fh:
        fh.truncate(1 << 30)
    _write_lines(big / "train.log", 32)
    first_big = target.snapshot()
    assert first_big.run.log_size_bytes > 1 << 30 and first_big.cost.bytes_read < 20000
    costs = {}
    for run_id, first in (("e2e-1kb", first_small), ("e2e-1gb", first_big)):
        (sandbox.workdir("ct200") / "runs" / "current").write_text(run_id)
        _write_lines(sandbox.workdir("ct200") / "runs" / run_id / "train.log", 10, start=100)
        snap = target.snapshot(first.run.log_offset, run_id=run_id)
        assert len(snap.run.new_log_lines) == 10
        costs[run_id] = snap.cost.bytes_read
    assert costs["e2e-1kb"] == costs["e2e-1gb"] < 1024


def _stream_agents(sandbox, container: str = "ct200") -> list[int]:  # type: ignore[no-untyped-def]
    """Host PIDs of live agent ``stream`` processes in the container."""
    out = []
    for pid in sandbox.container_pids(container):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            continue
        if b"orchestrator.agent" in cmd and b"\0stream\0" in cmd and b") Z " not in stat:
            out.append(pid)
    return out


def test_stream_survives_death_and_leaves_no_agent_after_disconnect(sandbox, inv) -> None:  # type: ignore[no-untyped-def]
    run = _new_run(sandbox, "e2e-stream")
    target = Target(inv, "ct200")
    target.bundle_dir()
    log = "runs/e2e-stream/train.log"
    script = f"echo step=1 loss=2.0 >> {log}; sleep 3; echo step=2 loss=1.0 >> {log}; exit 7"
    res = target.transport.run(
        [
            "bash",
            "-c",
            f"cd {sandbox.container_workdir('ct200')} && tmux kill-session -t train 2>/dev/null; "
            f"tmux new-session -d -s train bash -c {json.dumps(script)} && "
            f"tmux set-option -t train remain-on-exit on",
        ]
    )
    assert res.ok, res.err
    seen = []
    stream = observe.stream(target, 0.3)
    try:
        for snap in stream:
            assert snap.reachable, snap.errors
            seen.append(snap)
            if sum(1 for s in seen if s.session and s.session.pane_dead) >= 3:
                break
            assert len(seen) < 100
        pids = _stream_agents(sandbox)
        assert pids, "the stream agent runs while we read"
    finally:
        stream.close()
    dead = seen[-1]
    assert dead.session.pane_dead_status == 7 and dead.metrics.step == 2
    assert any(s.processes for s in seen if s.session and s.session.pane_dead is False)
    assert (run / "train.log").exists()
    wait_for(
        lambda: not _stream_agents(sandbox),
        timeout_s=10,
        what="no stream agent left in the container after disconnect",
    )


def test_host_probe_finds_xid_79_and_maps_a_gpu_process_to_vmid_200(sandbox, inv) -> None:  # type: ignore[no-untyped-def]
    if not sandbox.cgroup:
        pytest.skip("cgroup v2 not writable here: container processes carry no lxc/<vmid> cgroup")
    target = Target(inv, "ct200")
    res = target.transport.run(
        [
            "bash",
            "-c",
            "tmux new-session -d -s gpuproc sleep 120 && "
            "tmux list-panes -t gpuproc -F '#{pane_pid}'",
        ]
    )
    assert res.ok, res.err
    pid = sandbox.host_pid("ct200", int(res.out.split()[-1]))  # the driver reports host PIDs
    since = time.time() - 1
    try:
        doc = manager.read_scenario(sandbox.state_dir)
        doc["devices"][0]["processes"] = [{"pid": pid, "used_mib": 1234}]
        manager.set_scenario(sandbox.state_dir, {**doc, "name": "probe-test"})
        append_kernel_line(
            sandbox.state_dir,
            "NVRM: Xid (PCI:0000:5d:00): 79, pid=412304, name=python3, GPU has fallen off the bus.",
        )
        probe = Host(inv, "sandbox").probe(since)
    finally:
        manager.set_scenario(sandbox.state_dir, "healthy")
        target.transport.run(["tmux", "kill-session", "-t", "gpuproc"])
    xids = [e for e in probe.kernel_events if e.kind == "xid"]
    assert xids and xids[-1].xid == 79 and xids[-1].pci == "0000:5d:00" and xids[-1].at >= since - 1
    assert probe.kernel_log_source == "journalctl"
    assert probe.gpu_pids[str(pid)] == 200
    assert probe.container_status[200] == "running"
