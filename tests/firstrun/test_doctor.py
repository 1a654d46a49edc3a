"""``orch doctor``: the operator side on its own (fast), and the path to a sandbox container
with one broken thing at a time (e2e): each failure named by its own check, with a fix."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli import run
from tests.helpers import OLD_PYTHON, SANDBOX_ISOLATION, old_python

SANDBOX_HOST = "sandbox"


def doctor(
    capsys: pytest.CaptureFixture[str], config: Path, *args: str
) -> tuple[int, dict[str, Any]]:
    """Run ``orch -c CONFIG doctor ARGS --json``; the exit code and the checks by name."""
    capsys.readouterr()
    code = run(["-c", str(config), "doctor", *args, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is (code == 0)
    return code, {c["name"]: c for c in doc["checks"]}


def failing(checks: dict[str, Any]) -> set[str]:
    return {name for name, c in checks.items() if c["status"] == "fail"}


# --------------------------------------------------------------------------- operator side


@pytest.fixture
def private_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state dir of our own and no ssh-agent: the checks see only what the test sets up."""
    state = tmp_path / "state"
    monkeypatch.setenv("ORCH_STATE_DIR", str(state))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.delenv("ORCH_CONFIG", raising=False)
    return state


def _offline_config(tmp_path: Path, key_mode: int = 0o600) -> Path:
    key = tmp_path / "id_test"
    key.write_text("not really a key, only its mode matters here\n")
    key.chmod(key_mode)
    known = tmp_path / "known_hosts"
    known.write_text(
        "[10.0.0.9]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\n"
    )
    cfg = tmp_path / "hosts.yaml"
    cfg.write_text(
        f"hosts:\n  pve9: {{address: 10.0.0.9, port: 2222, identity_file: {key}, known_hosts: {known}}}\n"
        "containers:\n  lxc900: {host: pve9, vmid: 900}\n"
    )
    cfg.chmod(0o600)
    return cfg


def test_operator_side_all_good(
    tmp_path: Path, private_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, checks = doctor(capsys, _offline_config(tmp_path))
    assert code == 0, checks
    assert list(checks) == [
        "config",
        "config permissions",
        "state directory",
        "python packages",
        "identity file for pve9",
        "host key of pve9",
    ]
    assert "paramiko " in checks["python packages"]["detail"]
    assert "nvidia-ml-py " in checks["python packages"]["detail"]


def test_missing_config_is_a_warning_saying_orch_init(
    tmp_path: Path,
    private_env: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "nothing"))
    capsys.readouterr()
    code = run(["doctor", "--json"])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert code == 0  # orch works without one (the built-in local target): a warning
    assert (
        checks["config"]["status"] == "warn" and "no hosts.yaml found" in checks["config"]["detail"]
    )
    assert checks["config"]["fix"] == "orch init"


def test_invalid_config_names_file_line_and_key(
    tmp_path: Path, private_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "hosts.yaml"
    cfg.write_text("hosts:\n  pve1: {adress: 10.0.0.1}\n")
    code, checks = doctor(capsys, cfg)
    assert code == 1 and failing(checks) == {"config"}
    assert f"{cfg}:2: hosts.pve1.adress: unknown key" in checks["config"]["detail"]


def test_writable_config_and_state_dir_fail_with_chmod_fixes(
    tmp_path: Path, private_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _offline_config(tmp_path)
    cfg.chmod(0o666)
    private_env.mkdir()
    private_env.chmod(0o777)
    code, checks = doctor(capsys, cfg)
    assert code == 1
    assert failing(checks) == {"config permissions", "state directory"}
    assert checks["config permissions"]["fix"] == f"chmod go-w {cfg}"
    assert checks["state directory"]["fix"] == f"chmod 700 {private_env}"


def test_load_warns_when_state_dir_is_writable_by_others(
    tmp_path: Path, private_env: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from orchestrator.config.inventory import load_inventory

    private_env.mkdir()
    private_env.chmod(0o777)
    with caplog.at_level(logging.WARNING):
        load_inventory(_offline_config(tmp_path))
    assert any(
        "state directory" in r.getMessage() and "chmod go-w" in r.getMessage()
        for r in caplog.records
    )


def test_key_readable_by_others_is_a_warning_not_a_failure(
    tmp_path: Path, private_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, checks = doctor(capsys, _offline_config(tmp_path, key_mode=0o644))
    assert code == 0
    check = checks["identity file for pve9"]
    assert check["status"] == "warn" and check["ok"] is True
    assert check["fix"] == f"chmod 600 {tmp_path / 'id_test'}"


def test_unknown_target_is_a_usage_error(
    tmp_path: Path, private_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run(["-c", str(_offline_config(tmp_path)), "doctor", "lxc999"])
    assert code == 2
    assert "no container or host named 'lxc999'" in capsys.readouterr().err


# --------------------------------------------------------------------------- through the sandbox


@pytest.fixture
def sandbox_config(sandbox: Any, tmp_path: Path, private_env: Path) -> Iterator[Any]:
    """A function writing a copy of the sandbox's hosts.yaml with changes; the sandbox is untouched."""
    base = yaml.safe_load(Path(sandbox.config_path).read_text())

    def write(
        host: dict[str, Any] | None = None, containers: dict[str, dict[str, Any]] | None = None
    ) -> Path:
        doc = json.loads(json.dumps(base))
        doc["hosts"][SANDBOX_HOST].update(host or {})
        for name, over in (containers or {}).items():
            doc["containers"][name].update(over)
        path = tmp_path / "hosts.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        path.chmod(0o600)
        return path

    yield write


def _path_without(sandbox: Any, vmid: int, tmp_path: Path, tool: str) -> str:
    """A PATH for container ``vmid`` holding every program of ours but ``tool``: one directory
    of symlinks (in an LXC container: made in its /root, from its own /usr)."""
    if sandbox.isolation == "lxc":
        inside = f"/root/path-without-{tool}"
        farm = sandbox.host_path(vmid, inside)
        dirs = [
            (sandbox.host_path(vmid, d), d) for d in ("/usr/local/bin", "/usr/bin", "/usr/sbin")
        ]
    else:  # the container's own usr/bin (nvidia-smi) first, then this machine's PATH
        farm = tmp_path / f"path-without-{tool}"
        inside = str(farm)
        first = str(sandbox.container_root(vmid) / "usr" / "bin")
        path = [first, *os.environ.get("PATH", "/usr/bin:/bin").split(":")]
        dirs = [(Path(d), d) for d in path]
    farm.mkdir(exist_ok=True)
    for host_dir, in_dir in dirs:
        if not host_dir.is_dir():
            continue
        for entry in os.scandir(host_dir):
            link = farm / entry.name
            if entry.name != tool and not os.path.lexists(link):
                link.symlink_to(f"{in_dir}/{entry.name}")
    return inside


@pytest.mark.e2e
def test_healthy_sandbox_passes_every_check(
    sandbox_config: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, checks = doctor(capsys, sandbox_config(), "ct200")
    assert code == 0, {n: c["detail"] for n, c in checks.items() if not c["ok"]}
    for name in (
        "ssh to sandbox",
        "pct on sandbox",
        "python3 on sandbox",
        "container ct200 running",
        "python3 in ct200",
        "tmux in ct200",
        "NVML in ct200",
    ):
        assert checks[name]["status"] == "ok", checks[name]
    assert checks["tmux in ct200"]["detail"].startswith("tmux ")
    assert checks["python3 in ct200"]["detail"].startswith("Python 3")
    assert "8 GPU(s)" in checks["NVML in ct200"]["detail"]


@pytest.mark.e2e
def test_no_key(sandbox_config: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-key"
    code, checks = doctor(capsys, sandbox_config(host={"identity_file": str(missing)}), "ct200")
    assert code == 1
    assert failing(checks) == {"identity file for sandbox", "ssh to sandbox"}
    assert checks["identity file for sandbox"]["detail"] == f"{missing} does not exist"
    assert "ssh-keygen" in checks["identity file for sandbox"]["fix"]
    assert "authentication failed" in checks["ssh to sandbox"]["detail"]
    assert checks["container ct200 running"]["status"] == "skip"


@pytest.mark.e2e
def test_unknown_host_key(
    sandbox_config: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    code, checks = doctor(capsys, sandbox_config(host={"known_hosts": str(empty)}), "ct200")
    assert code == 1
    assert failing(checks) == {"host key of sandbox", "ssh to sandbox"}
    assert checks["host key of sandbox"]["fix"].startswith("orch trust sandbox")
    assert "host key not known" in checks["ssh to sandbox"]["detail"]
    assert checks["ssh to sandbox"]["fix"] == "orch trust sandbox"


@pytest.mark.e2e
def test_stopped_container(
    sandbox: Any, sandbox_config: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.sandbox import manager

    cfg = sandbox_config()
    manager.stop_container(sandbox.state_dir, "ct202")
    try:
        capsys.readouterr()
        code = run(["-c", str(cfg), "doctor", "ct202"])
        text = capsys.readouterr().out
    finally:
        manager.start_container(sandbox.state_dir, "ct202")
    assert code == 1
    assert "✗ container ct202 running: pct status 202: stopped" in text
    assert "    fix: ssh sandbox pct start 202" in text
    assert "✓ ssh to sandbox" in text and "✓ pct on sandbox" in text
    assert "- tmux in ct202: skipped: ct202 is not running" in text
    assert text.count("✗") == 1 and "1 check(s) failed" in text


@pytest.mark.e2e
def test_missing_tmux_in_the_container(
    sandbox: Any, sandbox_config: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The container's env in hosts.yaml sets a PATH without tmux: every orch command there
    runs with it, so tmux is missing for orch exactly as in a container without the package."""
    if shutil.which("tmux") is None:
        pytest.skip("needs tmux")
    env = {"PATH": _path_without(sandbox, 201, tmp_path, "tmux")}
    code, checks = doctor(capsys, sandbox_config(containers={"ct201": {"env": env}}), "ct201")
    assert code == 1
    assert failing(checks) == {"tmux in ct201"}
    assert checks["tmux in ct201"]["detail"] == "tmux not found on the container's PATH"
    assert checks["tmux in ct201"]["fix"] == "ssh sandbox pct exec 201 -- apt-get install -y tmux"
    assert checks["python3 in ct201"]["status"] == "ok"


@pytest.mark.e2e
def test_python_39_in_the_container_fails_saying_what_to_do(
    sandbox: Any, sandbox_config: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The container's ``python:`` is a 3.9 (Debian 11, Ubuntu 20.04): it runs, so it is found,
    but the agent cannot run on it; doctor fails that check with the exact version, what
    orch needs and the two ways out."""
    real = yaml.safe_load(Path(sandbox.config_path).read_text())["containers"]["ct201"]
    old = old_python(sandbox, "ct201", real.get("python", "python3"))
    code, checks = doctor(capsys, sandbox_config(containers={"ct201": {"python": old}}), "ct201")
    assert code == 1
    assert failing(checks) == {"python3 in ct201"}, failing(checks)
    check = checks["python3 in ct201"]
    assert check["detail"] == (
        f"ct201: {old} is Python 3.9.2; orch's agent needs Python >= 3.10 "
        "(Debian 11, Ubuntu 20.04 and Proxmox VE 7 ship 3.9)"
    )
    assert check["fix"].startswith("install Python >= 3.10 in ct201 and point python: of ct201")
    assert "upgrade the container to Debian 12 or Ubuntu 22.04" in check["fix"]
    assert checks["NVML in ct201"]["status"] == "warn"  # nvidia-smi still answers
    assert checks["python3 on sandbox"]["status"] == "ok"


@pytest.mark.e2e
def test_python_39_on_the_host_warns_and_the_probe_says_why(
    tmp_path: Path, private_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Proxmox VE 7 host (python3 3.9): doctor warns, naming the host probe and the upgrade;
    the probe itself fails with the same words. A private sandbox: its host's python3 is
    swapped for one that says 3.9.2."""
    from orchestrator.config.inventory import load_inventory
    from orchestrator.errors import AgentError
    from orchestrator.remote.target import Host
    from orchestrator.sandbox import manager
    from orchestrator.transport.connect import close_all

    state = tmp_path / "sb"
    info = manager.up(state, containers=1, gpus=8, scenario="idle", isolation=SANDBOX_ISOLATION)
    try:
        real = os.path.realpath(state / "bin" / "python3")
        if (state / "bin" / "python3").read_bytes().startswith(b"#!"):  # a venv's sh wrapper
            real = sys.executable
        (state / "bin" / "python3").unlink()
        (state / "bin" / "python3").write_text(OLD_PYTHON.replace("__REAL__", real))
        (state / "bin" / "python3").chmod(0o755)
        code, checks = doctor(capsys, info.config_path, "ct200")
        with pytest.raises(AgentError) as raised:
            Host(
                load_inventory(info.config_path), "sandbox", workdir=str(tmp_path / "probe")
            ).probe()
    finally:
        close_all()
        manager.down(state)
    check = checks["python3 on sandbox"]
    assert code == 0 and check["status"] == "warn", check
    assert check["detail"] == (
        "sandbox: python3 is Python 3.9.2; orch's host observer and host probe need Python >= 3.10 "
        "(Proxmox VE 7 ships 3.9)"
    )
    assert check["fix"].startswith("upgrade sandbox to Proxmox VE 8 (Python 3.11)")
    assert str(raised.value).startswith(check["detail"] + "; upgrade sandbox to Proxmox VE 8")


OLD_HOST_PYTHON = """#!/bin/sh
# a host's python 3.9: the agent's boot refuses it (exit 97), deploy's check reads 3.9
if [ "$1" = "-S" ]; then echo "orch agent: python 3.9 is too old" >&2; exit 97; fi
echo "3.9.18 absent"
"""


@pytest.mark.e2e
def test_doctor_says_where_each_container_is_observed_from(
    sandbox: Any, sandbox_config: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """From the host by default; from inside when the host's Python is too old (then ``orch
    check`` observes those containers from inside, and says so)."""
    if sandbox.isolation != "lxc":
        pytest.skip("process-mode containers are observed from inside")
    code, checks = doctor(capsys, sandbox_config(), "ct200")
    assert checks["host observer on sandbox"]["status"] == "ok", checks
    assert checks["ct200 observed from"]["detail"].startswith("host: ")
    old = tmp_path / "python3.9"
    old.write_text(OLD_HOST_PYTHON)
    old.chmod(0o755)
    config = sandbox_config(host={"host_python": str(old)})
    code, checks = doctor(capsys, config, "ct200")
    observer = checks["host observer on sandbox"]
    assert observer["status"] == "warn" and "3.9" in observer["detail"], observer
    assert checks["ct200 observed from"]["detail"].startswith("container: the host cannot run")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "-c",
            str(config),
            "check",
            "ct200",
            "--json",
            "--db",
            str(tmp_path / "orch.db"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    (target,) = json.loads(res.stdout)["targets"]
    assert target["reachable"] and target["observed_from"] == "container", target
