"""Faults of the container itself, as a real Proxmox host shows them: a command that outlives
orch's timeout (``pct exec`` killed, the command not), a vmid with no container."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.errors import CommandTimeout
from orchestrator.transport.pct import DEADLINE_SLACK_S, KILL_GRACE_S
from tests.helpers import wait_for
from tests.reliability.test_run_faults import check, kinds, target

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _cmdlines(fleet, container: str) -> dict[int, list[str]]:  # type: ignore[no-untyped-def]
    found = {}
    for pid in fleet.info.container_pids(container):
        try:
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        except OSError:
            continue
    return found


@pytest.mark.fault(
    area="container and run",
    fault="a command in the container hangs past orch's timeout (nvidia-smi on a hung GPU); "
    "orch gives up and its `pct exec` is killed",
    must="CommandTimeout; the command and its children are gone from the container within "
    "the grace (lxc-attach forwards no signal: the deadline runs inside the container)",
)
def test_a_command_past_its_timeout_leaves_nothing_running(fleet, observe):  # type: ignore[no-untyped-def]
    from orchestrator.transport.connect import transport_for

    fleet.scenario("gpu-hang")  # every call on GPU 3 blocks 30 s first, as a lost GPU's can
    try:
        ct = transport_for(fleet.inventory(), "ct200")
        argv = ["nvidia-smi", "--query-gpu=index,utilization.gpu", "--format=csv"]
        started = time.monotonic()
        with pytest.raises(CommandTimeout):
            ct.run(argv, timeout=2.0)
        gave_up = time.monotonic()
        hung = [p for p, cmd in _cmdlines(fleet, "ct200").items() if "nvidia-smi" in " ".join(cmd)]
        grace = DEADLINE_SLACK_S + KILL_GRACE_S
        wait_for(
            lambda: (
                not [
                    p
                    for p, cmd in _cmdlines(fleet, "ct200").items()
                    if "nvidia-smi" in " ".join(cmd)
                ]
            ),
            grace + 5,
            what="the hung nvidia-smi gone from ct200",
        )
        gone = time.monotonic()
    finally:
        fleet.scenario("healthy")
    observe(
        f"CommandTimeout after {gave_up - started:.1f} s; {len(hung)} nvidia-smi process(es) "
        f"still in ct200 then, none {gone - gave_up:.1f} s later (grace {grace:.0f} s)"
    )
    assert hung, "the command was still running when orch gave up (else this proves nothing)"
    assert gone - gave_up < grace + 5


@pytest.mark.fault(
    area="container and run",
    fault="hosts.yaml names a vmid with no container on the host (pct: exit 2, "
    "\"Configuration file 'nodes/<node>/lxc/<vmid>.conf' does not exist\")",
    must="container status 'missing' (orch snapshot) and a container-stopped finding that says "
    "it does not exist (orch check); never 'unreachable' (the host answered), no traceback",
)
def test_a_missing_container_is_state_missing(fleet, observe, tmp_path):  # type: ignore[no-untyped-def]
    doc = yaml.safe_load(fleet.config.read_text())
    doc["containers"]["ct299"] = {**doc["containers"]["ct200"], "vmid": 299}
    config = tmp_path / "hosts.yaml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    original, fleet.config = fleet.config, config
    try:
        rc, report = check(fleet, tmp_path / "orch.db", "ct299")
        snap = fleet.orch("snapshot", "ct299", "--json")
    finally:
        fleet.config = original
    assert "Traceback" not in snap.stderr, snap.stderr
    row = json.loads(snap.stdout)
    t = target(report, "ct299")
    found = [f for f in t["findings"] if f["kind"] == "container-stopped"]
    observe(
        f"orch snapshot: container_status {row['container_status']!r}; orch check exit {rc}, state "
        f"{t['state']!r}, findings {kinds(t)}: {found[0]['summary'][:70] if found else None!r}"
    )
    assert row["container_status"] == "missing" and row["reachable"], row
    assert t["reachable"] and t["state"] != "unreachable", t
    assert found and "does not exist" in found[0]["summary"], t
