"""``orch sandbox up --json`` / ``status`` / ``scenario`` / ``down``: a full lifecycle that leaves nothing behind."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.agent.procs import alive
from orchestrator.cli import run
from orchestrator.sandbox import lxc, manager, process
from tests.helpers import SANDBOX_ISOLATION, wait_for
from tests.sandbox.gpu3_reader import Gpu3Reader


def orch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _marked(state_dir: Path) -> list[int]:
    """Live processes carrying this sandbox's markers (host-side ssh or container)."""
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                env = (p / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(
                e == f"ORCH_SANDBOX_STATE={state_dir}".encode()
                or e.startswith(f"ORCH_SANDBOX_CT={state_dir}:".encode())
                for e in env
            ) and alive(int(p.name)):
                found.append(int(p.name))
    return found


def _leftovers(info: dict) -> list[str]:
    """What a sandbox left running: marked processes, LXC containers, its cgroup tree."""
    state = Path(info["state_dir"])
    found = [f"pid {p}" for p in _marked(state)]
    if info["isolation"] == "lxc":
        ls = subprocess.run(["lxc-ls", "-P", str(state / "lxc")], capture_output=True, text=True)
        found += [f"container {n}" for n in ls.stdout.split()]
        prefix = lxc.cgroup_prefix(state)
        found += [str(m / prefix) for m in lxc.cgroup_mounts() if (m / prefix).exists()]
    return found


@pytest.mark.e2e
def test_up_status_scenario_down_leaves_nothing(tmp_path: Path) -> None:
    state = tmp_path / "sb"
    up = orch(
        "sandbox",
        "up",
        "--dir",
        str(state),
        "--containers",
        "2",
        "--gpus",
        "4",
        "--scenario",
        "ghost",
        "--isolation",
        SANDBOX_ISOLATION,
        "--json",
    )
    assert up.returncode == 0, up.stderr
    info = json.loads(up.stdout)
    lxc_mode = info["isolation"] == "lxc"
    try:
        assert info["config"] == str(state / "hosts.yaml") and info["containers"] == [
            "ct200",
            "ct201",
        ]
        assert info["state_dir"] == str(state) and isinstance(info["port"], int)
        hosts = yaml.safe_load(Path(info["config"]).read_text())
        assert set(hosts) == {"defaults", "hosts", "containers"}
        assert hosts["hosts"]["sandbox"]["address"] == "127.0.0.1"
        assert hosts["hosts"]["sandbox"]["port"] == info["port"]
        assert (
            Path(hosts["hosts"]["sandbox"]["known_hosts"])
            .read_text()
            .startswith(f"[127.0.0.1]:{info['port']} ")
        )
        ct = hosts["containers"]["ct200"]
        assert ct["vmid"] == 200 and ct["session"] == "train"
        if lxc_mode:  # the workdir is inside the container; its python is the operator's
            assert ct["workdir"] == "/root/dflash" and ct["python"] == sys.executable
        else:
            assert ct["workdir"] == str(state / "containers" / "200" / "root" / "dflash")
        assert ct["gpus"] == {"target": [0, 1, 2], "drafter": [3]}
        assert len(manager.read_scenario(state)["devices"]) == 4
        # second `up` finds it running and answers the same
        again = orch("sandbox", "up", "--dir", str(state), "--json")
        assert json.loads(again.stdout)["port"] == info["port"]
        st = json.loads(orch("sandbox", "status", "--dir", str(state), "--json").stdout)
        assert st["running"] and st["scenario"] == "ghost" and st["isolation"] == info["isolation"]
        assert [c["status"] for c in st["containers"]] == ["running"] * 2
        inits = [c["init_pid"] for c in st["containers"]]
        if lxc_mode:  # the host PID of each container's init: PID 1 inside
            assert all(alive(p) and lxc.ns_pid_of(p) == 1 for p in inits)
        else:
            assert inits == [None, None]
        assert orch("sandbox", "scenario", "idle", "--dir", str(state)).returncode == 0
        assert manager.read_scenario(state)["name"] == "idle"
        # something to clean up: a tmux server in ct201
        tmux = manager.run_pct(
            state, "exec", "201", "--", "tmux", "new-session", "-d", "-s", "train", "sleep 600"
        )
        assert tmux.returncode == 0, tmux.stderr
        sb = manager.info(state)
        (sb.workdir("ct201") / "train.log").write_text("keep me\n")
        pids = wait_for(lambda: len(sb.container_pids(201)) >= 2 and sb.container_pids(201), 10)
    finally:
        down = orch("sandbox", "down", "--dir", str(state), "--json")
    assert down.returncode == 0, down.stderr
    report = json.loads(down.stdout)
    assert report["sshd"] is True and report["containers"] == ["ct200", "ct201"]
    assert not alive(info["sshd_pid"]) and not [p for p in pids + inits if p and alive(p)]
    assert _leftovers(info) == []
    assert (sb.workdir("ct201") / "train.log").read_text() == "keep me\n"
    assert orch("sandbox", "status", "--dir", str(state)).returncode == 1


def _children(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.is_dir()) if path.is_dir() else []


@pytest.mark.e2e
def test_down_removes_its_cgroups_and_keeps_another_sandboxs(tmp_path: Path) -> None:
    """Process mode: two sandboxes share ``lxc/200``: ``down`` of one removes its leaves (a
    process in one included) and the parents only where empty; the other keeps its leaf and
    still joins it. (LXC mode gives each sandbox its own ``orch-<id>`` tree: test_lxc.py.)"""
    a = manager.up(tmp_path / "a", containers=2, gpus=1, isolation="process")
    b = None
    sleeper = None
    try:
        if not a.cgroup:
            pytest.skip("cgroup v2 not writable here: the sandbox makes no cgroups")
        b = manager.up(tmp_path / "b", containers=1, gpus=1, isolation="process")
        leaves_a = [Path((a.container_root(v) / "cgroup").read_text().strip()) for v in a.vmids]
        leaf_b = Path((b.container_root(200) / "cgroup").read_text().strip())
        assert [p.parts[-4:-1] for p in leaves_a] == [("lxc", "200", "ns"), ("lxc", "201", "ns")]
        assert leaf_b.parent == leaves_a[0].parent and leaf_b != leaves_a[0]
        sleeper = subprocess.Popen(
            [str(a.state_dir / "bin" / "pct"), "exec", "201", "--", "sleep", "600"],
            env={**os.environ, **a.env(), "PATH": f"{a.state_dir / 'bin'}:{os.environ['PATH']}"},
        )
        wait_for(
            lambda: (leaves_a[1] / "cgroup.procs").read_text().split(),
            timeout_s=20,
            what="sleep 600 in ct201's cgroup",
        )
        # as a half-done `up` leaves it: ct200 runs and has a leaf, but state.json lacks it
        state = json.loads((a.state_dir / "state.json").read_text())
        state["containers"] = [c for c in state["containers"] if c["vmid"] != 200]
        (a.state_dir / "state.json").write_text(json.dumps(state))
        report = manager.down(a.state_dir)
        assert report["containers"] == ["ct200", "ct201"] and "cgroups_left" not in report
        assert sleeper.wait(timeout=20) != 0
        for leaf in leaves_a:
            assert not leaf.exists(), leaf
            # a parent that stays holds someone else's leaf (rmdir of a non-empty cgroup fails)
            for parent in (leaf.parent, leaf.parent.parent):
                assert not parent.exists() or _children(parent), parent
        assert leaf_b.is_dir()
        probe = manager.run_pct(b.state_dir, "exec", "200", "--", "cat", "/proc/self/cgroup")
        assert probe.returncode == 0 and f"/lxc/200/ns/{leaf_b.name}" in probe.stdout
    finally:
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait(timeout=10)
        with contextlib.suppress(manager.SandboxError):
            manager.down(a.state_dir)
        if b is not None:
            manager.down(b.state_dir)
    if b is not None:
        assert not leaf_b.exists()
        assert not leaf_b.parent.exists() or _children(leaf_b.parent)


def test_remove_cgroup_takes_parents_only_when_empty(tmp_path: Path) -> None:
    """A plain directory tree stands in for cgroupfs: rmdir of a non-empty directory fails
    there too (ENOTEMPTY), which is all the parent logic relies on."""
    ns = tmp_path / "lxc" / "300" / "ns"
    mine, other = ns / "orch-sandbox-mine", ns / "orch-sandbox-other"
    mine.mkdir(parents=True)
    other.mkdir()
    assert process.remove_cgroup(mine, timeout_s=0.5)
    assert not mine.exists() and other.is_dir()
    assert process.remove_cgroup(mine, timeout_s=0.5)  # already gone: fine
    assert process.remove_cgroup(other, timeout_s=0.5)
    assert not (tmp_path / "lxc").exists() and tmp_path.is_dir()
    busy = ns / "orch-sandbox-busy"
    (busy / "stuck").mkdir(parents=True)  # a leaf that cannot go (cgroupfs: EBUSY)
    assert not process.remove_cgroup(busy, timeout_s=0.2)
    assert busy.is_dir()


def test_unknown_scenario_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["sandbox", "up", "--dir", str(tmp_path), "--scenario", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown scenario 'nope'" in err and "ghost" in err
    assert not (tmp_path / "state.json").exists()


def test_status_without_sandbox(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["sandbox", "status", "--dir", str(tmp_path)]) == 1
    assert "orch sandbox up --dir" in capsys.readouterr().err


def test_missing_tool_names_apt_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """PATH without tmux: nothing real can stand in for an absent program, so PATH is narrowed."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert run(["sandbox", "up", "--dir", str(tmp_path / "sb")]) == 2
    assert "apt-get install -y tmux" in capsys.readouterr().err


def test_switch_scenario_while_an_agent_like_reader_runs(sandbox, sandbox_scenario) -> None:
    """A process in ct200 keeps NVML open through pct exec while the scenario changes under it."""
    env = {
        **os.environ,
        **sandbox.env(),
        "PATH": f"{sandbox.state_dir / 'bin'}:{os.environ['PATH']}",
    }
    reader = Gpu3Reader(
        [str(sandbox.state_dir / "bin" / "pct"), "exec", "200", "--"], sys.executable, env
    )
    try:
        ask = reader.ask
        assert ask() == "99 118033"
        sandbox_scenario("ghost")
        assert ask() == "100 0"
        sandbox_scenario("gpu-lost")
        assert ask() == "error 15"
    finally:
        assert reader.close() == 0
    assert "NVRM: Xid" in (sandbox.state_dir / "kernel.log").read_text()


@pytest.mark.e2e
def test_process_mode_smoke(tmp_path: Path) -> None:
    """Process mode (where LXC cannot run) still carries the loop: launch, status, logs, down."""
    info = manager.up(tmp_path / "p", containers=1, gpus=2, scenario="idle", isolation="process")
    try:
        assert info.isolation == "process" and info.init_pid("ct200") is None
        cfg = str(info.config_path)
        launched = orch(
            "-c",
            cfg,
            "launch",
            "ct200",
            "--cmd",
            "echo smoke-$((6*7)); sleep 30",
            "--name",
            "smoke",
            "--no-verify",
            "--json",
        )
        assert launched.returncode == 0, launched.stderr
        log = info.host_path("ct200", json.loads(launched.stdout)["log_path"])
        wait_for(lambda: "smoke-42" in log.read_text(), 20, what="the run's line in its log")
        status = json.loads(orch("-c", cfg, "status", "ct200", "--json").stdout)[0]
        assert status["reachable"] and status["container"] == "running", status
        assert orch("-c", cfg, "stop", "ct200", "--grace", "2").returncode == 0
    finally:
        report = manager.down(info.state_dir)
    assert report["containers"] == ["ct200"] and "cgroups_left" not in report
    assert _marked(info.state_dir) == []


@pytest.mark.e2e
def test_auto_falls_back_when_lxc_containers_cannot_start(tmp_path: Path) -> None:
    """A state directory LXC cannot mount (a comma in its path) starts in process mode under
    ``auto``, saying why in one line; ``--isolation lxc`` refuses it."""
    if lxc.unavailable():
        pytest.skip(f"LXC cannot run here at all: {lxc.unavailable()}")
    with pytest.raises(manager.SandboxError, match="cannot mount"):
        manager.up(tmp_path / "a,b", containers=1, gpus=1, isolation="lxc")
    odd = tmp_path / "c,d"
    info = manager.up(odd, containers=1, gpus=1, isolation="auto")
    try:
        assert info.isolation == "process" and info.fallback, info
        assert info.fallback.startswith("LXC containers did not start here (LXC mode cannot")
    finally:
        manager.down(odd)
