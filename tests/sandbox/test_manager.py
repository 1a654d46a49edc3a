"""``orch sandbox up --json`` / ``status`` / ``scenario`` / ``down``: a full lifecycle that leaves nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.agent.procs import alive
from orchestrator.cli import run
from orchestrator.sandbox import manager
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


@pytest.mark.e2e
def test_up_status_scenario_down_leaves_no_process(tmp_path: Path) -> None:
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
        "--json",
    )
    assert up.returncode == 0, up.stderr
    info = json.loads(up.stdout)
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
        assert ct["workdir"] == str(state / "containers" / "200" / "root" / "dflash")
        assert ct["gpus"] == {"target": [0, 1, 2], "drafter": [3]}
        assert len(manager.read_scenario(state)["devices"]) == 4
        # second `up` finds it running and answers the same
        assert (
            json.loads(orch("sandbox", "up", "--dir", str(state), "--json").stdout)["port"]
            == info["port"]
        )
        st = json.loads(orch("sandbox", "status", "--dir", str(state), "--json").stdout)
        assert (
            st["running"]
            and st["scenario"] == "ghost"
            and [c["status"] for c in st["containers"]] == ["running"] * 2
        )
        assert orch("sandbox", "scenario", "idle", "--dir", str(state)).returncode == 0
        assert manager.read_scenario(state)["name"] == "idle"
        # something to clean up: a tmux server in ct201 and a detached host process via pct
        tmux = manager.run_pct(
            state, "exec", "201", "--", "tmux", "new-session", "-d", "-s", "train", "sleep 600"
        )
        assert tmux.returncode == 0, tmux.stderr
        (state / "containers" / "201" / "root" / "dflash" / "train.log").write_text("keep me\n")
        assert len(_marked(state)) >= 2
    finally:
        down = orch("sandbox", "down", "--dir", str(state), "--json")
    assert down.returncode == 0, down.stderr
    report = json.loads(down.stdout)
    assert report["sshd"] is True and report["containers"] == ["ct200", "ct201"]
    assert not alive(info["sshd_pid"])
    assert _marked(state) == []
    assert (
        state / "containers" / "201" / "root" / "dflash" / "train.log"
    ).read_text() == "keep me\n"
    assert orch("sandbox", "status", "--dir", str(state)).returncode == 1


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
