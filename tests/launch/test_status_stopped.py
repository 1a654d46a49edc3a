"""``orch stop`` ends a run with 130: the shared state word (status, watch, check) is
``stopped``, not ``crashed``; a run that crashed before anyone asked stays ``crashed``."""

from __future__ import annotations

import io
import json
import subprocess
import sys

from rich.console import Console

from orchestrator.config.inventory import ContainerConfig
from orchestrator.config.limits import Limits
from orchestrator.detect.engine import run_detectors
from orchestrator.lifecycle.runs import summarize
from orchestrator.monitor.state import target_state
from orchestrator.views.launch import status_table
from orchestrator.wire.model import Snapshot
from tests.launch.conftest import LocalAgent


def agent_snapshot(agent: LocalAgent) -> Snapshot:
    """A real agent ``snapshot`` of the workdir (same tmux server as the run)."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.agent",
            "snapshot",
            "--workdir",
            str(agent.workdir),
            "--session",
            "train",
            "--target",
            "local",
            "--gpu-deadline",
            "1",
        ],
        capture_output=True,
        text=True,
        env=agent.env,
        timeout=60,
        check=True,
    )
    return Snapshot.from_dict(json.loads(res.stdout))


def test_run_stopped_by_orch_stop_reads_stopped(local_agent: LocalAgent) -> None:
    wd = ["--workdir", str(local_agent.workdir)]
    rc, doc = local_agent(
        "launch",
        *wd,
        "--session",
        "train",
        "--cmd",
        "echo started; sleep 60",
        "--no-recorder",
        "--run-id",
        "s1",
    )
    assert rc == 0 and doc["state"]["state"] == "running", doc
    rc, stop = local_agent("stop", *wd, "--grace", "4", "--by", "orch stop by test")
    assert rc == 0 and stop["exit_status"] == 130, stop
    snap = agent_snapshot(local_agent)
    assert snap.run is not None and snap.run.exit_status == 130
    assert snap.run.stop_requested_at is not None
    findings = run_detectors([snap], limits=Limits())
    assert target_state(snap) == "stopped"
    assert target_state(snap, findings) == "stopped", findings
    row = summarize(snap, ContainerConfig(name="local", host="local"))
    assert row["state"] == "stopped" and row["run_state"] == "exited 130"
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(
        status_table([{"target": "local", **row}])
    )
    assert "stopped (exited 130)" in out.getvalue() and "crashed" not in out.getvalue()


def test_run_that_crashed_on_its_own_reads_crashed(local_agent: LocalAgent) -> None:
    rc, doc = local_agent(
        "launch",
        "--workdir",
        str(local_agent.workdir),
        "--session",
        "train",
        "--cmd",
        "exit 130",
        "--no-recorder",
        "--run-id",
        "c1",
        "--settle",
        "5",
    )
    assert rc == 0 and doc["state"]["exit_status"] == 130, doc
    snap = agent_snapshot(local_agent)
    assert snap.run is not None and snap.run.stop_requested_at is None
    assert target_state(snap) == "crashed"
    assert target_state(snap, run_detectors([snap], limits=Limits())) == "crashed"
