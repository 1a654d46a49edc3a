"""``orch init``: from flags (stdin not a terminal), and answering its questions in a real tmux pane."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import run
from orchestrator.config.inventory import load_inventory
from tests.firstrun.tmuxpane import Pane

ORCH = [sys.executable, "-m", "orchestrator.cli"]
REPO = str(Path(__file__).resolve().parents[2])
needs_tmux = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)"
)


def _isolated_env(tmp_path: Path) -> dict[str, str]:
    """HOME and XDG dirs inside tmp_path: nothing the test does touches the real ~/.ssh or ~/.config."""
    return {
        "HOME": str(tmp_path / "home"),
        "XDG_CONFIG_HOME": str(tmp_path / "home" / ".config"),
        "XDG_STATE_HOME": str(tmp_path / "home" / ".local" / "state"),
        "PYTHONPATH": REPO,
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }


def test_flags_write_a_valid_private_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cfg" / "hosts.yaml"
    code = run(
        [
            "init",
            "--out",
            str(out),
            "--host",
            "pve7",
            "--address",
            "10.1.2.7",
            "--user",
            "admin",
            "--port",
            "2222",
            "--vmid",
            "305",
            "--gpus",
            "0-7",
            "--workdir",
            "/srv/train",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert stat.S_IMODE(out.parent.stat().st_mode) == 0o700  # created by orch init
    inv = load_inventory(out)
    host, ct = inv.hosts["pve7"], inv.containers["lxc305"]
    assert (host.address, host.port, host.user) == ("10.1.2.7", 2222, "admin")
    assert (ct.host, ct.vmid, ct.workdir, ct.gpus) == (
        "pve7",
        305,
        "/srv/train",
        {"target": tuple(range(8))},
    )
    assert f"orch -c {out} trust pve7" in printed  # not interactive: trust is only suggested
    assert f"orch -c {out} doctor lxc305" in printed


def test_roles_and_names_with_odd_characters_round_trip(tmp_path: Path) -> None:
    out = tmp_path / "hosts.yaml"
    code = run(
        [
            "init",
            "--out",
            str(out),
            "--address",
            "pve.example.org",
            "--gpus",
            "target=0-4 drafter=5-7",
            "--workdir",
            "/root/my runs #1",
            "--container",
            "yes",
        ]
    )
    assert code == 0
    ct = load_inventory(out).containers["yes"]
    assert ct.workdir == "/root/my runs #1"
    assert ct.gpus == {"target": (0, 1, 2, 3, 4), "drafter": (5, 6, 7)}


def test_refuses_to_overwrite_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "hosts.yaml"
    out.write_text("# mine, hand written\n")
    code = run(["init", "--out", str(out), "--address", "10.0.0.1"])
    err = capsys.readouterr().err
    assert code == 4
    assert "already exists" in err and "--force" in err
    assert out.read_text() == "# mine, hand written\n"
    assert not list(tmp_path.glob("*.bak*"))


def test_force_keeps_the_old_file_as_bak_and_never_overwrites_a_backup(tmp_path: Path) -> None:
    out = tmp_path / "hosts.yaml"
    out.write_text("# first\n")
    assert run(["init", "--out", str(out), "--address", "10.0.0.1", "--force"]) == 0
    assert (tmp_path / "hosts.yaml.bak").read_text() == "# first\n"
    first_written = out.read_text()
    assert run(["init", "--out", str(out), "--address", "10.0.0.2", "--force"]) == 0
    assert (tmp_path / "hosts.yaml.bak").read_text() == "# first\n"
    assert (tmp_path / "hosts.yaml.bak.1").read_text() == first_written
    assert load_inventory(out).hosts["pve1"].address == "10.0.0.2"


def test_bad_value_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "hosts.yaml"
    code = run(["init", "--out", str(out), "--port", "70000"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0 and "hosts.pve1.port" in err and "65535" in err
    assert not out.exists()


def test_not_a_terminal_never_prompts(tmp_path: Path) -> None:
    """A real process with stdin from /dev/null and no flags: defaults, no question, exit 0."""
    env = _isolated_env(tmp_path)
    proc = subprocess.run(
        [*ORCH, "init"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "?" not in proc.stdout and "[" not in proc.stdout  # no prompt was shown
    written = tmp_path / "home" / ".config" / "orch" / "hosts.yaml"  # the default place
    inv = load_inventory(written)
    assert inv.hosts["pve1"].address == "pve1" and inv.containers["lxc200"].vmid == 200
    assert "orch trust pve1" in proc.stdout  # the default path needs no -c


@needs_tmux
def test_interactive_answers_through_a_real_terminal(tmp_path: Path) -> None:
    out = tmp_path / "hosts.yaml"
    pane = Pane(
        [*ORCH, "init", "--out", str(out), "--vmid", "210"], _isolated_env(tmp_path), str(tmp_path)
    )
    try:
        pane.answer("Name of the Proxmox host (used in orch commands) [pve1]:", "gpu-node")
        pane.answer("Its address (IP or DNS name) for SSH [gpu-node]:", "10.9.8.7")
        pane.answer("SSH user on the host (pct needs root) [root]:", "")
        pane.answer("SSH port [22]:", "twenty-two")  # refused, asked again
        pane.wait_text("is not a whole number")
        pane.answer("SSH port [22]:", "2201", count=2)
        assert "Container id" not in pane.text()  # --vmid was given: not asked
        pane.answer("Name for that container in orch [lxc210]:", "")
        pane.answer("[all]:", "target=0-5 drafter=6-7")
        pane.answer(
            "Working directory in the container (runs and logs go here) [/root/orch]:",
            "/root/dflash",
        )
        pane.answer("(orch trust gpu-node)? [Y/n]:", "n")
        assert pane.exit_status() == 0, pane.text()
        text = pane.text()
    finally:
        pane.close()
    assert "next: orch -c" in text and "trust gpu-node" in text
    inv = load_inventory(out)
    host, ct = inv.hosts["gpu-node"], inv.containers["lxc210"]
    assert (host.address, host.port, host.user) == ("10.9.8.7", 2201, "root")
    assert (ct.vmid, ct.workdir) == (210, "/root/dflash")
    assert ct.gpus == {"target": tuple(range(6)), "drafter": (6, 7)}


@needs_tmux
@pytest.mark.e2e
def test_interactive_init_then_trust_records_the_sandbox_key(
    tmp_path: Path, sandbox: object
) -> None:
    """A first run against the sandbox: answer the questions, accept orch trust, and the key
    lands in ~/.ssh/known_hosts (a HOME inside tmp_path), after which doctor finds it known."""
    info = sandbox
    out = tmp_path / "hosts.yaml"
    env = _isolated_env(tmp_path)
    argv = [*ORCH, "init", "--out", str(out), "--identity-file", str(info.identity_file)]  # type: ignore[attr-defined]
    pane = Pane(argv, env, str(tmp_path))
    try:
        pane.answer("[pve1]:", "sandbox")
        pane.answer("[sandbox]:", "127.0.0.1")
        pane.answer(
            "[root]:",
            os.environ.get("USER") or subprocess.check_output(["id", "-un"], text=True).strip(),
        )
        pane.answer("SSH port [22]:", str(info.port))  # type: ignore[attr-defined]
        pane.answer("[200]:", "200")
        pane.answer("[lxc200]:", "ct200")
        pane.answer("[all]:", "0-7")
        pane.answer("[/root/orch]:", info.container_workdir("ct200"))  # type: ignore[attr-defined]
        pane.answer("(orch trust sandbox)? [Y/n]:", "y")
        pane.wait_text("fingerprint SHA256:")
        pane.answer("known_hosts? [y/N]:", "y")
        assert pane.exit_status() == 0, pane.text()
    finally:
        pane.close()
    known = Path(env["HOME"]) / ".ssh" / "known_hosts"
    assert f"[127.0.0.1]:{info.port} ssh-ed25519 " in known.read_text()  # type: ignore[attr-defined]
    proc = subprocess.run(
        [*ORCH, "-c", str(out), "doctor", "--json"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    checks = {c["name"]: c for c in __import__("json").loads(proc.stdout)["checks"]}
    assert checks["host key of sandbox"]["ok"], checks["host key of sandbox"]
    assert checks["identity file for sandbox"]["ok"]
