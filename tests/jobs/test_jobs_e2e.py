"""Multi-node jobs end to end, through the sandbox's two hosts and job network:
launch with one command, watch and check as one row, stop every node, a preflight failure
that starts nothing, a node that dies before the rendezvous. The faults after a launch (a
rank killed, a container stopped, a host partitioned) are reliability rows:
tests/reliability/test_job_faults.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.jobs.cluster import ROOT, Cluster

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
    cmd = node_command(
        job,
        job.nodes[1],
        node_container(inv, job, job.nodes[1]),
        run_id="R",
        run_dir="/root/dflash/runs/R",
        bundle_dir="/b",
    )
    assert job.rdzv_endpoint == f"{job_cluster.info.address('ct200')}:29400"
    assert " -m torch.distributed.run --nnodes 2 --nproc-per-node 1 --node-rank 1 " in cmd
    assert "--rdzv-backend c10d --rdzv-endpoint 10.99.0.10:29400 --rdzv-id R" in cmd
    assert "--local-addr 10.99.0.11" in cmd and "/b/trainer/configs/tiny-cpu.yaml" in cmd


def test_two_nodes_launch_watch_check_and_stop(job_cluster: Cluster) -> None:
    c = job_cluster
    config = c.config(
        {
            "pair": {
                "nodes": ["ct200", "ct201"],
                "trainer_config": "instant-cpu",
                "collective_timeout": 60,
            }
        }
    )
    try:
        t0 = time.monotonic()
        doc = c.launch(config, "pair")
        launched = time.monotonic() - t0
        run_id = doc["run_id"]
        assert [(n["node"], n["rank"], n["group_rank"]) for n in doc["nodes"]] == [
            ("ct200", 0, 0),
            ("ct201", 1, 1),
        ]
        verify = next(p for p in doc["phases"] if p["phase"] == "verify" and p["status"] == "ok")
        print(
            f"2-node launch verified in {launched:.1f} s (verify done at {verify['at_s']} s)",
            file=sys.stderr,
        )
        for ct in ("ct200", "ct201"):  # every node's own log shows training steps
            wait_for(lambda ct=ct: "step=" in c.log(ct, run_id), 60, what=f"steps in {ct}'s log")
            assert "rank=" in c.log(ct, run_id)
        rc, check, _s = c.check(config, "pair")
        job = check["targets"][0]
        assert rc == 0 and job["kind"] == "job" and job["state"] == "running", json.dumps(job)[
            :2000
        ]
        assert [(n["name"], n["rank"], n["state"]) for n in job["nodes"]] == [
            ("ct200", 0, "running"),
            ("ct201", 1, "running"),
        ]
        watch = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "-c",
                str(config),
                "watch",
                "pair",
                "--plain",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
        )
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
    config = c.config(
        {
            "quad": {
                "nodes": ["ct200", "ct201", "ct202", "ct203"],
                "trainer_config": "instant-cpu",
                "collective_timeout": 60,
            }
        }
    )
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
    config = c.config(
        {"pair": {"nodes": ["ct200", "ct201"], "trainer_config": "instant-cpu"}},
        ct201={"requires": ["no_such_module_i18"]},
    )
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
    config = c.config(
        {
            "pair": {
                "nodes": ["ct200", "ct201"],
                "trainer_config": "instant-cpu",
                "rendezvous": {"port": 29555},
            }
        }
    )
    holder = subprocess.Popen(
        [
            str(c.state_dir / "bin" / "pct"),
            "exec",
            "200",
            "--",
            sys.executable,
            "-c",
            "import socket, time\ns = socket.socket()\ns.bind(('0.0.0.0', 29555))\ns.listen()\n"
            "print('listening', flush=True)\ntime.sleep(300)",
        ],
        env={**c.info.env(), "PATH": f"{c.state_dir / 'bin'}:/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert holder.stdout is not None and "listening" in holder.stdout.readline()
        res = c.orch(
            config, "launch", "pair", "--json", "--", "--forever", "--set", "train.batch_size=8"
        )
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
