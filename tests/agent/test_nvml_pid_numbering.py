"""NVML's process list inside a container in both numberings, on real LXC containers.

Drivers up to 535.104.05 give a container every GPU process's host PID; since 535.113.01
the resource manager gives the caller's own PID-namespace PIDs and leaves out what it
cannot see (open-gpu-kernel-modules src/nvidia/src/kernel/gpu/gpu_rmapi.c _gpuConvertPid ->
kernel-open/nvidia/os-interface.c os_find_ns_pid, pid_vnr). The fake driver answers either
way (scenario ``pid_numbering``). Under both, the ghost check, launch's GPU-holders
preflight and the host probe's attribution name the right container and process, and the
host observer (NVML on the host: host PIDs) stays right.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import SANDBOX_ISOLATION, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.unprivileged]
DRIVERS = {"host": "535.104.05", "namespace": "535.113.01"}


@pytest.fixture(scope="module")
def ct(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from orchestrator.sandbox import manager
    from orchestrator.transport.connect import close_all

    if SANDBOX_ISOLATION == "process":
        pytest.skip("PID namespaces need real containers (LXC)")
    state_dir = tmp_path_factory.mktemp("nvmlpids")
    info = manager.up(state_dir, containers=2, gpus=4, scenario="idle", isolation=SANDBOX_ISOLATION)
    if info.isolation != "lxc":
        manager.down(state_dir)
        pytest.skip(f"LXC containers cannot run here: {info.fallback}")
    try:
        yield info
    finally:
        close_all()
        manager.down(state_dir)


@pytest.fixture(scope="module")
def sleepers(ct) -> Iterator[dict[str, tuple[int, int]]]:  # type: ignore[no-untyped-def]
    """A process in ct200 and one in ct201: name -> (host PID, PID inside)."""
    procs, out = [], {}
    env = {**os.environ, **ct.env(), "PATH": f"{ct.state_dir / 'bin'}:{os.environ['PATH']}"}
    for name, argv in (("ct200", ["sleep", "700.25"]), ("ct201", ["sleep", "700.5"])):
        procs.append(
            subprocess.Popen(
                [str(ct.state_dir / "bin" / "pct"), "exec", name[2:], "--", *argv],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        want = [a.encode() for a in argv]

        def found(name: str = name, want: list[bytes] = want) -> int | None:
            for pid in ct.container_pids(name):
                try:
                    if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == want:
                        return pid
                except OSError:
                    continue
            return None

        host = wait_for(found, 20, what=f"{argv} in {name}")
        status = Path(f"/proc/{host}/status").read_text()
        out[name] = (
            host,
            int(next(x for x in status.splitlines() if x.startswith("NSpid:")).split()[-1]),
        )
    try:
        yield out
    finally:
        for name in out:
            subprocess.run(
                [
                    str(ct.state_dir / "bin" / "pct"),
                    "exec",
                    name[2:],
                    "--",
                    "pkill",
                    "-f",
                    "^sleep 700",
                ],
                env=env,
                capture_output=True,
                timeout=30,
            )
        for p in procs:
            p.kill()
            p.wait(10)


def _scenario(ct, sleepers, numbering: str, driver: str) -> None:  # type: ignore[no-untyped-def]
    """GPU 3 a ghost (100 %, 0 MiB) held by ct200's sleeper, GPU 2 busy with ct201's."""
    from orchestrator.sandbox import manager

    _name, doc = manager.load_scenario("ghost")
    doc["devices"][3]["processes"] = [{"pid": sleepers["ct200"][0], "used_mib": 0}]
    doc["devices"][2].update(
        mem_used_mib=2000, util_pct=50, processes=[{"pid": sleepers["ct201"][0], "used_mib": 2000}]
    )
    manager.set_scenario(
        ct.state_dir,
        {**doc, "name": f"pids-{numbering}", "pid_numbering": numbering, "driver_version": driver},
    )


def _inventory(ct):  # type: ignore[no-untyped-def]
    from orchestrator.config.inventory import load_inventory

    return load_inventory(Path(ct.config_path))


@pytest.mark.parametrize("numbering", ["host", "namespace"])
def test_both_numberings_name_the_right_container(ct, sleepers, numbering: str) -> None:  # type: ignore[no-untyped-def]
    from orchestrator.config.limits import Limits
    from orchestrator.detect.gpu import attributed, ghost_utilization
    from orchestrator.lifecycle.preflight import PreflightRefused, preflight
    from orchestrator.remote.hostlink import HostLink
    from orchestrator.remote.target import Host, Target

    _scenario(ct, sleepers, numbering, DRIVERS[numbering])
    (a_host, a_in), (b_host, b_in) = sleepers["ct200"], sleepers["ct201"]
    inv = _inventory(ct)
    snap = Target(inv, "ct200").snapshot()
    assert snap.nvml is not None and snap.nvml.pid_numbering == numbering
    seen3 = [p.pid for p in snap.gpus[3].processes or ()]
    seen2 = [p.pid for p in snap.gpus[2].processes or ()]
    if numbering == "namespace":  # its own PID inside; ct201's process is not listed at all
        assert (seen3, seen2) == ([a_in], [])
        assert (snap.gpus[3].processes or ())[0].name == "sleep"
    else:
        assert (seen3, seen2) == ([a_host], [b_host])

    probe = Host(inv, "sandbox").probe()
    (p3,) = attributed(snap.gpus[3], 200, [probe], snap.nvml.pid_numbering) or ()
    assert (p3.pid, p3.vmid, p3.container_pid, p3.name) == (a_host, 200, a_in, "sleep")

    history = [dataclasses.replace(snap, taken_at=snap.taken_at + i) for i in range(3)]
    (ghost,) = ghost_utilization(history, Limits(), [probe])
    assert f"held by 1 process(es): sleep (pid {a_in} in CT 200)" in ghost.summary, ghost.summary

    with pytest.raises(PreflightRefused) as refused:
        preflight(Target(inv, "ct200"), gpus=[2, 3], bundled=False, force=False)
    problems = "\n".join(refused.value.problems)
    assert f"GPU 3 busy: 0 MiB used, processes: pid {a_in} in CT 200 sleep" in problems, problems
    if numbering == "host":
        assert f"pid {b_in} in CT 201 (2000 MiB) sleep" in problems, problems
    else:
        assert "GPU 2 busy: 2000 MiB used;" in problems, problems

    doc = HostLink(inv, "sandbox", ["ct200", "ct201"]).observe()  # NVML on the host: host PIDs
    (h3,) = doc.gpus[3].processes or ()
    assert (h3.pid, h3.vmid, h3.container_pid) == (a_host, 200, a_in)


def test_a_pid_not_in_the_container_is_a_host_pid_whatever_the_version(ct, sleepers) -> None:  # type: ignore[no-untyped-def]
    """The evidence wins: a namespace-era version string on a driver that answers host PIDs."""
    from orchestrator.remote.target import Target

    _scenario(ct, sleepers, "host", DRIVERS["namespace"])
    snap = Target(_inventory(ct), "ct200").snapshot()
    assert snap.nvml is not None and snap.nvml.pid_numbering == "host"
    assert [p.pid for p in snap.gpus[3].processes or ()] == [sleepers["ct200"][0]]


def test_the_fake_driver_answers_each_namespace_its_own(ct, sleepers) -> None:  # type: ignore[no-untyped-def]
    """Raw pynvml inside each container and on the host, under ``pid_numbering: namespace``."""
    import sys

    from orchestrator.sandbox.manager import run_pct

    _scenario(ct, sleepers, "namespace", DRIVERS["namespace"])
    code = (
        "import pynvml as n; n.nvmlInit()\n"
        "print(*[len(n.nvmlDeviceGetComputeRunningProcesses(n.nvmlDeviceGetHandleByIndex(i))) "
        "and n.nvmlDeviceGetComputeRunningProcesses(n.nvmlDeviceGetHandleByIndex(i))[0].pid "
        "for i in (2, 3)])"
    )
    for vmid, want in (("200", f"0 {sleepers['ct200'][1]}"), ("201", f"{sleepers['ct201'][1]} 0")):
        out = run_pct(ct.state_dir, "exec", vmid, "--", sys.executable, "-c", code)
        assert out.stdout.strip() == want, out.stderr
        # nvidia-smi asks the same NVML: the same PIDs (the stand-in follows the fake driver)
        smi = run_pct(
            ct.state_dir,
            "exec",
            vmid,
            "--",
            "nvidia-smi",
            "--query-compute-apps=pid",
            "--format=csv,noheader",
        )
        assert smi.stdout.split() == [w for w in want.split() if w != "0"], smi.stderr
