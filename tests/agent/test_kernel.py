"""The host's kernel log, parsed (orchestrator/agent/kernel.py): the forms real drivers print.

Lines are as journalctl ``-o short-unix`` and dmesg print them, including the multi-line
"fallen off the bus" notice of newer drivers (NVSentinel #155, gpud #1209: one record with
indented continuation lines, or three records), NVSwitch SXid lines and the OOM killer's
``task_memcg`` that names the container.
"""

from __future__ import annotations

from orchestrator.agent.host import owner_of_event
from orchestrator.agent.kernel import KernelParser, parse_kernel_log
from orchestrator.wire.model import GpuProcess, GpuSample, KernelEvent

NOTICE_ONE_RECORD = [
    "1796000000.500000 pve1 kernel: NVRM: The NVIDIA GPU 0000:b3:00.0",
    "                               NVRM: (PCI ID: 10de:26b5) installed in this system has",
    "                               NVRM: fallen off the bus and is not responding to commands.",
]
NOTICE_THREE_RECORDS = [
    "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
    "[ 1843.308146] NVRM: (PCI ID: 10de:26b5) installed in this system has",
    "[ 1843.308147] NVRM: fallen off the bus and is not responding to commands.",
    "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).",
]
NEWER_XID_79 = [
    "1796000001.000000 pve1 kernel: NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', "
    "name=<unknown>, GPU has fallen off the bus.",
    "1796000001.000010 pve1 kernel: NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
    "1796000001.000020 pve1 kernel: NVRM: GPU 0000:91:00.0: GPU serial number is 1653723052734.",
]


def test_the_multi_line_notice_is_one_event_with_its_pci_address() -> None:
    for lines, boot_time in ((NOTICE_ONE_RECORD, None), (NOTICE_THREE_RECORDS, 1000.0)):
        events = parse_kernel_log(lines, None, boot_time)
        assert [(e.kind, e.pci) for e in events] == [("fallen-off-bus", "0000:b3:00.0")], events
        assert events[0].at is not None
        assert "not responding to commands" in events[0].line


def test_a_continuation_line_shares_its_record_time_and_counts_as_new() -> None:
    events = parse_kernel_log(NOTICE_ONE_RECORD, since=1796000000.0)
    assert len(events) == 1 and events[0].at == 1796000000.5


def test_an_undated_line_never_counts_as_new() -> None:
    lines = ["NVRM: Xid (PCI:0000:5d:00): 79, pid=1, name=x, GPU has fallen off the bus."]
    assert parse_kernel_log(lines, since=0.0) == []
    assert [e.xid for e in parse_kernel_log(lines, since=None)] == [79]  # everything asked for


def test_newer_drivers_xid_79_and_its_fallen_line() -> None:
    events = parse_kernel_log(NEWER_XID_79, None)
    assert [(e.kind, e.xid, e.pci) for e in events] == [
        ("xid", 79, "0000:91:00"),
        ("fallen-off-bus", None, "0000:91:00.0"),
    ]
    assert events[0].pid is None  # pid='<unknown>'


def test_sxid_lines_of_an_nvswitch() -> None:
    lines = [
        "[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
        "[6781753.404848] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60",
    ]
    events = parse_kernel_log(lines, None, 0.0)
    assert [(e.kind, e.xid, e.pci, e.process) for e in events] == [
        ("sxid", 20034, "0000:06:00.0", "nvidia-nvswitch1"),
        ("sxid", 20034, "0000:07:00.0", "nvidia-nvswitch2"),
    ]


def test_an_oom_kill_carries_the_container_of_its_memory_cgroup() -> None:
    lines = [
        "1796000002.0 pve1 kernel: oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=ns,"
        "mems_allowed=0,oom_memcg=/lxc/201,task_memcg=/lxc/201/ns/user.slice,task=python3,"
        "pid=41234,uid=0",
        "1796000002.1 pve1 kernel: Memory cgroup out of memory: Killed process 41234 (python3) "
        "total-vm:81234560kB, anon-rss:65432100kB",
        "1796000003.0 pve1 kernel: Out of memory: Killed process 777 (java) total-vm:1kB",
    ]
    events = parse_kernel_log(lines, None)
    assert [(e.pid, e.vmid, e.memcg) for e in events] == [
        (41234, 201, "/lxc/201/ns/user.slice"),
        (777, None, None),
    ]


def test_the_memory_cgroup_line_may_come_in_an_earlier_read() -> None:
    parser = KernelParser(boot=0)
    first = parser.feed(["5.0 h kernel: oom-kill:task_memcg=/orch-1/lxc/200/ns,task=x,pid=9,uid=0"])
    first += parser.flush()
    second = parser.feed(["6.0 h kernel: Out of memory: Killed process 9 (x)"]) + parser.flush()
    assert first == [] and [(e.vmid, e.boot) for e in second] == [(200, 0)]


def test_an_xid_belongs_to_the_container_holding_its_gpu() -> None:
    gpus = [
        GpuSample(
            index=3, pci_bus_id="00000000:5D:00.0", processes=(GpuProcess(pid=41234, vmid=201),)
        ),
        GpuSample(index=4, pci_bus_id="00000000:5E:00.0", processes=()),
    ]
    xid = KernelEvent(kind="xid", line="x", at=1.0, xid=79, pci="0000:5d:00")
    assert owner_of_event(xid, gpus, {}, {}).vmid == 201
    free = KernelEvent(kind="xid", line="y", at=1.0, xid=79, pci="0000:5e:00")
    assert owner_of_event(free, gpus, {}, {}).vmid is None  # nobody: the host's
    assert owner_of_event(free, gpus, {}, {200: [4]}).vmid == 200  # the one run that claims it
    assert owner_of_event(free, gpus, {}, {200: [4], 202: [4]}).vmid is None  # two: the host's
    named = KernelEvent(kind="xid", line="z", at=1.0, xid=13, pci="0000:5e:00", pid=55)
    assert owner_of_event(named, gpus, {55: 202}, {}).vmid == 202  # the process it names
