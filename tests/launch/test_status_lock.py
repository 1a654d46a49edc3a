"""``pct list``'s Lock column and ``pct status --verbose``'s ``lock:`` (pve-container
src/PVE/CLI/pct.pm list: ``"%-10s %-10s %-12s %-20s\\n"`` VMID, Status, Lock, Name; the lock
from src/PVE/LXC.pm vmstatus) reach ``orch status``: ``running, locked (backup)``."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

from rich.console import Console

from orchestrator.views.launch import status_table

BIN = Path(__file__).resolve().parents[2] / "orchestrator" / "sandbox" / "bin"


def _conf(state: Path, vmid: int) -> Path:
    for d in (state / "etc" / "pve" / "nodes" / "sandbox" / "lxc", state / "etc" / "pve" / "lxc"):
        if (d / f"{vmid}.conf").exists():
            return d / f"{vmid}.conf"
    raise AssertionError(f"no config of {vmid} under {state}")


def test_a_locked_container_reads_locked(sandbox) -> None:  # type: ignore[no-untyped-def]
    from orchestrator.config.inventory import load_inventory
    from orchestrator.lifecycle.runs import status_one

    conf = _conf(sandbox.state_dir, 202)
    before = conf.read_text()
    conf.write_text(before + "lock: backup\n")
    try:
        env = {**os.environ, "ORCH_SANDBOX_STATE": str(sandbox.state_dir)}
        listed = subprocess.run(
            [str(BIN / "pct"), "list"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=True,
        ).stdout
        row_202 = next(x for x in listed.splitlines() if x.startswith("202 "))
        assert row_202[22:34].strip() == "backup", listed  # the Lock column, as pct.pm prints it
        row = status_one(load_inventory(sandbox.config_path), "ct202")
        assert (row["container"], row.get("lock")) == ("running", "backup"), row
        out = io.StringIO()
        Console(file=out, width=250, color_system=None).print(status_table([row]))
        assert "running, locked (backup)" in out.getvalue()
    finally:
        conf.write_text(before)
    row = status_one(load_inventory(sandbox.config_path), "ct202")
    assert row.get("lock") is None, row
