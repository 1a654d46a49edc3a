"""The sandbox's simulated hosts and job network (orchestrator/sandbox/hosts.py, network.py):
each host's pct sees only its own containers and has its own kernel log; containers on two
hosts reach each other on the job network and nothing of it is in this machine's namespace;
a partition silences the link and is written in that host's kernel log."""

from __future__ import annotations

import subprocess
import sys

import pytest

from orchestrator.sandbox import network
from orchestrator.sandbox.control import run_pct
from orchestrator.sandbox.state import read_state
from tests.jobs.cluster import Cluster

pytestmark = [pytest.mark.e2e]

PROBE = (
    "import socket, sys\n"
    "s = socket.socket(); s.settimeout(float(sys.argv[2]))\n"
    "try:\n    s.connect((sys.argv[1], 9)); print('open')\n"
    "except ConnectionRefusedError:\n    print('refused')\n"  # a reply: the peer is reachable
    "except OSError as e:\n    print(type(e).__name__)\n"
)


def _probe(c: Cluster, ct: str, host: str, address: str, timeout: float) -> str:
    vmid = ct.removeprefix("ct")
    res = run_pct(
        c.state_dir,
        "exec",
        vmid,
        "--",
        sys.executable,
        "-c",
        PROBE,
        address,
        str(timeout),
        host=host,
    )
    return res.stdout.strip() or res.stderr.strip()


def test_each_host_sees_its_own_containers_and_kernel_log(job_cluster: Cluster) -> None:
    c = job_cluster
    assert c.info.hosts == ("sandbox", "sandbox2")
    assert [c.info.host_of(ct) for ct in c.info.containers] == [
        "sandbox",
        "sandbox",
        "sandbox2",
        "sandbox2",
    ]
    listed = run_pct(c.state_dir, "list", host="sandbox2").stdout
    assert [line.split()[0] for line in listed.splitlines()[1:]] == ["202", "203"]
    wrong = run_pct(c.state_dir, "exec", "200", "--", "true", host="sandbox2")
    assert wrong.returncode == 2
    assert wrong.stderr == "Configuration file 'nodes/sandbox2/lxc/200.conf' does not exist\n"
    k2 = (c.state_dir / "hosts" / "sandbox2" / "kernel.log").read_text()
    assert "port 4(veth202i0) entered forwarding state" in k2 and "veth200i0" not in k2


def test_job_network_connects_hosts_and_stays_out_of_this_namespace(job_cluster: Cluster) -> None:
    c = job_cluster
    mine = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    assert "10.99.0." not in mine and "veth20" not in mine
    hosts_file = c.info.host_path("ct202", "/etc/hosts").read_text()
    assert "10.99.0.12\tct202" in hosts_file  # the hostname resolves to the job address
    assert _probe(c, "ct200", "sandbox", c.info.address("ct203") or "", 5) == "refused"
    state = read_state(c.state_dir)
    network.partition(c.state_dir, state, "sandbox2")
    try:
        assert _probe(c, "ct200", "sandbox", "10.99.0.13", 1.5) == "TimeoutError"  # silent
        assert _probe(c, "ct202", "sandbox2", "10.99.0.13", 5) == "refused"  # same host still fine
        k2 = (c.state_dir / "hosts" / "sandbox2" / "kernel.log").read_text()
        assert "eno1: NIC Link is Down" in k2
    finally:
        network.heal(c.state_dir, state, "sandbox2")
    assert _probe(c, "ct200", "sandbox", "10.99.0.13", 5) == "refused"
