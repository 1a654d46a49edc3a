"""``orch postmortem JOB``: every node's evidence, the hosts' clock offsets, one timeline, the
first failure, and one bundle (the I/O half; the judgement is
:mod:`orchestrator.postmortem.job_verdict`).

Collects each node's evidence at once (:func:`orchestrator.postmortem.collect.collect`: run
directory, log tail, pane, flight recorder, the host's ``pct status``, kernel log and probe),
and measures each host's clock against orch's over SSH (``date +%s.%N``, best of three by
round trip). The bundle is ``<state>/postmortems/<job>-<run>-<UTC stamp>/``: the job's
``findings.json``, ``timeline.json``, ``report.md`` and ``report.html``, and one
sub-directory per node with its single-run bundle.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.config.inventory import Inventory
from orchestrator.config.jobs import JobConfig, JobNode
from orchestrator.errors import OrchError, Refused
from orchestrator.lifecycle.jobs import current_run, on_nodes
from orchestrator.postmortem.collect import Report, collect, write_bundle
from orchestrator.postmortem.job_verdict import (
    ClockOffset,
    JobPostmortem,
    NodeReport,
    decide,
    node_failure,
    timeline,
)
from orchestrator.postmortem.verdict import judge
from orchestrator.wire import paths
from orchestrator.wire.formats import utc_stamp

CLOCK_SAMPLES = 3

JobReport = Callable[[JobPostmortem], tuple[str, str]]
"""``report(pm) -> (report.md, report.html)`` for a job: the view's rendering."""


def parse_clock(text: str) -> float:
    """``date +%s.%N``'s answer as Unix seconds.

    >>> parse_clock("1700000000.250000000\\n")
    1700000000.25
    """
    return float(text.strip().split()[0])


def measure_offset(
    host: str, run: Callable[[], str], now: Callable[[], float] = time.time
) -> ClockOffset:
    """The host's clock minus ours: ``run()`` returns the host's ``date +%s.%N``; the sample
    with the shortest round trip wins (its midpoint is the best estimate of when the host
    read its clock). Never raises: a failure is ``error``, offset 0."""
    best: tuple[float, float] | None = None
    error = None
    for _ in range(CLOCK_SAMPLES):
        t0 = now()
        try:
            remote = parse_clock(run())
        except (OrchError, OSError, ValueError, IndexError) as exc:
            error = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            continue
        t1 = now()
        sample = (remote - (t0 + t1) / 2, (t1 - t0) / 2)
        if best is None or sample[1] < best[1]:
            best = sample
    if best is None:
        return ClockOffset(host, 0.0, 0.0, error or "no answer")
    return ClockOffset(host, best[0], best[1])


def _host_clock(inventory: Inventory, host: str) -> ClockOffset:
    from orchestrator.transport.connect import host_transport

    tp = host_transport(inventory, host)

    def once() -> str:
        res = tp.run(["date", "+%s.%N"], timeout=10.0)
        if not res.ok:
            raise OrchError(f"{host}: date: {res.err.strip()[:200] or res.exit_status}")
        return res.out

    return measure_offset(host, once)


def postmortem_job(
    inventory: Inventory,
    job: JobConfig,
    *,
    run_id: str | None = None,
    out: Path | str | None = None,
    write: bool = True,
    report: JobReport | None = None,
    node_report: Report | None = None,
) -> JobPostmortem:
    """Collect every node, measure the clocks, judge, and (by default) write the bundle.

    Raises:
        UsageError: the job has no run (never launched) or ``run_id`` is unknown.
        Refused: ``out`` exists and is not empty (exit 4).
    """
    from orchestrator.detect.engine import default_playbooks

    rid = run_id or current_run(inventory, job)
    hosts = sorted({inventory.container(n.container).host for n in job.nodes})
    offsets = {h: ClockOffset(h) for h in hosts}
    remote = [h for h in hosts if h != "local"]

    def gather(n: JobNode) -> Any:
        return collect(inventory, n.container, run_id=rid)

    evidence = on_nodes(job, gather)
    if remote:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=len(remote)) as pool:
            for off in pool.map(lambda h: _host_clock(inventory, h), remote):
                offsets[off.host] = off
    pbs = default_playbooks()
    reports: list[NodeReport] = []
    for n in job.nodes:
        c = inventory.container(n.container)
        ev = evidence[n.container]
        if isinstance(ev, OrchError):
            raise ev
        single = judge(ev, limits=c.limits, roles=c.roles_by_gpu, playbooks=pbs)
        r = NodeReport(n, c.host, single, offsets[c.host], None, c.vmid)
        reports.append(NodeReport(n, c.host, single, offsets[c.host], node_failure(r, pbs), c.vmid))
    verdict = decide(job, reports, pbs)
    pm = JobPostmortem(
        job.name,
        rid,
        tuple(reports),
        verdict,
        tuple(timeline(reports)),
        time.time(),
        None,
        tuple(offsets[h] for h in hosts),
    )
    if not write:
        return pm
    if report is None or node_report is None:
        raise ValueError("postmortem_job(write=True) needs report= and node_report=")
    return write_job_bundle(pm, out, report=report, node_report=node_report)


def default_job_bundle_dir(pm: JobPostmortem, now: float | None = None) -> Path:
    stamp = utc_stamp(now)
    return paths.state_dir() / "postmortems" / f"{pm.job}-{pm.run_id}-{stamp}"


def write_job_bundle(
    pm: JobPostmortem, out: Path | str | None, *, report: JobReport, node_report: Report
) -> JobPostmortem:
    """The job's files and one single-run bundle per node (``<rank>-<node>/``); 0700/0600.

    Raises:
        Refused: ``out`` exists and is not empty (a bundle is never overwritten; exit 4).
    """
    import dataclasses

    target = Path(out).expanduser() if out else default_job_bundle_dir(pm)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise Refused(f"{target}: exists and is not empty; choose another --out")
    paths.ensure_private_dir(target)
    nodes = tuple(
        dataclasses.replace(
            n,
            postmortem=write_bundle(
                n.postmortem, target / f"{n.node.rank}-{n.node.container}", report=node_report
            ),
        )
        for n in pm.nodes
    )
    pm = dataclasses.replace(pm, nodes=nodes, bundle=str(target))
    md, html = report(pm)
    files = {
        "findings.json": json.dumps(pm.to_dict(), indent=2, default=str) + "\n",
        "timeline.json": json.dumps([e.to_dict() for e in pm.timeline], indent=2) + "\n",
        "report.md": md,
        "report.html": html,
    }
    for name, text in files.items():
        paths.write_private(target / name, text)
    return pm
