"""Host faults: the Proxmox host reboots between a run's death and its postmortem.

``journalctl -k`` reads the current boot only; an Xid 79 (the GPU fell off the bus) is the
usual end of a run and of the host's boot, so after the reboot the evidence is in the boot
before (``journalctl -k -b -1``). The sandbox's reboot (``manager.reboot``) stops every
container, starts a new boot in its kernel log and starts the containers again; the run's
files stay, as on a real host.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.fault(
    area="host",
    fault="host reboot between death and postmortem (an Xid 79 ended the run, then the boot)",
    must="`orch postmortem`: the GPU fell off the bus, with the evidence from the previous boot "
    "(journalctl -k -b -1) and saying so; the kernel.log of the bundle marks both boots",
)
def test_postmortem_after_a_host_reboot_reads_the_previous_boot(fleet, observe, tmp_path):
    from orchestrator.postmortem.collect import PREVIOUS_BOOT, THIS_BOOT
    from orchestrator.sandbox import manager

    fleet.start_container("ct200")
    fleet.scenario("idle")
    fleet.agent_launch("ct200")
    run = fleet.run_dir("ct200")
    wait_for(lambda: "step=" in (run / "train.log").read_text(), 20, what="the first step")
    pgid = int((run / "pgid").read_text().split()[0])
    victim = fleet.info.host_pid("ct200", pgid)
    fleet.kernel_line(
        f"NVRM: Xid (PCI:0000:5d:00): 79, pid={victim}, name=python3, GPU has fallen off the bus."
    )
    fleet.kernel_line("NVRM: GPU 0000:5d:00.0: GPU has fallen off the bus.")
    manager.reboot(fleet.state_dir)
    wait_for(lambda: fleet.info.init_pid("ct200"), 30, what="ct200 back after the reboot")
    res = fleet.orch("postmortem", "ct200", "--json", "--out", str(tmp_path / "pm"))
    assert "Traceback" not in res.stderr, res.stderr
    doc = json.loads(res.stdout)
    v = doc["verdict"]
    observe(
        f"postmortem exit {res.returncode}: verdict {v['kind']!r} ({v['playbook']}): "
        f"{v['summary'][:120]}; boots read: {doc['kernel_log_boots']}"
    )
    assert doc["kernel_log_boots"] == ["previous", "current"]
    assert v["playbook"] == "gpu-fallen-off-bus", v
    assert "previous boot" in v["summary"], v
    assert doc["exit_status"] is None
    assert all(e["boot"] == -1 for e in doc["kernel_events"] if e["kind"] == "xid")
    kernel_log = (tmp_path / "pm" / "kernel.log").read_text()
    assert PREVIOUS_BOOT in kernel_log and THIS_BOOT in kernel_log
    before, after = kernel_log.split(THIS_BOOT)
    assert "Xid (PCI:0000:5d:00): 79" in before and "Xid" not in after
