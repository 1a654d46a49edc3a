"""Ctrl-C during ``orch launch JOB``, through the sandbox's job cluster (tests/jobs/cluster.py):
SIGINT to a real orch process in each step of the launch, and what its last line says is what
the nodes hold. Apart from test_jobs_e2e.py so that another xdist worker can run it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.jobs.cluster import ROOT, TRAINER_ARGS, Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


HOLD_PYTHON = r"""#!/bin/sh
# The container's python, held at one step of a launch while {dir}/hold-STEP exists (at most
# 120 s); {dir}/reached-STEP says it got there. Steps, by the argv orch runs:
#   preflight  the import check (python -c SCRIPT MODULES: lifecycle/preflight.py _IMPORT_CHECK)
#   deploy     the bundle check (python -c CHECK DEST HASH: remote/deploy.py ensure_agent)
#   start      the agent's launch (python -S -c BOOT BUNDLE launch ...: remote/target.py)
step=
case "$2" in *importlib.import_module*) step=preflight ;; esac
case "$1 $3" in "-c "*/.orch/trainer-*) step=deploy ;; esac
[ "$1 $2 $5" = "-S -c launch" ] && step=start
if [ -n "$step" ] && [ -e {dir}/hold-$step ]; then
  : > {dir}/reached-$step
  i=0
  while [ -e {dir}/hold-$step ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i + 1)); done
fi
exec {python} "$@"
"""
NODES = ("ct200", "ct201")


def _held_config(c: Cluster) -> tuple[Path, dict[str, Path]]:
    """A pair job whose nodes' python is HOLD_PYTHON; the hold directory of each, host side."""
    import yaml

    doc = yaml.safe_load(Path(c.info.config_path).read_text())
    holds, over = {}, {}
    for ct in NODES:
        inside = doc["containers"][ct]["workdir"].rstrip("/") + "/ctrlc"
        holds[ct] = c.info.workdir(ct) / "ctrlc"
        holds[ct].mkdir(exist_ok=True)
        script = holds[ct] / "python"
        script.write_text(
            HOLD_PYTHON.replace("{dir}", inside).replace(
                "{python}", doc["containers"][ct]["python"]
            )
        )
        script.chmod(0o755)
        over[ct] = {"python": f"{inside}/python"}
    config = c.config(
        {"pair": {"nodes": list(NODES), "trainer_config": "instant-cpu", "collective_timeout": 60}},
        **over,
    )
    return config, holds


def _launch_process(c: Cluster, config: Path, name: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "ORCH_DB": str(config.with_suffix(".db")),
        "XDG_STATE_HOME": str(c.workdir / "state"),
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "-c",
            str(config),
            "launch",
            "pair",
            "--name",
            name,
            *TRAINER_ARGS,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=env,
    )


def _runs_of(c: Cluster, name: str) -> dict[str, list[str]]:
    """Per node, the run directories of the runs named ``name`` (``--name``)."""
    return {
        ct: sorted(p.name for p in (c.info.workdir(ct) / "runs").glob(f"*-{name}")) for ct in NODES
    }


@pytest.mark.parametrize("step", ["preflight", "deploy", "start", "verify"])
def test_ctrl_c_in_a_job_launch_says_what_it_left_and_how_to_undo_it(
    job_cluster: Cluster, step: str
) -> None:
    """SIGINT to a real ``orch launch JOB`` in each step: exit 130, and one line that names
    every node left running (every node that has the run: nothing unsaid) and the command
    that stops it, or says nothing was started (and nothing was). The nodes' python holds
    the launch at the step (HOLD_PYTHON) until SIGINT is sent; verify lasts by design (the
    rendezvous and a first step), so SIGINT lands in it after the start step's line."""
    c = job_cluster
    config, holds = _held_config(c)
    name = f"ctrlc-{step}"
    held = step in ("preflight", "deploy", "start")
    for ct in NODES:
        for stale in holds[ct].glob("*-*"):
            stale.unlink()
        if held:
            (holds[ct] / f"hold-{step}").touch()
    proc = _launch_process(c, config, name)
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        if held:
            wait_for(
                lambda: all((holds[ct] / f"reached-{step}").exists() for ct in NODES),
                240,
                what=f"both nodes held at the {step} step",
            )
        else:
            for line in proc.stdout:  # the start step's line comes when every node started
                seen.append(line)
                if "✓ start" in line:
                    break
            assert any("✓ start" in x for x in seen), "".join(seen)
        proc.send_signal(signal.SIGINT)
        if step == "start":  # the agents' launch calls are in flight: launch waits for them
            for ct in NODES:
                (holds[ct] / "hold-start").unlink()
        # before the start step nothing is waited for: it ends while the nodes still hold
        rest = proc.stdout.read()
        assert proc.wait(timeout=90) == 130, "".join(seen) + rest
    finally:
        proc.kill()
        proc.wait()
        for ct in NODES:
            (holds[ct] / f"hold-{step}").unlink(missing_ok=True)
    out = "".join(seen) + rest
    assert "Traceback" not in out, out
    runs = _runs_of(c, name)
    if step in ("preflight", "deploy"):
        assert (
            "job pair: interrupted before the start step: nothing was started on any node" in out
        ), out
        assert runs == {ct: [] for ct in NODES}, runs
        return
    said = re.search(r"\(run (\S+)\): orch stop pair --run (\S+) stops it", out)
    assert said and said.group(1) == said.group(2), out
    run_id = said.group(1)
    # "verify": the line "✓ start" is printed just before launch leaves its start step, so a
    # Ctrl-C right after it may still be reported as in the start step; the facts are the same
    wheres = [" in the start step"] if step == "start" else ["", " in the start step"]
    assert any(
        f"job pair: interrupted{where}: node ct200 (rank 0) started in ct200 and is still running; node ct201 (rank 1) started in ct201 and is still running (run {run_id})"
        in out
        for where in wheres
    ), out
    assert runs == {ct: [run_id] for ct in NODES}, runs
    stop = c.orch(config, "stop", "pair", "--run", run_id, "--grace", "4", "--json")
    assert stop.returncode == 0, stop.stdout + stop.stderr
    nodes = {n["node"]: n for n in json.loads(stop.stdout)["nodes"]}
    # the command the line names undoes it: both nodes were running the run, now stopped
    assert all(nodes[ct]["stopped"] and nodes[ct]["run_id"] == run_id for ct in NODES), nodes
