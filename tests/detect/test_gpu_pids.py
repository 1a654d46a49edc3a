"""NVML's PIDs inside a container, joined with the host probe, in both numberings (pure).

The same host: ct200's trainer is host PID 4242, PID 17 inside; ct201's is host PID 5151,
PID 17 inside too (each container numbers from 1); a host process is PID 900.
"""

from __future__ import annotations

import pytest

from orchestrator.agent.gpupids import decide_numbering
from orchestrator.detect.gpu import attributed, probe_numbering
from orchestrator.lifecycle.preflight import busy_gpus
from orchestrator.wire.formats import nvml_pid_numbering
from orchestrator.wire.model import GpuProcess, GpuSample, HostProbe, NvmlStatus, Snapshot

PROBE = HostProbe(
    "pve1",
    0.0,
    gpu_processes=(
        GpuProcess(pid=4242, vmid=200, container_pid=17, name="python3", used_memory_mib=900.0),
        GpuProcess(pid=5151, vmid=201, container_pid=17, name="torchrun", used_memory_mib=800.0),
        GpuProcess(pid=900, name="Xorg"),
    ),
)


def test_host_numbering_names_every_holder_by_its_host_pid() -> None:
    sample = GpuSample(
        index=0, processes=(GpuProcess(pid=4242), GpuProcess(pid=5151), GpuProcess(pid=900))
    )
    assert probe_numbering({4242, 5151, 900}, 200, PROBE) == "host"
    got = attributed(sample, 200, [PROBE], "namespace")  # the evidence wins over the agent's word
    assert [(p.vmid, p.container_pid, p.name) for p in got or ()] == [
        (200, 17, "python3"),
        (201, 17, "torchrun"),
        (None, None, "Xorg"),
    ]


def test_namespace_numbering_is_this_containers_own_pid_inside() -> None:
    """PID 17 in ct200's list is ct200's trainer, never ct201's PID 17 nor host PID 17."""
    sample = GpuSample(index=0, processes=(GpuProcess(pid=17, container_pid=17, name="python3"),))
    assert probe_numbering({17}, 200, PROBE) == "namespace"
    (p,) = attributed(sample, 200, [PROBE], "namespace") or ()
    assert (p.pid, p.vmid, p.container_pid) == (4242, 200, 17)
    (q,) = attributed(sample, 201, [PROBE], "namespace") or ()
    assert (q.pid, q.vmid, q.name) == (5151, 201, "torchrun")


@pytest.mark.parametrize(
    ("numbering", "pid", "want"),
    [
        ("host", 5151, "pid 17 in CT 201 (800 MiB) torchrun"),
        ("namespace", 17, "pid 17 in CT 200 (900 MiB) python3"),
    ],
)
def test_the_launch_preflight_names_the_holder(numbering: str, pid: int, want: str) -> None:
    proc = GpuProcess(
        pid=pid,
        used_memory_mib=900.0 if numbering == "namespace" else 800.0,
        **({"container_pid": pid, "name": "python3"} if numbering == "namespace" else {}),
    )
    snap = Snapshot(
        "ct200",
        0.0,
        vmid=200,
        nvml=NvmlStatus(ok=True, pid_numbering=numbering),
        gpus=(GpuSample(index=0, memory_used_mib=2000.0, processes=(proc,)),),
    )
    (line,) = busy_gpus(snap, [0], 1024.0, [PROBE])
    assert line == f"GPU 0 busy: 2000 MiB used, processes: {want}"


def test_no_probe_namespace_pids_are_still_this_containers() -> None:
    snap = Snapshot(
        "ct200",
        0.0,
        vmid=200,
        nvml=NvmlStatus(ok=True, pid_numbering="namespace"),
        gpus=(
            GpuSample(
                index=0,
                memory_used_mib=0.0,
                processes=(GpuProcess(pid=17, container_pid=17, name="python3"),),
            ),
        ),
    )
    assert busy_gpus(snap, [0], 1024.0) == [
        "GPU 0 busy: 0 MiB used, processes: pid 17 in CT 200 python3"
    ]


@pytest.mark.parametrize(
    ("version", "want"),
    [
        ("515.43.04", "host"),
        ("530.41.03", "host"),
        ("535.43.23", "host"),
        ("535.43.24", "namespace"),
        ("535.43.28", "namespace"),
        ("535.54.03", "host"),
        ("535.104.12", "host"),
        ("535.113.01", "namespace"),
        ("545.23.06", "namespace"),
        ("595.45.04", "namespace"),
        ("garbage", None),
        ("", None),
    ],
)
def test_driver_versions_from_the_open_kernel_modules_tags(version: str, want: str | None) -> None:
    """Each row: whether kernel-open/nvidia/os-interface.c has os_find_ns_pid's pid_vnr at
    that tag of github:NVIDIA/open-gpu-kernel-modules."""
    assert nvml_pid_numbering(version) == want
    assert decide_numbering({17}, set(), version) == want
    assert decide_numbering({4242}, {4242}, version) == "host"
