"""A relaunch keeps the run's variables: ``launch --env-from RUN`` reads the old run's 0600
env file inside the container, never a command line (against a real, private tmux server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.agent import rundir
from tests.helpers import wait_for
from tests.launch.conftest import LocalAgent
from tests.launch.test_runs_local import exit_status, launch

SECRET = "hf_relaunch_s3cret_value_42"
PRINT = "python3 -c \"import os; print('token', os.environ.get('HF_TOKEN'), os.environ.get('LR'))\""


def _env_file(agent: LocalAgent, run_id: str) -> dict[str, str]:
    raw = (agent.workdir / "runs" / run_id / rundir.ENV).read_bytes()
    return dict(r.decode().split("=", 1) for r in raw.split(b"\0") if b"=" in r)


def test_a_secret_survives_two_relaunches_and_is_never_on_a_command_line(
    local_agent: LocalAgent, tmp_path: Path
) -> None:
    out = tmp_path / "argv.json"
    watch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.reliability.argv_watch",
            str(out),
            "--mark",
            "launch=--env-from",
        ],
        stdin=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert watch.stdin is not None
    watch.stdin.write(SECRET.encode() + b"\n")
    watch.stdin.close()
    time.sleep(0.5)  # let it start scanning before the first launch (its marks prove it did)
    try:
        doc = json.dumps({"env": {"HF_TOKEN": SECRET, "LR": "3e-4"}})
        rc, ans = launch(local_agent, PRINT, "--run-id", "a1", "--env-stdin", stdin=doc)
        assert rc == 0, ans
        wait_for(lambda: exit_status(local_agent, "a1") is not None, 10, what="a1 exit")
        previous = "a1"
        for run_id in ("a2", "a3"):  # two relaunches, each from the one before
            rc, ans = launch(
                local_agent,
                PRINT,
                "--run-id",
                run_id,
                "--force",
                "--env-stdin",
                "--env-from",
                previous,
                "--gpus",
                "1",
                stdin=json.dumps({"env": {"ORCH_RESUME": "auto"}}),
            )
            assert rc == 0, ans
            wait_for(lambda r=run_id: exit_status(local_agent, r) is not None, 10, what=run_id)
            previous = run_id
    finally:
        Path(str(out) + ".stop").touch()
        watch.wait(30)
    env = _env_file(local_agent, "a3")
    assert env["HF_TOKEN"] == SECRET and env["LR"] == "3e-4"
    assert env["CUDA_VISIBLE_DEVICES"] == "1"  # the relaunch's own GPUs, not the old run's
    log = (local_agent.workdir / "runs" / "a3" / "train.log").read_text()
    assert f"token {SECRET} 3e-4" in log
    manifest = json.loads((local_agent.workdir / "runs" / "a3" / "manifest.json").read_text())
    assert SECRET not in json.dumps(manifest)  # masked there
    assert os.stat(local_agent.workdir / "runs" / "a3" / rundir.ENV).st_mode & 0o777 == 0o600
    report = json.loads(out.read_text())
    assert report["marks"]["launch"] > 0, report  # the relaunches were sampled
    assert report["hits"] == [], report["hits"]


def test_env_from_a_run_that_is_not_there_is_a_usage_error(local_agent: LocalAgent) -> None:
    rc, ans = launch(local_agent, "true", "--run-id", "b1", "--env-from", "nope")
    assert rc == 2 and "--env-from: no run 'nope'" in ans["message"], ans


def test_launch_records_the_runs_own_tmux_server(local_agent: LocalAgent) -> None:
    rc, ans = launch(local_agent, "sleep 30", "--run-id", "t1")
    assert rc == 0, ans
    pid, start = (local_agent.workdir / "runs" / "t1" / rundir.TMUX_PID).read_text().split()
    comm = Path(f"/proc/{pid}/comm").read_text().strip()
    assert comm.startswith("tmux"), comm
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    assert fields[19] == start
