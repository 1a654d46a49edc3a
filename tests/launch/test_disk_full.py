"""A run whose disk fills up: tee's complaint and the exit status survive, the postmortem shows them.

Real parts: a 256 KiB tmpfs mounted on the run directory's parent (root only; skipped
otherwise), the real wrapper in a private tmux server, the agent's ``evidence`` command,
and the postmortem's evidence builder, matcher and renderers.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.agent import rundir
from orchestrator.postmortem import collect as postmortem
from orchestrator.postmortem.verdict import judge
from orchestrator.views.postmortem import html, markdown
from orchestrator.wire.answers import EvidenceAnswer
from tests.helpers import wait_for
from tests.launch.conftest import LocalAgent


@pytest.fixture
def tiny_runs(local_agent: LocalAgent) -> Iterator[Path]:
    """``<workdir>/runs`` on a 256 KiB tmpfs; unmounted (after the tmux server is gone)."""
    root = local_agent.workdir / "runs"
    root.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(root)],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield root
    finally:
        local_agent.tmux("kill-server")
        subprocess.run(["umount", "-l", str(root)], capture_output=True, check=False)


def test_full_disk_keeps_tee_error_and_exit_status(
    local_agent: LocalAgent, tiny_runs: Path
) -> None:
    # ~390 KB of output into a 256 KiB file system, then a failure exit.
    rc, doc = local_agent(
        "launch",
        "--workdir",
        str(local_agent.workdir),
        "--cmd",
        "seq 1 60000; exit 3",
        "--run-id",
        "full1",
        "--no-recorder",
        "--settle",
        "0",
    )
    assert rc == 0, doc
    run_dir = tiny_runs / "full1"
    # exit_status is a new file on a full disk: it lands in the space reserved at launch.
    wait_for(lambda: rundir.read_int(run_dir / "exit_status") is not None, 20, what="exit_status")
    assert rundir.read_int(run_dir / "exit_status") == 3
    assert not (run_dir / rundir.STATUS_RESERVE).exists()
    state = rundir.run_state(run_dir).to_dict()
    assert state["state"] == "exited" and state["exit_status"] == 3, state
    assert state["tee_error"] and "No space left on device" in state["tee_error"], state
    assert "train.log" in state["tee_error"]
    # The pane keeps the command's output (tee still copies to it) and, at the end, tee's words.
    # The exit status is on disk before tmux has drawn the last of ~390 KB of output: on a
    # loaded machine that drawing took over 10 s, so the deadline is for tmux, not the wrapper.
    pane = wait_for(
        lambda: (
            "[orch] command exited with status 3"
            in (p := local_agent.tmux("capture-pane", "-p", "-t", "=train:run").stdout)
            and p
        ),
        60,
        what="the wrapper's last line",
    )
    assert "No space left on device" in pane and "60000" in pane, pane

    rc, ev_doc = local_agent("evidence", "--workdir", str(local_agent.workdir), "--run-id", "full1")
    assert rc == 0 and ev_doc["tee"]["error"] == state["tee_error"], ev_doc["tee"]
    answer = EvidenceAnswer.from_dict(ev_doc)
    ev = postmortem._evidence("local", answer, None, None, "running", "", None, [], None, (), [])
    assert ev.tee_error == state["tee_error"] and ev.exit_status == 3
    pm = judge(ev)
    assert pm.verdict.playbook == "disk-full", pm.verdict
    assert "tee failed" in markdown(pm) and "No space left on device" in markdown(pm)
    assert "tee failed" in html(pm)
    assert pm.to_dict()["tee_error"] == ev.tee_error


def test_healthy_run_has_no_tee_error(local_agent: LocalAgent) -> None:
    rc, doc = local_agent(
        "launch",
        "--workdir",
        str(local_agent.workdir),
        "--cmd",
        "echo hello",
        "--run-id",
        "ok1",
        "--no-recorder",
        "--settle",
        "3",
    )
    assert rc == 0 and doc["state"]["exit_status"] == 0, doc
    run_dir = local_agent.workdir / "runs" / "ok1"
    assert doc["state"]["tee_error"] is None and doc["state"]["tee_status"] is None
    assert (run_dir / "train.log").read_text().startswith("hello")
    # The reserve for exit_status stays unused; exit_status is a plain small file.
    assert (run_dir / "exit_status").read_text() == "0\n"
    assert (run_dir / rundir.STATUS_RESERVE).stat().st_size == rundir.RESERVE_BYTES
