"""A GPU process's user, CPU % and command (orchestrator/agent/procdetails.py).

A /proc tree written in a temp directory stands in for the host's where the numbers must be
exact (an unprivileged container's uid 101234, its uid_map, its root with its own passwd,
a planted symlink); the real /proc for a real process inside this machine's namespace (the
in-container path, orchestrator/agent/gpupids.py).
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.agent import gpupids
from orchestrator.agent.procdetails import ProcDetails
from orchestrator.agent.procs import _CLK_TCK
from orchestrator.wire.model import GpuProcess, GpuSample, NvmlStatus
from orchestrator.wire.text import MAX_COMMAND_CHARS

PASSWD = "root:x:0:0:root:/root:/bin/bash\ntrainee:x:1234:1234::/home/trainee:/bin/sh\n"


def fake_proc(
    tmp: Path,
    pid: int,
    *,
    uid: int,
    uid_map: str,
    cmdline: bytes,
    ticks: int = 500,
    start: int = 10 * _CLK_TCK,
    uptime_s: float = 20.0,
    passwd: str | None = PASSWD,
) -> Path:
    """``tmp/proc`` with process ``pid`` as the kernel writes its files (proc(5)); its ``root``
    a directory standing for the container's root file system."""
    proc = tmp / "proc"
    d = proc / str(pid)
    (d / "root" / "etc").mkdir(parents=True)
    utime, stime = ticks - ticks // 5, ticks // 5
    (d / "stat").write_text(
        f"{pid} (python3) S 1 {pid} {pid} 0 -1 4194560 1 0 0 0 {utime} {stime} "
        f"0 0 20 0 7 0 {start} 1 2560 x\n"
    )
    (d / "status").write_text(
        f"Name:\tpython3\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nNSpid:\t{pid}\t17\n"
    )
    (d / "uid_map").write_text(uid_map)
    (d / "cmdline").write_bytes(cmdline)
    if passwd is not None:
        (d / "root" / "etc" / "passwd").write_text(passwd)
    (proc / "uptime").write_text(f"{uptime_s} 1.0\n")
    return proc


def one(details: ProcDetails, pid: int) -> GpuProcess:
    (g,) = details.fill((GpuSample(0, processes=(GpuProcess(pid, used_memory_mib=1.0),)),))
    (p,) = g.processes or ()
    return p


@pytest.mark.parametrize(
    ("uid", "uid_map", "user"),
    [
        (101234, "         0     100000      65536\n", "trainee"),  # unprivileged: pve's map
        (1234, "         0          0 4294967295\n", "trainee"),  # privileged: the identity
        (100000, "         0     100000      65536\n", "root"),
        (104321, "         0     100000      65536\n", "4321"),  # no passwd entry: the digits
        (5, "         0     100000      65536\n", None),  # outside the map: not the container's
    ],
)
def test_the_user_is_the_containers_name_for_the_mapped_uid(tmp_path, uid, uid_map, user) -> None:
    proc = fake_proc(tmp_path, 4242, uid=uid, uid_map=uid_map, cmdline=b"python3\0train.py\0")
    p = one(ProcDetails(str(proc)), 4242)
    assert p.user == user
    assert p.command == "python3 train.py"
    # first sample: the average since it started (500 ticks over 20 s - 10 s of uptime)
    assert p.cpu_pct == pytest.approx(100.0 * 500 / _CLK_TCK / 10.0, abs=0.1)


def test_a_planted_passwd_symlink_never_reads_a_host_file(tmp_path) -> None:
    """The container's root may make /etc/passwd point at the host's: it resolves inside."""
    proc = fake_proc(
        tmp_path, 4242, uid=101234, uid_map="0 100000 65536\n", cmdline=b"x\0", passwd=None
    )
    host = tmp_path / "host-passwd"
    host.write_text("hostonly:x:1234:1234::/:/bin/sh\n")
    (proc / "4242" / "root" / "etc" / "passwd").symlink_to(host)
    assert one(ProcDetails(str(proc)), 4242).user == "1234"


def test_the_command_is_bounded_masked_and_shown_never_interpreted(tmp_path) -> None:
    raw = b"python3\0train.py\0--hf-token=hf_secret\0--password\0pw12\0\x1b]0;t\x07\0" + b"a" * 9000
    proc = fake_proc(tmp_path, 4242, uid=0, uid_map="0 0 4294967295\n", cmdline=raw)
    cmd = one(ProcDetails(str(proc)), 4242).command
    assert cmd is not None and len(cmd) == MAX_COMMAND_CHARS and cmd.endswith("…")
    assert cmd.startswith("python3 train.py --hf-token=*** --password *** ␛]0;t␇ aaa")
    assert "hf_secret" not in cmd and "pw12" not in cmd


def test_a_gone_process_keeps_its_fields_empty_and_cpu_is_per_interval(tmp_path) -> None:
    proc = fake_proc(tmp_path, 4242, uid=0, uid_map="0 0 4294967295\n", cmdline=b"x\0")
    details = ProcDetails(str(proc))
    gone = one(details, 999)
    assert (gone.user, gone.cpu_pct, gone.command) == (None, None, None)
    one(details, 4242)
    stat = proc / "4242" / "stat"
    stat.write_text(stat.read_text().replace(" 400 100 ", " 100400 100 "))  # 1000 s of CPU more
    assert one(details, 4242).cpu_pct > 1000.0  # over the (short) interval, not since start


def test_inside_a_container_the_agent_reads_its_own_processes() -> None:
    """The in-container path under namespace numbering (a driver since 535.113.01): the PID
    NVML gives is this namespace's; user from this /etc/passwd, no id map."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", "--api-key", "k3y9"],
        stdin=subprocess.DEVNULL,
    )
    try:
        sample = GpuSample(0, processes=(GpuProcess(child.pid, used_memory_mib=10.0),))
        (g,), status = gpupids.in_container(
            (sample,), NvmlStatus(ok=True, driver_version="570.172.08")
        )
        (p,) = g.processes or ()
        assert status.pid_numbering == "namespace" and p.container_pid == child.pid
        assert p.user == pwd.getpwuid(os.getuid()).pw_name
        assert p.command is not None and p.command.endswith(
            '"import time; time.sleep(600)" --api-key ***'
        )
        # a process started in this clock tick has no average yet (None); the next collection
        # gives the interval's
        (g,), _status = gpupids.in_container((sample,), status)
        (p,) = g.processes or ()
        assert p.cpu_pct is not None and p.cpu_pct >= 0.0
    finally:
        child.kill()
        child.wait(10)
