"""Multi-node jobs end to end, through the sandbox's two hosts and job network:
launch with one command, watch and check as one row, stop every node, a preflight failure
that starts nothing, a node that dies before the rendezvous. The faults after a launch (a
rank killed, a container stopped, a host partitioned) are reliability rows:
tests/reliability/test_job_faults.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.jobs.cluster import ROOT, TRAINER_ARGS, Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _nodes(doc: dict) -> dict[str, dict]:
    return {n["name"]: n for n in doc["targets"][0]["nodes"]}


def test_shortest_job_is_the_bundled_trainer_under_torchrun(job_cluster: Cluster) -> None:
    """``jobs: {pair: {nodes: [ct200, ct201]}}`` and nothing else: each node runs torchrun with
    the c10d rendezvous at ct200's job-network address and the container's trainer_config."""
    from orchestrator.config.inventory import load_inventory
    from orchestrator.lifecycle.jobs import node_command, node_container

    config = job_cluster.config({"pair": {"nodes": ["ct200", "ct201"]}})
    inv = load_inventory(config)
    job = inv.job("pair")
    cmd = node_command(job, job.nodes[1], node_container(inv, job, job.nodes[1]), run_id="R",
                       run_dir="/root/dflash/runs/R", bundle_dir="/b")  # fmt: skip
    assert job.rdzv_endpoint == f"{job_cluster.info.address('ct200')}:29400"
    assert " -m torch.distributed.run --nnodes 2 --nproc-per-node 1 --node-rank 1 " in cmd
    assert "--rdzv-backend c10d --rdzv-endpoint 10.99.0.10:29400 --rdzv-id R" in cmd
    assert "--local-addr 10.99.0.11" in cmd and "/b/trainer/configs/tiny-cpu.yaml" in cmd


def test_two_nodes_launch_watch_check_and_stop(job_cluster: Cluster) -> None:
    c = job_cluster
    config = c.config({"pair": {"nodes": ["ct200", "ct201"], "trainer_config": "instant-cpu",
                                "collective_timeout": 60}})  # fmt: skip
    try:
        t0 = time.monotonic()
        doc = c.launch(config, "pair")
        launched = time.monotonic() - t0
        run_id = doc["run_id"]
        assert [(n["node"], n["rank"], n["group_rank"]) for n in doc["nodes"]] == [
            ("ct200", 0, 0), ("ct201", 1, 1)]  # fmt: skip
        verify = next(p for p in doc["phases"] if p["phase"] == "verify" and p["status"] == "ok")
        print(f"2-node launch verified in {launched:.1f} s (verify done at {verify['at_s']} s)",
              file=sys.stderr)  # fmt: skip
        for ct in ("ct200", "ct201"):  # every node's own log shows training steps
            wait_for(lambda ct=ct: "step=" in c.log(ct, run_id), 60, what=f"steps in {ct}'s log")
            assert "rank=" in c.log(ct, run_id)
        rc, check, _s = c.check(config, "pair")
        job = check["targets"][0]
        assert rc == 0 and job["kind"] == "job" and job["state"] == "running", json.dumps(job)[
            :2000
        ]
        assert [(n["name"], n["rank"], n["state"]) for n in job["nodes"]] == [
            ("ct200", 0, "running"), ("ct201", 1, "running")]  # fmt: skip
        watch = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "-c", str(config), "watch", "pair", "--plain"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
        )  # fmt: skip
        try:
            seen: list[str] = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                line = watch.stdout.readline() if watch.stdout else ""
                seen.append(line)
                if " pair job running nodes=2" in line:
                    break
            assert any(" pair job running nodes=2" in x for x in seen), seen
            assert any(" ct201 running " in x for x in seen), seen
        finally:
            watch.terminate()
            watch.wait(10)
        stop = c.orch(config, "stop", "pair", "--grace", "6", "--json")
        assert stop.returncode == 0, stop.stderr
        nodes = {n["node"]: n for n in json.loads(stop.stdout)["nodes"]}
        assert set(nodes) == {"ct200", "ct201"}
        assert all(n["stop_requested"] for n in nodes.values()), nodes
        rc, check, _s = c.check(config, "pair")
        assert {n["state"] for n in check["targets"][0]["nodes"]} == {"stopped"}, check
    finally:
        c.cleanup()


def test_four_nodes_over_two_hosts(job_cluster: Cluster) -> None:
    c = job_cluster
    config = c.config({"quad": {"nodes": ["ct200", "ct201", "ct202", "ct203"],
                                "trainer_config": "instant-cpu", "collective_timeout": 60}})  # fmt: skip
    try:
        t0 = time.monotonic()
        doc = c.launch(config, "quad")
        print(
            f"4-node launch over 2 hosts verified in {time.monotonic() - t0:.1f} s", file=sys.stderr
        )
        assert [n["host"] for n in doc["nodes"]] == ["sandbox", "sandbox", "sandbox2", "sandbox2"]
        assert [n["group_rank"] for n in doc["nodes"]] == [0, 1, 2, 3]
        for ct in ("ct200", "ct201", "ct202", "ct203"):
            wait_for(lambda ct=ct: "step=" in c.log(ct, doc["run_id"]), 60, what=f"steps in {ct}")
        rc, check, _s = c.check(config, "quad")
        assert rc == 0, check
        assert {n["state"] for n in check["targets"][0]["nodes"]} == {"running"}, check
        status = c.orch(config, "status", "quad", "--json")
        rows = json.loads(status.stdout)
        assert rows[0]["kind"] == "job" and rows[0]["nodes"] == ["ct200", "ct201", "ct202", "ct203"]
        assert [r.get("rank") for r in rows[1:]] == [0, 1, 2, 3]
        logs = c.orch(config, "logs", "quad", "--node", "3", "-n", "5")
        assert logs.returncode == 0 and logs.stdout.strip(), logs.stderr
    finally:
        c.cleanup()


def test_a_node_failing_preflight_starts_nothing(job_cluster: Cluster) -> None:
    c = job_cluster
    config = c.config({"pair": {"nodes": ["ct200", "ct201"], "trainer_config": "instant-cpu"}},
                      ct201={"requires": ["no_such_module_i18"]})  # fmt: skip
    before = {ct: c.orch(config, "runs", ct, "--json").stdout for ct in ("ct200", "ct201")}
    res = c.orch(config, "launch", "pair", "--json")
    assert res.returncode == 4, res.stdout + res.stderr
    assert "ct201 (rank 1): module 'no_such_module_i18' does not import" in res.stderr, res.stderr
    assert "nothing was started on any node" in res.stderr
    after = {ct: c.orch(config, "runs", ct, "--json").stdout for ct in ("ct200", "ct201")}
    assert after == before  # no run directory anywhere, ct200 (which passed) included


def test_a_node_dying_before_the_rendezvous_stops_the_others(job_cluster: Cluster) -> None:
    """ct200 hosts the rendezvous store; its port is taken in ct200, so torchrun dies there at
    once; ct201 would wait for the rendezvous (15 min by default): orch stops it and says which."""
    c = job_cluster
    config = c.config({"pair": {"nodes": ["ct200", "ct201"], "trainer_config": "instant-cpu",
                                "rendezvous": {"port": 29555}}})  # fmt: skip
    holder = subprocess.Popen(
        [str(c.state_dir / "bin" / "pct"), "exec", "200", "--", sys.executable, "-c",
         "import socket, time\ns = socket.socket()\ns.bind(('0.0.0.0', 29555))\ns.listen()\n"
         "print('listening', flush=True)\ntime.sleep(300)"],
        env={**c.info.env(), "PATH": f"{c.state_dir / 'bin'}:/usr/bin:/bin"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and "listening" in holder.stdout.readline()
        res = c.orch(config, "launch", "pair", "--json", "--", "--forever", "--set",
                     "train.batch_size=8")  # fmt: skip
        doc = json.loads(res.stdout)
        assert res.returncode == 1 and doc["error"] == "node-failed", res.stdout[-3000:]
        assert (doc["node"], doc["rank"]) == ("ct200", 0), doc["message"]
        assert "node ct200 (rank 0) died before the rendezvous" in doc["message"], doc["message"]
        assert "stopped the other nodes: ct201 (rank 1)" in doc["message"], doc["message"]
        stopped = {s["node"]: s for s in doc["stopped"]}
        assert stopped["ct201"]["stop_requested"] is not None, stopped
        rc, check, _s = c.check(config, "pair")
        assert "running" not in {n["state"] for n in check["targets"][0]["nodes"]}, check
    finally:
        for pid in c.info.container_pids("ct200"):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"29555" in argv:
                os.kill(pid, signal.SIGKILL)
        holder.kill()
        holder.wait(10)
        c.cleanup()


# --- Ctrl-C during `orch launch JOB` ----------------------------------------------------------

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
        script.write_text(HOLD_PYTHON.replace("{dir}", inside).replace(
            "{python}", doc["containers"][ct]["python"]))  # fmt: skip
        script.chmod(0o755)
        over[ct] = {"python": f"{inside}/python"}
    config = c.config({"pair": {"nodes": list(NODES), "trainer_config": "instant-cpu",
                                "collective_timeout": 60}}, **over)  # fmt: skip
    return config, holds


def _launch_process(c: Cluster, config: Path, name: str) -> subprocess.Popen[str]:
    env = {**os.environ, "ORCH_DB": str(config.with_suffix(".db")),
           "XDG_STATE_HOME": str(c.workdir / "state")}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "-c", str(config), "launch", "pair",
         "--name", name, *TRAINER_ARGS],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env,
    )  # fmt: skip


def _runs_of(c: Cluster, name: str) -> dict[str, list[str]]:
    """Per node, the run directories of the runs named ``name`` (``--name``)."""
    return {ct: sorted(p.name for p in (c.info.workdir(ct) / "runs").glob(f"*-{name}"))
            for ct in NODES}  # fmt: skip


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
            wait_for(lambda: all((holds[ct] / f"reached-{step}").exists() for ct in NODES),
                     240, what=f"both nodes held at the {step} step")  # fmt: skip
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
    where = " in the start step" if step == "start" else ""
    assert (
        f"job pair: interrupted{where}: node ct200 (rank 0) started in ct200 and is still running; node ct201 (rank 1) started in ct201 and is still running (run {run_id})"
        in out
    ), out
    assert runs == {ct: [run_id] for ct in NODES}, runs
    stop = c.orch(config, "stop", "pair", "--run", run_id, "--grace", "4", "--json")
    assert stop.returncode == 0, stop.stdout + stop.stderr
    nodes = {n["node"]: n for n in json.loads(stop.stdout)["nodes"]}
    # the command the line names undoes it: both nodes were running the run, now stopped
    assert all(nodes[ct]["stopped"] and nodes[ct]["run_id"] == run_id for ct in NODES), nodes
