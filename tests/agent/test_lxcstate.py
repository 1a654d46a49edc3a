"""LXC's word on the sandbox's containers (orchestrator/agent/lxcstate.py): the command
sockets in ``/proc/net/unix`` and ``lxc-info -p``, as pve-container's pct learns them, agree
with pct itself; a container LXC has never heard of is left to pct."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.agent.hostprocs import start_ticks
from orchestrator.agent.lxcstate import LxcState
from orchestrator.sandbox.manager import run_pct

pytestmark = pytest.mark.e2e


def test_running_and_init_pid_as_pct_says(sandbox) -> None:
    if sandbox.isolation != "lxc":
        pytest.skip("process mode has no LXC command sockets")
    lxc = LxcState(str(Path(sandbox.state_dir) / "lxc"))
    vmids = [int(c[2:]) for c in ("ct200", "ct201", "ct202")]
    assert lxc.active([*vmids, 299]) == dict.fromkeys(vmids, True)  # 299: none of LXC's
    for vmid in vmids:
        verbose = run_pct(sandbox.state_dir, "status", str(vmid), "--verbose").stdout
        want = next(int(ln.split()[1]) for ln in verbose.splitlines() if ln.startswith("pid:"))
        pid, why = lxc.init_pid(vmid)
        assert (pid, why) == (want, "") and start_ticks(pid) is not None


def test_an_unreadable_proc_or_no_lxcpath_tells_nothing(sandbox, tmp_path) -> None:
    assert LxcState(str(tmp_path / "none")).active([200]) == {}
    if sandbox.isolation == "lxc":
        blind = LxcState(str(Path(sandbox.state_dir) / "lxc"), proc=str(tmp_path))
        assert blind.active([200]) is None
    assert os.path.isdir("/proc/net")
