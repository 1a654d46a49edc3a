"""Another guest's ports on a job's host (pure, no sandbox): the lines Proxmox's kernel logs
when a guest starts or stops beside the job (sandbox/kernel.py ``guest_port_lines``, the
order of pve-common Network.pm) never fail the job; its own port going down does."""

from __future__ import annotations

from orchestrator.agent.kernel import parse_kernel_log
from orchestrator.monitor.jobs import judge_job
from orchestrator.sandbox.kernel import guest_port_lines
from orchestrator.wire.model import HostProbe
from tests.jobs.test_judge import CTS, JOB, T0, _judged, _snap


def _probe(lines: list[str]) -> dict[str, HostProbe]:
    stamped = [f"{T0 + 30 + i * 1e-3:.6f} pve2 kernel: {x}" for i, x in enumerate(lines)]
    return {
        "pve2": HostProbe("pve2", T0 + 60, kernel_events=tuple(parse_kernel_log(stamped, None)))
    }


def test_guests_starting_and_stopping_beside_the_job_leave_it_ok() -> None:
    running = {n: _judged(n, _snap(n, T0 + 60), "running") for n in ("ct200", "ct201")}
    for lines in (
        guest_port_lines(250),  # a container with the firewall on
        guest_port_lines(300, vm=True),  # a VM
        guest_port_lines(301, vm=True, firewall=False),
        guest_port_lines(250, start=False),
        guest_port_lines(202),  # a third container, no firewall
    ):
        jj = judge_job(JOB, CTS, running, probes=_probe(lines))
        assert jj.findings == () and jj.state == "running", (lines, jj.findings)


def test_another_guests_port_going_down_is_not_the_jobs() -> None:
    running = {n: _judged(n, _snap(n, T0 + 60), "running") for n in ("ct200", "ct201")}
    down = [
        "vmbr0: port 3(fwpr250p0) entered disabled state",
        "vmbr0: port 4(tap300i0) entered disabled state",
    ]
    assert judge_job(JOB, CTS, running, probes=_probe(down)).findings == ()
    own = ["fwbr201i0: port 2(veth201i0) entered disabled state"]  # ct201's own port, alone
    jj = judge_job(JOB, CTS, running, probes=_probe(own))
    assert jj.findings and "lost the job network" in jj.findings[0].summary
