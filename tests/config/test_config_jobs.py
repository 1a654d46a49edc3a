"""hosts.yaml ``jobs:``: what a job resolves to, and one file:line error per mistake (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import run
from orchestrator.config.inventory import parse_inventory
from orchestrator.errors import ConfigError, UsageError

BASE = """\
hosts:
  pve1: {address: 10.1.2.6}
  pve2: {address: 10.1.2.7}
containers:
  ct200: {host: pve1, vmid: 200, address: 10.99.0.10, gpus: {target: [0, 1], drafter: [2]}}
  ct201: {host: pve2, vmid: 201, address: 10.99.0.11, trainer_config: tiny-cpu}
  ct202: {host: pve2, vmid: 202}
  ct203: {host: pve2, vmid: 203, address: 10.99.0.9}
"""


def test_shortest_job_takes_every_default() -> None:
    inv = parse_inventory(BASE + "jobs: {pair: {nodes: [ct200, ct201]}}\n")
    job = inv.job("pair")
    assert job.containers == ("ct200", "ct201")
    assert [(n.rank, n.address, n.procs) for n in job.nodes] == [
        (0, "10.99.0.10", 1),
        (1, "10.99.0.11", 1),
    ]
    assert job.rdzv_endpoint == "10.99.0.10:29400" and job.rdzv_port == 29400
    assert job.command is None and job.collective_timeout_s is None
    assert job.env == {"LOGLEVEL": "INFO"}
    assert job.nodes[0].gpus == {"target": (0, 1), "drafter": (2,)}  # the container's
    assert inv.job_of("ct201") is job and inv.job_of("ct202") is None


def test_every_field() -> None:
    text = BASE + (
        "jobs:\n"
        "  big:\n"
        "    nodes: [ct200, {container: ct201, procs: 2, gpus: {all: '0-3'}}]\n"
        "    procs_per_node: 4\n"
        "    gpus: {all: [4, 5]}\n"
        "    rendezvous: {port: 29500, endpoint: 'head.example:29600'}\n"
        "    command: [train.py, --lr, '1e-3; rm -rf /']\n"
        "    trainer_config: instant-cpu\n"
        "    env: {GLOO_SOCKET_IFNAME: eth0, LOGLEVEL: WARNING}\n"
        "    collective_timeout: 30\n"
    )
    job = parse_inventory(text).job("big")
    assert [(n.procs, n.gpu_indices) for n in job.nodes] == [(4, (4, 5)), (2, (0, 1, 2, 3))]
    assert job.rdzv_endpoint == "head.example:29600" and job.rdzv_port == 29500
    assert job.command == "train.py --lr '1e-3; rm -rf /'"
    assert job.env == {"LOGLEVEL": "WARNING", "GLOO_SOCKET_IFNAME": "eth0"}
    assert job.collective_timeout_s == 30.0 and job.trainer_config == "instant-cpu"


@pytest.mark.parametrize(
    ("jobs", "expected"),
    [
        (
            "jobs:\n  x: {nodes: [ct200, ct299]}\n",
            "10: jobs.x.nodes[1]: 'ct299' is not a container; did you mean 'ct203'?",
        ),
        (
            "jobs:\n  x: {nodes: [ct200, ct200]}\n",
            "10: jobs.x.nodes[1]: ct200 is listed twice (first as jobs.x.nodes[0])",
        ),
        (
            "jobs:\n  x: {nodes: [ct200]}\n  y:\n    nodes:\n      - ct201\n      - ct200\n",
            "14: jobs.y.nodes[1]: ct200 is already a node of job 'x' (line 10); a container "
            "runs one job at a time",
        ),
        (
            "jobs:\n  x:\n    nodes: [ct200,\n            ct202]\n",
            "12: jobs.x.nodes[1]: container ct202 has no address on the job network; set "
            "containers.ct202.address",
        ),
        (
            "jobs:\n  x: {nodes: [ct203, ct200]}\n",
            "10: jobs.x.nodes[1]: torchrun's c10d rendezvous ranks nodes by their sorted "
            "address, and ct200 (10.99.0.10) sorts before ct203 (10.99.0.9); list the nodes in "
            "that order (addresses compare as text)",
        ),
        ("jobs:\n  ct200: {nodes: [ct201]}\n", "10: jobs.ct200: a container is called 'ct200'"),
        ("jobs:\n  x: {nods: [ct200]}\n", "10: jobs.x.nods: unknown key; did you mean 'nodes'?"),
        ("jobs:\n  x: {procs_per_node: 2}\n", "10: jobs.x.nodes: missing (required)"),
        ("jobs:\n  x: {nodes: []}\n", "10: jobs.x.nodes: must be a list of at least one"),
        (
            "jobs:\n  x: {nodes: [{container: ct200, procs: 0}]}\n",
            "10: jobs.x.nodes[0].procs: must be an integer from 1 to 1024 (got 0)",
        ),
        (
            "jobs:\n  x: {nodes: [{procs: 2}]}\n",
            "10: jobs.x.nodes[0].container: missing (required)",
        ),
        (
            "jobs:\n  x: {nodes: [ct200], rendezvous: {prot: 1}}\n",
            "10: jobs.x.rendezvous.prot: unknown key; did you mean 'port'?",
        ),
        (
            "jobs:\n  x: {nodes: [ct200], rendezvous: {endpoint: nohost}}\n",
            "10: jobs.x.rendezvous.endpoint: must be HOST:PORT",
        ),
        (
            "jobs:\n  x: {nodes: [ct200], rendezvous: {backend: etcd}}\n",
            "10: jobs.x.rendezvous.backend: only c10d is supported",
        ),
        (
            "jobs:\n  x: {nodes: [ct200], collective_timeout: -1}\n",
            "10: jobs.x.collective_timeout: must be a number of seconds > 0",
        ),
        (
            "containers:\n  ct9: {host: pve1, vmid: 209, address: '10.0.0.1 x'}\n",
            "9: containers.ct9.address: must be a host name or IP address without spaces",
        ),
    ],
    ids=[
        "not-a-container",
        "duplicate-node",
        "shared-container",
        "missing-address",
        "rank-order",
        "name-clash",
        "unknown-key",
        "no-nodes",
        "empty-nodes",
        "bad-procs",
        "node-without-container",
        "bad-rendezvous-key",
        "bad-endpoint",
        "bad-backend",
        "bad-timeout",
        "bad-address",
    ],
)
def test_job_mistake_is_one_line_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], jobs: str, expected: str
) -> None:
    text = BASE + jobs
    if jobs.startswith("containers:"):
        text = BASE + jobs.replace("containers:\n", "")
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(ConfigError):
        parse_inventory(text)
    assert run(["-c", str(path), "hosts"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"error: {path}:{expected}"), err
    assert err.count("\n") == 1


def test_unknown_job_names_the_known_ones() -> None:
    inv = parse_inventory(BASE + "jobs: {pair: {nodes: [ct200, ct201]}}\n")
    with pytest.raises(UsageError, match="no job 'piar' in .*; did you mean 'pair'"):
        inv.job("piar")
