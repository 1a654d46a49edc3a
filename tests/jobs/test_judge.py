"""A job judged as one row (monitor/jobs.py) and explained as one run (postmortem/job_verdict.py),
from recorded node states: pure, no sandbox."""

from __future__ import annotations

import pytest

from orchestrator.config.inventory import parse_inventory
from orchestrator.detect.engine import default_playbooks
from orchestrator.monitor.jobs import judge_job, worst_state
from orchestrator.monitor.judge import Judgement
from orchestrator.monitor.sweep import CRITICAL, nagios_status
from orchestrator.postmortem.evidence import Evidence
from orchestrator.postmortem.job_verdict import (
    ClockOffset,
    NodeReport,
    decide,
    node_failure,
    timeline,
)
from orchestrator.postmortem.jobs import measure_offset
from orchestrator.postmortem.verdict import judge
from orchestrator.wire.model import (
    Finding,
    HostProbe,
    KernelEvent,
    Metrics,
    RunManifest,
    RunState,
    SessionState,
    Severity,
    Snapshot,
)

INV = parse_inventory(
    "hosts: {pve1: {address: 10.1.2.6}, pve2: {address: 10.1.2.7}}\n"
    "containers:\n"
    "  ct200: {host: pve1, vmid: 200, address: 10.99.0.10}\n"
    "  ct201: {host: pve2, vmid: 201, address: 10.99.0.11}\n"
    "jobs: {pair: {nodes: [ct200, ct201]}}\n"
)
JOB = INV.job("pair")
CTS = {n: INV.container(n) for n in JOB.containers}
T0 = 1_800_000_000.0
KILLED_PANE = (
    "E1201 18:49:14.841000 123 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
    "(exitcode: -9) local_rank: 0 (pid: 220) of binary: /usr/bin/python3",
    "  exitcode  : -9 (pid: 220)  (SIGKILL)",
    "  traceback : Signal 9 (SIGKILL) received by PID 220",
    "[orch] command exited with status 1 at 2026-12-01 18:49:16",
)
CLOSED = (
    "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
    "closed by peer [10.99.0.11]:10895",
)


def _manifest(name: str) -> RunManifest:
    return RunManifest("R", "torchrun ...", "/w", "train", T0, target=name)


def _snap(
    name: str,
    at: float,
    *,
    exit_status: int | None = None,
    lines: tuple[str, ...] = (),
    pane: tuple[str, ...] = (),
    container: str = "running",
    tps: float | None = None,
) -> Snapshot:
    if container != "running":
        return Snapshot(
            name, at, container_status=container, errors=(f"pve: container {name} stopped",)
        )
    run = RunState(
        "R",
        "/w/runs/R",
        manifest=_manifest(name),
        new_log_lines=lines,
        exit_status=exit_status,
        exit_status_at=at - 1 if exit_status is not None else None,
        heartbeat_age_s=0.5,
    )
    sess = SessionState("train", True, pane_dead=exit_status is not None, pane_tail=pane)
    return Snapshot(
        name,
        at,
        session=sess,
        run=run,
        container_status="running",
        metrics=Metrics(step=50, tokens_per_s=tps) if tps else None,
    )


def _judged(name: str, snap: Snapshot, state: str, *findings: Finding) -> Judgement:
    return Judgement(name, snap, state, findings, host=CTS[name].host)


def test_a_dead_rank_makes_the_job_critical_at_once_naming_it() -> None:
    judged = {
        "ct200": _judged("ct200", _snap("ct200", T0 + 60, tps=1000.0), "running"),
        "ct201": _judged(
            "ct201", _snap("ct201", T0 + 60, exit_status=1, pane=KILLED_PANE), "crashed"
        ),
    }
    jj = judge_job(JOB, CTS, judged)
    assert jj.state == "crashed" and jj.tokens_per_s == 1000.0
    (f,) = jj.findings
    assert f.kind == "job-node-failed" and f.severity == Severity.CRITICAL and f.target == "pair"
    assert f.summary == (
        "node ct201 (rank 1) crashed (a worker killed by SIGKILL, exit status 1); "
        "the other nodes will block at the next collective"
    )
    assert jj.first_failure is not None and jj.first_failure.role == "cause"
    assert nagios_status(list(judged.values()), jj.findings) == CRITICAL


def test_the_survivor_failing_first_is_still_a_consequence() -> None:
    """The survivor's own error (a closed connection) lands before the killed rank's agent
    exits: the earlier time does not make it the first failure."""
    judged = {
        "ct200": _judged("ct200", _snap("ct200", T0 + 59, exit_status=1, lines=CLOSED), "crashed"),
        "ct201": _judged(
            "ct201", _snap("ct201", T0 + 61, exit_status=1, pane=KILLED_PANE), "crashed"
        ),
    }
    jj = judge_job(JOB, CTS, judged)
    assert jj.first_failure is not None and jj.first_failure.node == "ct201"
    assert jj.findings[0].summary.endswith(
        "first; ct200 (rank 0) (peer-connection-lost) failed after it (consequences)"
    )


def test_container_stopped_and_partition_and_a_requested_stop() -> None:
    stopped = {
        "ct200": _judged("ct200", _snap("ct200", T0 + 60), "running"),
        "ct201": _judged("ct201", _snap("ct201", T0 + 60, container="stopped"), "stopped"),
    }
    assert (
        judge_job(JOB, CTS, stopped)
        .findings[0]
        .summary.startswith("node ct201 (rank 1) lost its container (stopped, pct status)")
    )
    link = KernelEvent(
        "link-down", "ixgbe 0000:3b:00.0 eno1: NIC Link is Down", at=T0 + 30, device="eno1"
    )
    running = {n: _judged(n, _snap(n, T0 + 60), "running") for n in ("ct200", "ct201")}
    jj = judge_job(
        JOB, CTS, running, probes={"pve2": HostProbe("pve2", T0 + 60, kernel_events=(link,))}
    )
    assert jj.state == "running" and jj.first_failure is not None
    assert jj.findings[0].summary.startswith("node ct201 (rank 1) lost the job network at ")
    old = {
        "pve2": HostProbe(
            "pve2",
            T0 + 60,
            kernel_events=(KernelEvent("link-down", "x", at=T0 - 5, device="eno1"),),
        )
    }
    assert judge_job(JOB, CTS, running, probes=old).findings == ()  # before the launch: not ours
    asked = RunState(
        "R",
        "/w/runs/R",
        manifest=_manifest("ct201"),
        exit_status=130,
        exit_status_at=T0 + 50,
        stop_requested_at=T0 + 49,
    )
    calm = {**running, "ct201": _judged("ct201", Snapshot("ct201", T0 + 60, run=asked), "stopped")}
    assert judge_job(JOB, CTS, calm).findings == ()


@pytest.mark.parametrize(
    ("states", "worst"),
    [
        (["running", "running"], "running"),
        (["running", "stalled"], "stalled"),
        (["unreachable", "crashed"], "crashed"),
        (["finished", "idle"], "idle"),
    ],
)
def test_a_job_is_in_its_worst_node_state(states: list[str], worst: str) -> None:
    assert worst_state(states) == worst


def _report(name: str, rank: int, *, offset: float = 0.0, **ev: object) -> NodeReport:
    evidence = Evidence(name, T0 + 200, run_id="R", run_dir="/w/runs/R", manifest=_manifest(name),
                        container_status="running", **ev)  # type: ignore[arg-type]  # fmt: skip
    pm = judge(evidence, playbooks=default_playbooks())
    node = JOB.nodes[rank]
    host = CTS[name].host
    bare = NodeReport(node, host, pm, ClockOffset(host, offset), None, CTS[name].vmid)
    return NodeReport(
        node, host, pm, bare.offset, node_failure(bare, default_playbooks()), bare.vmid
    )


def test_postmortem_orders_the_nodes_on_orchs_clock() -> None:
    """ct201's host runs 30 s ahead: its death at host time T0+100 is T0+70 on orch's clock,
    before ct200's timeout at T0+90, and it is the cause anyway."""
    r0 = _report(
        "ct200",
        0,
        exit_status=1,
        exit_status_at=T0 + 90,
        run_state="exited",
        log_tail=(
            "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/"
            "unbound_buffer.cc:81] Timed out waiting 20000ms for recv operation to complete",
        ),
    )
    r1 = _report(
        "ct201",
        1,
        offset=30.0,
        exit_status=1,
        exit_status_at=T0 + 100,
        run_state="exited",
        pane=KILLED_PANE,
    )
    v = decide(JOB, [r0, r1], default_playbooks())
    assert v.first is not None and (v.first.node, v.first.rank, v.first.at) == ("ct201", 1, T0 + 70)
    assert v.kind == "log-signature" and v.playbook == "sigkill"
    assert [(c.node, c.role, c.playbook) for c in v.consequences] == [
        ("ct200", "consequence", "gloo-timeout")
    ]
    doc = v.to_dict()
    assert doc["first_failure"]["node"] == "ct201" and doc["first_failure"]["evidence"]
    events = timeline([r0, r1])
    assert [e.at for e in events] == sorted(e.at for e in events)
    deaths = [(e.node, e.at) for e in events if e.kind == "death"]
    assert deaths == [("ct201", T0 + 70), ("ct200", T0 + 90)]


def test_clock_offset_takes_the_shortest_round_trip() -> None:
    clock = iter([10.0, 10.4, 20.0, 20.1, 30.0, 31.0])
    answers = iter(["15.0", "25.05", "35.5"])  # host clock 5 s ahead; the 2nd sample is tightest
    off = measure_offset("pve1", lambda: next(answers), now=lambda: next(clock))
    assert (
        round(off.offset_s, 3) == 5.0 and round(off.uncertainty_s, 3) == 0.05 and off.error is None
    )
    bad = measure_offset("pve2", lambda: "garbage")
    assert bad.offset_s == 0.0 and bad.error


def test_the_job_report_draws_its_markers_apart_and_explains_them() -> None:
    """ct201's death is the first failure: two markers at one instant, labels in two rows."""
    import re

    from orchestrator.postmortem.job_verdict import JobPostmortem
    from orchestrator.views.job_report import html
    from orchestrator.views.scales import overlaps

    r0 = _report("ct200", 0, exit_status=1, exit_status_at=T0 + 90, run_state="exited")
    r1 = _report(
        "ct201",
        1,
        offset=30.0,
        exit_status=1,
        exit_status_at=T0 + 100,
        run_state="exited",
        pane=KILLED_PANE,
    )
    pm = JobPostmortem(
        "pair", "R", (r0, r1), decide(JOB, [r0, r1], default_playbooks()), tuple(timeline([r0, r1]))
    )
    page = html(pm)
    for svg in re.findall(r"<svg [^>]*class=\"chart\".*?</svg>", page):
        assert 'width="100%"' in svg and 'viewBox="0 0 1000 ' in svg
        boxes = [
            (float(a), float(y) - 12, float(b), float(y))
            for y, a, b in re.findall(
                r'<text class="marker"[^>]*y="([\d.]+)"[^>]*data-left="([\d.]+)" '
                r'data-right="([\d.]+)"',
                svg,
            )
        ]
        assert len(boxes) == 5 and overlaps(boxes) == [], (
            boxes
        )  # launch, finding, failure, 2 deaths
    assert "first failure: ct201" in page and "ct201 died" in page
    assert "first failure: the node that failed first" in page and "a node died" in page
