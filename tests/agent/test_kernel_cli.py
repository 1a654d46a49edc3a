"""``orch kernel LOG [--json]``: a saved kernel log as the host observer's events, through the
real CLI; bad input (a missing file, a 1 MB line, binary bytes) gets a bounded answer."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _orch(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_json_events_of_a_saved_journal(tmp_path: Path) -> None:
    log = tmp_path / "kern.txt"
    log.write_text(
        "Dec 02 04:34:10.123456 pve1 kernel: NVRM: Xid (PCI:0000:3b:00 GPU-I:02 GPU-CI:01): 43, pid=9, name=python3, Ch 00000008\n"
        "Dec 02 04:34:11.000000 pve1 kernel: vmbr0: port 2(fwpr201p0) entered blocking state\n"
        "Dec 02 04:34:11.000100 pve1 kernel: vmbr0: port 2(fwpr201p0) entered disabled state\n"
        "Dec 02 04:35:00.000000 pve1 kernel: vmbr0: port 3(veth202i0) entered disabled state\n"
    )
    p = _orch("kernel", str(log), "--json")
    assert p.returncode == 0, p.stderr
    ev = json.loads(p.stdout)["events"]
    assert [
        (e["kind"], e["xid"], e["gpu_instance"], e["compute_instance"], e["vmid"], e["device"])
        for e in ev
    ] == [("xid", 43, 2, 1, None, None), ("link-down", None, None, None, 202, "veth202i0")]
    text = _orch("kernel", str(log))
    assert "0000:3b:00 GPU-I:02 GPU-CI:01" in text.stdout and "guest 202" in text.stdout


def test_bad_input_is_bounded(tmp_path: Path) -> None:
    missing = _orch("kernel", str(tmp_path / "nope.log"))
    assert missing.returncode == 2 and "nope.log: cannot read" in missing.stderr
    assert "Traceback" not in missing.stderr
    big = tmp_path / "big.log"
    big.write_bytes(
        b"[ 1.0] "
        + b"\xff\x00" * 600_000
        + b"\n"
        + b"x" * 3_000_000
        + b"\n[ 2.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
    )
    t0 = time.monotonic()
    p = _orch("kernel", str(big), "--json")
    assert p.returncode == 0, p.stderr
    assert [e["xid"] for e in json.loads(p.stdout)["events"]] == [79]
    assert time.monotonic() - t0 < 60


def test_help_lists_the_command() -> None:
    assert "kernel" in _orch("--help").stdout
