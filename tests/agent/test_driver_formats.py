"""Every Xid / SXid / fallen-off-the-bus format string of the NVIDIA 515-595 drivers, rendered
as the driver prints it and wrapped as journalctl and dmesg print it, gives the right event.

The rows (nvidia_formats.tsv) are each format string with its file, line and tag in
github.com/NVIDIA/open-gpu-kernel-modules, the first and last tag of each branch:
src/nvidia/src/kernel/gpu/rc/kernel_rc.c (the Xid line; from 570 the ``XID_PRINT_WITH_ATTR``
macro, its line then the attribution's: ``337+349``), src/common/nvswitch/kernel/inc/
common_nvswitch.h (``NVSWITCH_PRINT_SXID``, ``NVLINK_PCI_DEV_FMT`` expanded),
src/nvidia/arch/nvalloc/unix/src/osapi.c (the three-line notice) and osinit.c
(``NV_DEV_PRINTF``, its ``"NVRM: GPU " NV_PCI_DEV_FMT ": "`` prefix expanded). Made by
reading each tag's files (``git show TAG:FILE``) for those strings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.agent.kernel import parse_kernel_log
from orchestrator.agent.savedlog import parse_saved_log

ROWS = [
    line.split("\t")
    for line in (Path(__file__).with_name("nvidia_formats.tsv")).read_text().splitlines()
    if line and not line.startswith("#")
]
MSG = "Ch 00000010, errorString CTX SWITCH TIMEOUT, Info 0x3c001"
ROOT_CAUSE = " caused by previous Xid 79"


def _printf(fmt: str, args: list[object]) -> str:
    """C's printf for the conversions these strings use (%04x %02x %x %02u %d %05d %s)."""
    py = re.sub(r"%(0?\d*)u", r"%\1d", fmt.replace("\\n", "\n"))
    return py % tuple(args)


def _render(fmt: str) -> tuple[str, dict[str, object]]:
    """(the printed text, the event fields it must give)."""
    if "SXid" in fmt:
        text = (
            _printf(fmt, ["nvswitch3", 0, 5, 0, 0, 94]) + "Non-fatal, Link 32 RX Short Error Rate"
        )
        return text, {
            "kind": "sxid",
            "xid": 94,
            "pci": "0000:05:00.0",
            "process": "nvidia-nvswitch3",
        }
    if "fallen off the bus" in fmt:
        args: list[object] = [0, 0xB3, 0, 0] + ([0x10DE, 0x26B5] if "PCI ID" in fmt else [])
        return _printf(fmt, args), {"kind": "fallen-off-bus", "pci": "0000:b3:00.0"}
    gi, ci = "GPU-I" in fmt, "GPU-CI" in fmt
    args = [0, 0x3B, 0] + ([2] if gi else []) + ([1] if ci else []) + [43]
    with_pid = "pid=" in fmt
    if with_pid:
        args += ["4242", "python3"]
    args.append(MSG)
    if fmt.count("%s") - (2 if with_pid else 0) == 2:
        args.append(ROOT_CAUSE)
    want: dict[str, object] = {
        "kind": "xid",
        "xid": 43,
        "pci": "0000:3b:00",
        "gpu_instance": 2 if gi else None,
        "compute_instance": 1 if ci else None,
        "pid": 4242 if with_pid else None,
        "process": "python3" if with_pid else None,
    }
    return _printf(fmt, args), want


def _wrapped(text: str) -> dict[str, list[str]]:
    """``text`` (one record, maybe of several lines) as each tool prints it."""
    first, *more = text.rstrip("\n").split("\n")
    dm = "[ 1234.567890] "
    jc = "Dec 02 04:34:10.123456 pve1 kernel: "
    return {
        "dmesg": [dm + first, *(" " * len(dm) + m for m in more)],
        "dmesg -T": ["[Wed Dec  2 04:34:10 2026] " + first, *("  " + m for m in more)],
        "journalctl -o short-precise": [jc + first, *(" " * len(jc) + m for m in more)],
        "journalctl -o short-unix": [
            "1796186050.123456 pve1 kernel: " + first,
            *("   " + m for m in more),
        ],
        "separate records": ["[ 1234.567890] " + x for x in [first, *more]],
    }


@pytest.mark.parametrize(
    ("version", "path", "line", "fmt"),
    ROWS,
    ids=[f"{r[0]}:{r[1].rsplit('/', 1)[1]}:{r[2]}" for r in ROWS],
)
def test_every_driver_format_gives_its_event(version: str, path: str, line: str, fmt: str) -> None:
    text, want = _render(fmt)
    for tool, lines in _wrapped(text).items():
        events = parse_saved_log(lines)
        assert len(events) == 1, f"{version} {path}:{line} via {tool}: {events}"
        got = {k: getattr(events[0], k) for k in want}
        assert got == want, f"{version} {path}:{line} via {tool}"


def test_the_table_covers_every_branch_and_form() -> None:
    versions = {r[0].split(".")[0] for r in ROWS}
    assert versions >= {"515", "525", "535", "550", "560", "570", "580", "590", "595"}
    forms = {r[3] for r in ROWS}
    assert any("GPU-CI" in f and "pid=" not in f for f in forms)  # 570+: no process known
    assert any("%s%s" in f for f in forms)  # 580+: " caused by previous Xid %d"


def test_the_live_parser_agrees() -> None:
    text, want = _render("NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u): %d, %s%s\\n")
    ev = parse_kernel_log(["[10.0] " + text.strip()], since=None, boot_time=1000.0)
    assert (ev[0].gpu_instance, ev[0].compute_instance, ev[0].at) == (2, 1, 1010.0)


def test_unsupported_gpu_notices_are_no_fallen_off_bus() -> None:
    """osapi.c's other "NVRM: The NVIDIA GPU %04x:%02x:%02x.%x (PCI ID: %04x:%04x)" notices
    (not supported by this driver / open nvidia.ko, 580.65.06 osapi.c:3553, 3566, 3603)."""
    lines = [
        "[ 5.0] NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:1db6)",
        "[ 5.0] NVRM: installed in this system is not supported by open",
        "[ 5.0] NVRM: nvidia.ko because it does not include the required GPU",
        "[ 5.0] NVRM: System Processor (GSP).",
    ]
    assert parse_saved_log(lines) == []


def test_the_mig_instance_is_shown_where_xids_are_and_the_wire_stays_compatible() -> None:
    from orchestrator.config.limits import Limits
    from orchestrator.detect.host import xid
    from orchestrator.wire.model import HostProbe, KernelEvent

    line = (
        "[ 5.0] NVRM: Xid (PCI:0000:3b:00 GPU-I:02 GPU-CI:01): 43, pid=9, name=python3, Ch 00000008"
    )
    ev = parse_saved_log([line])
    findings = xid([], Limits(), [HostProbe("pve1", 0.0, kernel_events=tuple(ev))], all_xids=True)
    assert "on PCI 0000:3b:00 GPU-I:02 GPU-CI:01" in findings[0].summary, findings
    doc = ev[0].to_dict()
    assert (doc["gpu_instance"], doc["compute_instance"]) == (2, 1)
    old = {k: v for k, v in doc.items() if k not in ("gpu_instance", "compute_instance")}
    assert KernelEvent.from_dict(old).gpu_instance is None  # an older agent's document
