"""Held-out kernel-log lines, written after the parser and the format table were frozen:
lines as real hosts print them (the drivers' own example comments, Proxmox VE 7 and 8 hosts'
port lines of both kernels' promiscuous-mode forms, other tools' prefixes), each with the
event (or none) it must give and its owner. Scored before any fix: see the test's assert."""

from __future__ import annotations

import pytest

from orchestrator.agent.savedlog import parse_saved_log

_GA100 = "src/nvidia/src/kernel/gpu/arch/ampere/kern_gpu_error_cont_ga100.c (580.65.06:313-319)"
# (lines, expected events: (kind, xid, pci, gpu_instance, compute_instance, vmid, device), source)
HELD_OUT: list[tuple[list[str], list[tuple[object, ...]], str]] = [
    (
        [
            "[ 4212.1] NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No"
        ],
        [("xid", 94, "0000:01:00", 5, None, None, None)],
        _GA100,
    ),
    (
        [
            "[ 4212.2] NVRM: Xid (PCI:0000:01:00): 95, pid=7062, Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No"
        ],
        [("xid", 95, "0000:01:00", None, None, None, None)],
        _GA100,
    ),
    (
        [
            "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 1, SM 0)"
        ],
        [("xid", 13, "0000:cb:00", None, None, None, None)],
        "a 535 host's dmesg -T",
    ),
    (
        [
            "2024-05-01T10:00:00.123456+0000 gpu7 kernel: NVRM: Xid (PCI:0000:b3:00 GPU-I:13 GPU-CI:07): 43, pid=881, name=python, Ch 00000008"
        ],
        [("xid", 43, "0000:b3:00", 13, 7, None, None)],
        "journalctl -o short-iso-precise, H100 MIG",
    ),
    (
        [
            "kern  :warn  : [  99.000000] NVRM: Xid (PCI:0000:3b:00 GPU-I:02): 31, pid=12, name=a.out, Ch 00000002, intr 00000000. MMU Fault"
        ],
        [("xid", 31, "0000:3b:00", 2, None, None, None)],
        "dmesg -x",
    ),
    (
        [
            "<4>[  99.5] nvidia-nvswitch0: SXid (PCI:0000:c1:00.0): 20034, Fatal, Link 12 LTSSM Fault Up"
        ],
        [("sxid", 20034, "0000:c1:00.0", None, None, None, None)],
        "dmesg -r",
    ),
    (
        ["Dec  2 04:00:01 pve kernel: [ 88.1] NVRM: GPU 0000:41:00.0: GPU has fallen off the bus."],
        [("fallen-off-bus", None, "0000:41:00.0", None, None, None, None)],
        "/var/log/kern.log",
    ),
    # Proxmox VE 7 (5.15: "device %s entered promiscuous mode"): VM 105 starts with the firewall
    (
        [
            "[ 10.000] fwbr105i0: port 1(fwln105i0) entered blocking state",
            "[ 10.001] fwbr105i0: port 1(fwln105i0) entered disabled state",
            "[ 10.002] device fwln105i0 entered promiscuous mode",
            "[ 10.003] fwbr105i0: port 1(fwln105i0) entered blocking state",
            "[ 10.004] fwbr105i0: port 1(fwln105i0) entered forwarding state",
            "[ 10.010] vmbr0: port 3(fwpr105p0) entered blocking state",
            "[ 10.011] vmbr0: port 3(fwpr105p0) entered disabled state",
            "[ 10.012] device fwpr105p0 entered promiscuous mode",
            "[ 10.013] vmbr0: port 3(fwpr105p0) entered blocking state",
            "[ 10.014] vmbr0: port 3(fwpr105p0) entered forwarding state",
            "[ 10.020] fwbr105i0: port 2(tap105i0) entered blocking state",
            "[ 10.021] fwbr105i0: port 2(tap105i0) entered disabled state",
            "[ 10.022] fwbr105i0: port 2(tap105i0) entered blocking state",
            "[ 10.023] fwbr105i0: port 2(tap105i0) entered forwarding state",
        ],
        [],
        "a PVE 7 VM start",
    ),
    # Proxmox VE 8 (6.8: netdev_info "%s promiscuous mode"): container 204 stops, no firewall
    (
        [
            "[ 50.000] vmbr0: port 4(veth204i0) entered disabled state",
            "[ 50.010] veth204i0 (unregistering): left allmulticast mode",
            "[ 50.011] veth204i0 (unregistering): left promiscuous mode",
            "[ 50.012] vmbr0: port 4(veth204i0) entered disabled state",
        ],
        [],
        "a PVE 8 container stop",
    ),
    (
        ["[ 70.0] vmbr0: port 3(tap105i0) entered disabled state"],
        [("link-down", None, None, None, None, 105, "tap105i0")],
        "VM 105's link down: its own",
    ),
    (
        ["[ 70.0] vmbr1: port 1(enp65s0f0) entered disabled state"],
        [("link-down", None, None, None, None, None, "enp65s0f0")],
        "the host's uplink on vmbr1",
    ),
    (
        ["[ 70.0] vmbr0v20: port 2(fwpr110p1) entered disabled state"],
        [("link-down", None, None, None, None, 110, "fwpr110p1")],
        "a VLAN bridge's firewall port",
    ),
    (
        ["[ 80.0] mlx5_core 0000:41:00.0 ens1f0np0: Link down"],
        [("link-down", None, None, None, None, None, "ens1f0np0")],
        "a ConnectX NIC",
    ),
    (
        [
            "[ 90.0] \x00\x01\xff binary NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
        ],
        [("xid", 79, "0000:3b:00", None, None, None, None)],
        "binary bytes before the record",
    ),
]


def _events(lines: list[str]) -> list[tuple[object, ...]]:
    return [
        (e.kind, e.xid, e.pci, e.gpu_instance, e.compute_instance, e.vmid, e.device)
        for e in parse_saved_log(lines)
    ]


@pytest.mark.parametrize(("lines", "want", "source"), HELD_OUT, ids=[r[2] for r in HELD_OUT])
def test_held_out_lines(lines: list[str], want: list[tuple[object, ...]], source: str) -> None:
    assert _events(lines) == want, source


def test_a_megabyte_line_is_bounded() -> None:
    import time

    t0 = time.monotonic()
    out = parse_saved_log(["[ 1.0] " + "A link is Down " * 70000, "[ 2.0] " + "x" * 1_000_000])
    assert time.monotonic() - t0 < 5.0 and len(out) <= 2
