"""What a Ctrl-C during ``orch launch JOB`` left behind, node by node (pure): the launcher
keeps a :class:`Done` as it goes and says :func:`interrupted_text` when interrupted."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.config.jobs import JobConfig


@dataclass
class Done:
    """How far a job launch got, for the message of a Ctrl-C: ``stage`` is ``preflight``
    (preflight and deploy: nothing started), ``start`` (the agents were asked to start the
    nodes), ``started`` (verify) or ``stopping`` (a failure stops the nodes); ``started`` and
    ``refused`` hold the containers whose agent answered the start, yes or no."""

    stage: str = "preflight"
    started: set[str] = field(default_factory=set)
    refused: set[str] = field(default_factory=set)


def interrupted_text(job: JobConfig, run_id: str, done: Done) -> str:
    """What a Ctrl-C left behind, node by node, and the command that undoes it (pure).

    >>> from orchestrator.config.jobs import JobConfig, JobNode
    >>> job = JobConfig("pair", (JobNode("ct200", 0, "a"), JobNode("ct201", 1, "b")))
    >>> interrupted_text(job, "R", Done())
    'job pair: interrupted before the start step: nothing was started on any node'
    >>> print(interrupted_text(job, "R", Done("started", {"ct200", "ct201"})))
    job pair: interrupted: node ct200 (rank 0) started in ct200 and is still running; node ct201 (rank 1) started in ct201 and is still running (run R): orch stop pair --run R stops it
    >>> print(interrupted_text(job, "R", Done("start", {"ct201"}, {"ct200"})))
    job pair: interrupted in the start step: node ct201 (rank 1) started in ct201 and is still running (run R): orch stop pair --run R stops it; node ct200 (rank 0) did not start
    >>> print(interrupted_text(job, "R", Done("start", {"ct201"})))
    job pair: interrupted in the start step: node ct201 (rank 1) started in ct201 and is still running (run R): orch stop pair --run R stops it; node ct200 (rank 0) may have started (no answer yet: orch status pair says; the same orch stop stops it)
    """
    if done.stage == "preflight" or (done.stage == "start" and done.refused >= _names(job)):
        return f"job {job.name}: interrupted before the start step: nothing was started on any node"
    where = {"start": " in the start step", "stopping": " while stopping the nodes after a failure"}
    running = "may still be running" if done.stage == "stopping" else "is still running"
    undo = f"orch stop {job.name} --run {run_id} stops it"
    parts = [
        f"node {n.label} started in {n.container} and {running}"
        for n in job.nodes
        if n.container in done.started
    ]
    text = f"job {job.name}: interrupted{where.get(done.stage, '')}: " + (
        f"{'; '.join(parts)} (run {run_id}): {undo}" if parts else f"run {run_id}: {undo} if so"
    )
    if done.stage == "stopping":
        return text
    for n in job.nodes:
        if n.container in done.refused:
            text += f"; node {n.label} did not start"
        elif n.container not in done.started:
            text += (
                f"; node {n.label} may have started (no answer yet: orch status {job.name} "
                "says; the same orch stop stops it)"
            )
    return text


def _names(job: JobConfig) -> set[str]:
    return {n.container for n in job.nodes}
