"""What the run's wrapper itself writes on the pane: its ``[orch]`` lines, never bash's own
job report, which log-signature playbooks would read as the command's output."""

from __future__ import annotations

import os
import signal

from orchestrator.agent import rundir
from tests.helpers import wait_for
from tests.launch.conftest import LocalAgent


def test_a_killed_group_leaves_no_job_report_of_the_wrapper_on_the_pane(
    local_agent: LocalAgent,
) -> None:
    """SIGKILL to the recorded process group (what ``orch demo``'s fault does): bash, waiting
    for that job, would print "wrapper.sh: line N: PID Killed ( trap ... )", which the
    ``sigkill`` playbook matches as if the command had said it."""
    rc, doc = local_agent(
        "launch",
        "--workdir",
        str(local_agent.workdir),
        "--session",
        "train",
        "--cmd",
        "echo ready; sleep 60",
        "--no-recorder",
        "--run-id",
        "g1",
    )
    assert rc == 0, doc
    run_dir = local_agent.workdir / "runs" / "g1"
    wait_for(lambda: "ready" in (run_dir / "train.log").read_text(), 10, what="ready line")
    os.killpg(int((run_dir / "pgid").read_text()), signal.SIGKILL)

    def pane() -> str:
        res = local_agent.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "=train:run")
        return res.stdout if "[orch] command exited with status 137" in res.stdout else ""

    # The wrapper prints its exit line, then writes exit_status (so whoever sees the status
    # finds the line): wait for the status, not for the line, before asserting both.
    status = wait_for(lambda: rundir.run_state(run_dir).exit_status, 10, what="exit_status")
    assert status == 137
    shown = wait_for(pane, 10, what="the wrapper's exit line")
    assert [x for x in shown.splitlines() if "Killed" in x] == [], shown
