"""The pct stand-in against the session sandbox: real pct's forms, messages and exit codes.

Run locally with the sandbox sshd's environment (``run_pct``) and, marked e2e, through the
real sshd. The behaviour is pct's in both isolations; tests/sandbox/test_lxc.py has what
only real containers show (namespaces, signals, the cgroup layout).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from orchestrator.agent.procs import alive
from orchestrator.sandbox.manager import run_pct
from tests.helpers import wait_for

MISSING = "Configuration file 'nodes/sandbox/lxc/299.conf' does not exist\n"


def pct(sandbox, *args: str) -> subprocess.CompletedProcess[str]:
    return run_pct(sandbox.state_dir, *args)


def test_exec_passes_exit_status_and_signal(sandbox) -> None:
    assert pct(sandbox, "exec", "200", "--", "sh", "-c", "exit 7").returncode == 7
    assert pct(sandbox, "exec", "200", "--", "sh", "-c", "kill -TERM $$").returncode == 128 + 15
    out = pct(sandbox, "exec", "200", "--", "printf", "%s|", "a b", "$HOME", "`x`", "")
    assert out.returncode == 0 and out.stdout == "a b|$HOME|`x`||"  # argv, no shell


def test_exec_messages(sandbox) -> None:
    """A missing config is Perl's die with $! = ENOENT: exit 2, not 255."""
    cases = {
        ("exec", "200"): (255, "missing command at /usr/share/perl5/PVE/CLI/pct.pm line 263.\n"),
        ("exec", "299", "--", "true"): (2, MISSING),
        ("status", "299"): (2, MISSING),
    }
    for args, want in cases.items():
        out = pct(sandbox, *args)
        assert (out.returncode, out.stderr) == want, args
    opt = pct(sandbox, "exec", "200", "ls", "-la")  # Getopt::Long eats -la without `--`
    assert opt.returncode == 255 and opt.stderr.startswith(
        "Unknown option: la\n400 unable to parse option"
    )
    missing = pct(sandbox, "exec", "200", "--", "no-such-program")
    assert missing.returncode == 127 and 'Failed to exec "no-such-program"' in missing.stderr
    assert pct(sandbox, "exec", "200", "--", "/etc/passwd").returncode == 126
    bad = pct(sandbox, "status", "abc")
    assert bad.returncode == 255 and "type check ('integer') failed - got 'abc'" in bad.stderr


def test_exec_path_is_forced_and_the_rest_kept(sandbox) -> None:
    """pve-common's CLIHandler sets PATH=/sbin:/bin:/usr/sbin:/usr/bin before pct runs lxc-attach
    --keep-env; SSL_CERT_* are dropped (clean_environment); --keep-env 0 is lxc-attach
    --clear-env: container=lxc and a PATH, no HOME."""
    env = {"ORCH_T_KEEP": "kept", "SSL_CERT_FILE": "/x"}
    out = subprocess.run(
        [str(sandbox.state_dir / "bin" / "pct"), "exec", "200", "--", "env"],
        env={**os.environ, **sandbox.env(), **env, "PATH": f"/usr/local/bin:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    seen = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    assert seen["ORCH_T_KEEP"] == "kept" and "SSL_CERT_FILE" not in seen
    assert seen["container"] == "lxc"
    if sandbox.isolation == "lxc":
        assert seen["PATH"] == "/sbin:/bin:/usr/sbin:/usr/bin"
    else:  # process mode puts the container's own usr/bin (nvidia-smi, python3) first
        assert (
            seen["PATH"]
            == f"{sandbox.container_root(200) / 'usr/bin'}:/sbin:/bin:/usr/sbin:/usr/bin"
        )
    clear = pct(sandbox, "exec", "200", "--keep-env", "0", "--", "env").stdout.splitlines()
    assert "container=lxc" in clear and not [v for v in clear if v.startswith("HOME=")]
    assert "ORCH_T_KEEP=kept" not in clear


def test_exec_cwd_tools_and_gpus(sandbox) -> None:
    out = pct(
        sandbox,
        "exec",
        "200",
        "--",
        "sh",
        "-c",
        'pwd; echo "$HOME"; command -v nvidia-smi; command -v pct || echo no-pct; dmesg; echo $?',
    )
    lines = out.stdout.splitlines()
    if sandbox.isolation == "lxc":  # lxc-attach keeps the caller's cwd when the container has it
        assert lines[:3] == ["/root", "/root", "/bin/nvidia-smi"]  # pct: /sbin:/bin first
    else:
        root = sandbox.container_root(200)
        assert lines[:3] == [
            str(root / "root"),
            str(root / "root"),
            str(root / "usr/bin/nvidia-smi"),
        ]
    assert lines[3:] == ["no-pct", "1"]
    assert out.stderr == "dmesg: read kernel buffer failed: Operation not permitted\n"
    smi = pct(
        sandbox,
        "exec",
        "200",
        "--",
        "nvidia-smi",
        "--query-gpu=index,memory.used,utilization.gpu",
        "--format=csv,noheader",
    )
    assert smi.stdout.splitlines()[0] == "0, 118234 MiB, 98 %"


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_push_and_pull(sandbox, tmp_path: Path) -> None:
    """push/pull work in a worker: a failed copy is an error line on stderr and exit 0."""
    src = tmp_path / "script.sh"
    src.write_text("#!/bin/sh\necho hi\n")
    src.chmod(0o755)
    assert pct(sandbox, "push", "200", str(src), "/root/pushed.sh").returncode == 0
    mode = stat.S_IMODE(sandbox.host_path(200, "/root/pushed.sh").stat().st_mode)
    assert mode == 0o666 & ~_umask() and not mode & 0o111  # exec bit lost
    assert pct(sandbox, "push", "200", str(src), "/tmp/x.sh", "--perms", "755").returncode == 0
    assert stat.S_IMODE(sandbox.host_path(200, "/tmp/x.sh").stat().st_mode) == 0o755
    for args, err in (
        (
            (str(src), "/root/no/such/dir/f"),
            "failed to create file: /root/no/such/dir/f: No such file or directory\n",
        ),
        ((str(tmp_path / "nope"), "/root/f"), f"failed to open {tmp_path / 'nope'} for reading\n"),
        ((str(src), "/root/y", "--perms", "9z"), "invalid mode: '09z'\n"),
        ((str(src), "/root/y", "--user", "no-such-user"), "failed to get uid for: no-such-user\n"),
    ):
        out = pct(sandbox, "push", "200", *args)
        assert (out.returncode, out.stderr) == (0, err), args
    assert not sandbox.host_path(200, "/root/y").exists()
    assert pct(sandbox, "pull", "200", "/root/pushed.sh", str(tmp_path / "back")).returncode == 0
    assert (tmp_path / "back").read_text() == src.read_text()
    gone = pct(sandbox, "pull", "200", "/root/nope", str(tmp_path / "b2"))
    assert (gone.returncode, gone.stderr) == (
        0,
        "failed to open /root/nope: No such file or directory\n",
    )


def test_status_list_stop_start(sandbox, tmp_path: Path) -> None:
    assert pct(sandbox, "status", "202").stdout == "status: running\n"
    listing = pct(sandbox, "list").stdout.splitlines()
    assert listing[0].split() == ["VMID", "Status", "Lock", "Name"]
    assert listing[1].split() == ["200", "running", "ct200"] and len(listing) == 4
    # a tmux server and a process in ct202; stop kills both
    started = pct(sandbox, "exec", "202", "--", "tmux", "new-session", "-d", "-s", "t", "sleep 600")
    assert started.returncode == 0, started.stderr
    pids = wait_for(
        lambda: len(sandbox.container_pids(202)) >= 2 and sandbox.container_pids(202),
        10,
        what="tmux server and sleep in ct202",
    )
    try:
        assert pct(sandbox, "stop", "202").returncode == 0
        assert pct(sandbox, "status", "202").stdout == "status: stopped\n"
        wait_for(lambda: not [p for p in pids if alive(p)], 10, what="ct202 processes gone")
        assert pct(sandbox, "list").stdout.splitlines()[3].split() == ["202", "stopped", "ct202"]
        assert pct(sandbox, "exec", "202", "--", "true").stderr == "container '202' not running!\n"
        src = tmp_path / "f"
        src.write_text("x")
        refused = pct(sandbox, "push", "202", str(src), "/root/f")
        assert (refused.returncode, refused.stderr) == (
            255,
            "can only push files to a running CT\n",
        )
        assert pct(sandbox, "pull", "202", "/root/f", str(tmp_path / "g")).stderr.startswith(
            "can only pull files from a running VM at "
        )
        assert pct(sandbox, "stop", "202").stderr == "CT 202 not running\n"
    finally:
        assert pct(sandbox, "start", "202").returncode == 0
    assert pct(sandbox, "status", "202").stdout == "status: running\n"
    assert pct(sandbox, "start", "202").stderr == "CT 202 already running\n"
    # the container's /tmp starts empty (systemd-tmpfiles at boot; process mode: at stop)
    ls = pct(sandbox, "exec", "202", "--", "tmux", "ls")
    assert ls.returncode == 1 and ("no server running" in ls.stderr or "No such file" in ls.stderr)


@pytest.mark.e2e
def test_through_the_real_sshd(sandbox) -> None:
    ssh = shutil.which("ssh")
    if not ssh:
        pytest.skip("ssh client not installed (apt-get install -y openssh-client)")
    base = [
        ssh,
        "-p",
        str(sandbox.port),
        "-i",
        str(sandbox.identity_file),
        "-o",
        "BatchMode=yes",
        "-o",
        f"UserKnownHostsFile={sandbox.known_hosts_path}",
        "-o",
        "StrictHostKeyChecking=yes",
        "127.0.0.1",
    ]
    out = subprocess.run(
        [
            *base,
            "pct exec 200 -- sh -c 'nvidia-smi --query-gpu=index --format=csv,noheader "
            "| wc -l; exit 3'",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (out.returncode, out.stdout.strip()) == (3, "8")
    out = subprocess.run(
        [*base, "pct status 200; dmesg | head -1"], capture_output=True, text=True, timeout=30
    )
    assert out.stdout.startswith("status: running\n[") and "NVRM" in out.stdout


def test_every_call_spends_the_cpu_a_real_pct_spends(sandbox) -> None:
    """``pct_cpu_s`` in the state directory: every call, even a failing one, first burns that
    much CPU (a real pct's Perl start-up); without the file the stand-in's own cost stays
    well under it."""
    import resource

    def cpu_of(*args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = pct(sandbox, *args)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime, out

    knob = Path(sandbox.state_dir) / "pct_cpu_s"
    knob.write_text("0.4\n")
    try:
        spent, out = cpu_of("status", "200")
        assert out.stdout == "status: running\n" and spent >= 0.4
        spent, out = cpu_of("status", "299")
        assert (out.returncode, out.stderr) == (2, MISSING) and spent >= 0.4
    finally:
        knob.unlink()
    spent, out = cpu_of("status", "200")
    assert out.stdout == "status: running\n" and spent < 0.4
