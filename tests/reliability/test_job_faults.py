"""Faults of a multi-node job (issue 18): one rank's trainer killed, one node's container
stopped, one node's host cut off the job network. Each: ``orch check JOB`` names the node and
its rank within two poll intervals, before the survivors' collective timeout fires; once the
survivors have failed too, ``orch postmortem JOB`` names that node as the first failure and
the others' errors as its consequences. Through tests/jobs/cluster.py (4 LXC containers, 2
simulated hosts, one job network)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.jobs.cluster import POLL_S, Cluster, wait_for_death

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TIMEOUT_S = 20
"""The jobs' collective timeout (--dist-timeout): short, so the survivors' timeouts fire."""


def _caught(
    c: Cluster, config: Any, job: str, node: str, rank: int
) -> tuple[int, dict, float, int]:
    """Run ``orch check JOB`` at most twice (two poll intervals); the exit code, document,
    seconds since the fault, and how many checks it took."""
    t0 = time.monotonic()
    for i in (1, 2):
        rc, doc, _took = c.check(config, job)
        t = doc["targets"][0]
        said = " ".join(f["summary"] for f in t["findings"])
        if rc == 2 and f"node {node} (rank {rank})" in said:
            return rc, doc, time.monotonic() - t0, i
        time.sleep(max(0.0, POLL_S - (time.monotonic() - t0) % POLL_S))
    return rc, doc, time.monotonic() - t0, 3


def _scenario(
    c: Cluster,
    observe: Callable[[str], None],
    *,
    nodes: list[str],
    victim: str,
    rank: int,
    fault: Callable[[], None],
    what: str,
) -> dict[str, Any]:
    config = c.config(
        {"j": {"nodes": nodes, "trainer_config": "instant-cpu", "collective_timeout": TIMEOUT_S}}
    )
    try:
        c.launch(config, "j")
        rc, doc, _s = c.check(config, "j")
        assert rc == 0, doc
        t_fault = time.monotonic()
        fault()
        rc, doc, caught_s, checks = _caught(c, config, "j", victim, rank)
        t = doc["targets"][0]
        summary = t["findings"][0]["summary"] if t["findings"] else None
        assert rc == 2 and checks <= 2, json.dumps(t, indent=1)[:3000]
        assert summary and summary.startswith(f"node {victim} (rank {rank}) {what}"), summary
        assert caught_s < TIMEOUT_S, caught_s  # before any survivor's collective timeout
        wait_for_death(c, config, "j", TIMEOUT_S * 4 + 60)
        res = c.orch(
            config,
            "postmortem",
            "j",
            "--json",
            "--out",
            str(c.workdir / f"pm-{victim}-{int(t_fault)}"),
        )
        assert res.returncode == 0, res.stderr[-2000:]
        pm = json.loads(res.stdout)
        first = pm["verdict"]["first_failure"]
        cons = pm["verdict"]["consequences"]
        observe(
            f"orch check exit 2 after {caught_s:.1f} s ({checks} check(s), poll {POLL_S:g} s, "
            f"collective timeout {TIMEOUT_S} s): {summary[:110]!r}; postmortem first_failure "
            f"{first['node']} rank {first['rank']} ({pm['verdict']['kind']}), consequences: "
            + ", ".join(
                f"{x['node']} {x['role']} ({x['playbook'] or x['what'][:30]})" for x in cons
            )
        )
        assert (first["node"], first["rank"]) == (victim, rank), pm["verdict"]
        assert cons and all(x["role"] == "consequence" for x in cons), cons
        assert pm["bundle"] and len(pm["nodes"]) == len(nodes)
        return pm
    finally:
        c.cleanup()


@pytest.mark.fault(
    area="container and run",
    fault="SIGKILL of rank 1's trainer in a 2-node torchrun job (gloo on CPU)",
    must="orch check JOB exits 2 naming ct201 (rank 1) within two poll intervals, before the "
    "survivor's collective timeout; orch postmortem JOB names rank 1 the first failure and the "
    "survivor's error a consequence",
)
def test_a_killed_rank_is_named_first(job_cluster: Cluster, observe) -> None:  # type: ignore[no-untyped-def]
    c = job_cluster
    pm = _scenario(
        c,
        observe,
        nodes=["ct200", "ct201"],
        victim="ct201",
        rank=1,
        fault=lambda: c.kill_trainer("ct201"),
        what="crashed",
    )
    assert pm["verdict"]["playbook"] == "sigkill", pm["verdict"]


@pytest.mark.fault(
    area="container and run",
    fault="`pct stop` of rank 1's container in a 2-node job",
    must="orch check JOB exits 2 naming ct201 (rank 1) within two poll intervals; after the "
    "survivor fails, orch postmortem JOB names rank 1 (container stopped) the first failure",
)
def test_a_stopped_container_is_named_first(job_cluster: Cluster, observe) -> None:  # type: ignore[no-untyped-def]
    c = job_cluster
    pm = _scenario(
        c,
        observe,
        nodes=["ct200", "ct201"],
        victim="ct201",
        rank=1,
        fault=lambda: c.stop_container("ct201"),
        what="lost its container",
    )
    assert pm["verdict"]["kind"] == "container-stopped", pm["verdict"]


@pytest.mark.fault(
    area="container and run",
    fault="rank 1's host (sandbox2) partitioned: its job-network uplink taken down inside the "
    "network namespace (packets vanish, TCP hangs)",
    must="orch check JOB exits 2 naming ct202 (rank 1) within two poll intervals (the host's "
    "kernel log: NIC Link is Down); after both ranks' gloo timeouts, orch postmortem JOB names "
    "rank 1 the first failure and the timeouts consequences",
)
def test_a_partitioned_host_is_named_first(job_cluster: Cluster, observe) -> None:  # type: ignore[no-untyped-def]
    c = job_cluster
    pm = _scenario(
        c,
        observe,
        nodes=["ct201", "ct202"],
        victim="ct202",
        rank=1,
        fault=lambda: c.partition("sandbox2"),
        what="lost the job network",
    )
    assert pm["verdict"]["kind"] == "link-down", pm["verdict"]
    assert any(x["playbook"] == "gloo-timeout" for x in pm["verdict"]["consequences"]), pm[
        "verdict"
    ]
