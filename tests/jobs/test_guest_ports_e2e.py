"""Another guest starting and stopping beside a running job, on the job's host, in the real
LXC sandbox: Proxmox's port lines for it (firewall bridge, VM tap: sandbox/kernel.py
``append_guest_ports``) leave the job running, never ``job-node-failed``."""

from __future__ import annotations

import json
import time

import pytest

from tests.helpers import wait_for
from tests.jobs.cluster import Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_guest_starting_beside_a_running_job_leaves_it_ok(job_cluster: Cluster) -> None:
    from orchestrator.sandbox import kernel

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
        run_id = c.launch(config, "pair")["run_id"]
        for ct in ("ct200", "ct201"):
            wait_for(lambda ct=ct: "step=" in c.log(ct, run_id), 60, what=f"steps in {ct}'s log")
        lines = [
            *kernel.append_guest_ports(c.state_dir, 250, host="sandbox"),  # a CT, firewall on
            *kernel.append_guest_ports(c.state_dir, 300, vm=True, host="sandbox"),  # a VM
            *kernel.append_guest_ports(c.state_dir, 250, start=False, host="sandbox"),
        ]
        assert any("fwpr250p0) entered disabled state" in x for x in lines)
        seen = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and seen < 2:  # two checks after the lines
            rc, check, _s = c.check(config, "pair")
            job = check["targets"][0]
            assert rc == 0 and job["state"] == "running", json.dumps(job)[:2000]
            assert "job-node-failed" not in json.dumps(check)
            assert {n["state"] for n in job["nodes"]} == {"running"}, job["nodes"]
            seen += 1
        assert seen == 2
    finally:
        c.cleanup()
