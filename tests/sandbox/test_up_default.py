"""A fresh ``orch sandbox up`` is launchable as it comes up: its GPUs are free."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.sandbox import manager


def orch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.e2e
def test_a_fresh_sandbox_starts_with_idle_gpus(tmp_path: Path) -> None:
    """The default scenario is ``idle`` (no memory, no process on any GPU), so the first
    ``orch launch ct200`` passes preflight's busy-GPU check; busy scenarios go by name."""
    state = tmp_path / "sb"
    up = orch(
        "sandbox", "up", "--dir", str(state), "--gpus", "2", "--isolation", "process", "--json"
    )
    try:
        assert up.returncode == 0, up.stderr
        assert json.loads(up.stdout)["scenario"] == "idle"
        devices = manager.read_scenario(state)["devices"]
        assert [(d["mem_used_mib"], d["processes"]) for d in devices] == [(0, []), (0, [])]
    finally:
        orch("sandbox", "down", "--dir", str(state))
