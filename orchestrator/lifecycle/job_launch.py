"""``orch launch JOB``: one torchrun job over several containers, started as one run.

Phases, each over every node at once and reported to ``on_phase`` like a single launch:

1. **preflight** every node (:func:`orchestrator.lifecycle.preflight.preflight`: container
   running, no live session, GPUs idle, disk, tmux, torch); nothing starts unless all pass
   (:class:`JobPreflightRefused` lists every node's problems, exit 4);
2. **deploy** the bundled trainer to every node (unless the job has a ``command``);
3. **start** every node's torchrun in its tmux session with the same wrapper, tee and exit
   status as a single run, under one run id (also torchrun's ``--rdzv-id``);
4. **verify**: every node reached the rendezvous (torchrun's ``Rendezvous complete`` record
   with ``group_rank``, or the bundled trainer's banner) and made its first step (heartbeat,
   a ``step=`` line), with the rank the config lists.

A node that dies (or a container that stops) before all of that, or a job that does not get
there within the nodes' ``startup_timeout_s``, stops the other nodes and fails the launch
(:class:`JobLaunchFailed`, exit 1) naming the node, its rank and why: its exit status, last
log lines and the playbook diagnosis.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.inventory import Inventory
from orchestrator.config.jobs import JobConfig, JobNode
from orchestrator.errors import AgentRefused, LaunchFailed, LaunchInterrupted, OrchError, Refused
from orchestrator.lifecycle.bundle import check_trainer_args, trainer_bundle, trainer_config
from orchestrator.lifecycle.job_interrupt import Done, interrupted_text
from orchestrator.lifecycle.jobs import (
    NodeStop,
    node_command,
    node_container,
    node_env,
    on_nodes,
    stop_job,
)
from orchestrator.lifecycle.launch import VERIFY_POLL_S, PhaseCallback, diagnose, parse_env_options
from orchestrator.lifecycle.preflight import preflight
from orchestrator.lifecycle.runs import launch_request, run_request
from orchestrator.monitor.state import stepped, target_state
from orchestrator.remote import deploy
from orchestrator.remote.target import Target
from orchestrator.wire.answers import LaunchAnswer, RunStatus
from orchestrator.wire.formats import new_run_id
from orchestrator.wire.model import Snapshot
from orchestrator.wire.secrets import redact, secret_values

log = logging.getLogger(__name__)

FAIL_STOP_GRACE_S = 10.0
"""Grace the surviving nodes get when a launch fails (they only wait at the rendezvous or a
collective: nothing to checkpoint yet)."""

RENDEZVOUS = re.compile(r"Rendezvous complete for workers|^trainer: world_size=\d+")
GROUP_RANK = re.compile(
    r"\]\s+group_rank=(\d+)\s*$|^trainer: world_size=\d+ rank=(\d+) local_rank=0\b"
)
DEAD_STATES = ("crashed", "dead", "finished", "stopped")


class JobPreflightRefused(Refused):
    """Preflight found problems on at least one node; nothing was started anywhere (exit 4).

    >>> str(JobPreflightRefused("pair", {"ct201 (rank 1)": ["module 'x' does not import"]}))
    "pair: launch refused, nothing was started on any node:\\n  ct201 (rank 1): module 'x' does not import"
    """

    def __init__(self, job: str, problems: dict[str, list[str]]) -> None:
        self.job, self.problems = job, problems
        lines = [f"  {node}: {p}" for node, ps in problems.items() for p in ps]
        super().__init__(
            f"{job}: launch refused, nothing was started on any node:\n" + "\n".join(lines)
        )


class JobLaunchFailed(LaunchFailed):
    """A node failed after the start, or the job never proved itself; the others were stopped
    (exit 1). ``node`` is the one to blame (``None``: a timeout that blames none)."""

    def __init__(
        self, message: str, node: JobNode | None, stopped: Sequence[NodeStop] = ()
    ) -> None:
        self.node, self.stopped = node, list(stopped)
        super().__init__(message)


@dataclass
class NodeProgress:
    """What verify has seen of one node so far."""

    node: JobNode
    target: Target
    run_dir: str = ""
    log_path: str = ""
    rendezvous: bool = False
    group_rank: int | None = None
    first_step: bool = False
    state: str = "starting"
    snapshot: Snapshot | None = None
    lines: list[str] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return self.rendezvous and self.first_step and self.state == "running"

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node.container,
            "rank": self.node.rank,
            "address": self.node.address,
            "host": self.target.container.host,
            "run_dir": self.run_dir,
            "log_path": self.log_path,
            "state": self.state,
            "rendezvous": self.rendezvous,
            "group_rank": self.group_rank,
            "first_step": self.first_step,
        }


@dataclass(frozen=True, slots=True)
class JobLaunchResult:
    """What ``orch launch JOB`` reports. ``verified`` is ``None`` with ``--no-verify``."""

    job: str
    run_id: str
    rendezvous: str
    nodes: tuple[dict[str, Any], ...]
    verified: bool | None
    elapsed_s: float
    phases: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": True,
            "job": self.job,
            "run_id": self.run_id,
            "rendezvous": self.rendezvous,
            "nodes": list(self.nodes),
            "verified": self.verified,
            "elapsed_s": round(self.elapsed_s, 3),
            "phases": list(self.phases),
        }


def scan(progress: NodeProgress, lines: Sequence[str]) -> None:
    """Note the rendezvous and the node's group rank in new log lines (pure on ``progress``).

    >>> from orchestrator.config.jobs import JobNode
    >>> p = NodeProgress(JobNode("ct201", 1, "a"), None)  # type: ignore[arg-type]
    >>> scan(p, ["I1201 18:36:11.996000 4 api.py:553]   group_rank=1",
    ...          "I1201 18:36:11.996000 4 api.py:553] [default] Rendezvous complete for workers."])
    >>> p.rendezvous, p.group_rank
    (True, 1)
    """
    for line in lines:
        if RENDEZVOUS.search(line):
            progress.rendezvous = True
        m = GROUP_RANK.search(line)
        if m:
            progress.group_rank = int(m.group(1) or m.group(2))
    progress.lines = (progress.lines + list(lines))[-200:]


def launch_job(
    inventory: Inventory,
    job: JobConfig,
    *,
    env: Sequence[str] = (),
    run_name: str | None = None,
    force: bool = False,
    verify: bool = True,
    grace_s: float = 60.0,
    on_phase: PhaseCallback | None = None,
    trainer_args: Sequence[str] = (),
) -> JobLaunchResult:
    """Preflight, deploy, start and verify ``job`` on all its nodes (see the module doc).

    Raises:
        JobPreflightRefused: nothing was started (exit 4).
        JobLaunchFailed: a node died or the job never proved itself; the others were
            stopped (exit 1).
        UsageError: trainer arguments with a job ``command``.
    """
    report = on_phase or (lambda _p, _s, _d: None)
    t0 = time.monotonic()
    phases: list[dict[str, Any]] = []

    def phase(name: str, status: str, detail: str = "") -> None:
        phases.append(
            {
                "phase": name,
                "status": status,
                "detail": detail,
                "at_s": round(time.monotonic() - t0, 3),
            }
        )
        report(name, status, detail)

    bundled = job.command is None
    if trainer_args and not bundled:
        from orchestrator.errors import UsageError

        raise UsageError(
            f"arguments after -- go to the bundled trainer; job {job.name} runs its own command: put them there"
        )
    check_trainer_args(trainer_args)
    extra_env = parse_env_options(env)
    run_id = new_run_id(run_name)
    done = Done()
    try:
        return _launch_job(
            inventory,
            job,
            phase,
            done,
            t0,
            phases,
            run_id=run_id,
            extra_env=extra_env,
            force=force,
            verify=verify,
            grace_s=grace_s,
            trainer_args=trainer_args,
        )
    except KeyboardInterrupt:
        if done.stage != "start":  # the start step's calls were waited for (on_nodes)
            _close_connections()  # the threads still reading end now, not at their timeout
        raise LaunchInterrupted(interrupted_text(job, run_id, done)) from None


def _close_connections() -> None:
    from orchestrator.transport.connect import close_all

    close_all()


def _launch_job(
    inventory: Inventory,
    job: JobConfig,
    phase: PhaseCallback,
    done: Done,
    t0: float,
    phases: list[dict[str, Any]],
    *,
    run_id: str,
    extra_env: dict[str, str],
    force: bool,
    verify: bool,
    grace_s: float,
    trainer_args: Sequence[str],
) -> JobLaunchResult:
    """:func:`launch_job` after its arguments were checked; notes its progress in ``done``."""
    bundled = job.command is None
    containers = {n.container: node_container(inventory, job, n) for n in job.nodes}
    targets = {n.container: Target(inventory, n.container) for n in job.nodes}
    n_nodes = len(job.nodes)

    phase("preflight", "start", f"{n_nodes} nodes: {', '.join(n.label for n in job.nodes)}")

    def check(n: JobNode) -> dict[str, Any]:
        c = containers[n.container]
        cfg = trainer_config(c, trainer_args) if bundled else None
        return preflight(
            targets[n.container], gpus=n.gpu_indices, bundled=bundled, force=force, config=cfg
        )

    pre = on_nodes(job, check, finish_on_interrupt=False)
    problems = {
        n.label: (list(getattr(v, "problems", None) or [str(v).splitlines()[0]]))
        for n in job.nodes
        if isinstance((v := pre[n.container]), OrchError)
    }
    if problems:
        phase("preflight", "fail", "; ".join(f"{k}: {v[0]}" for k, v in problems.items()))
        raise JobPreflightRefused(job.name, problems)
    live = [n for n in job.nodes if pre[n.container]["live"]]  # type: ignore[index]
    phase(
        "preflight",
        "ok",
        f"all {n_nodes} nodes: containers running, GPUs idle, disk free"
        + (
            f"; replacing live runs on {', '.join(n.container for n in live)} (--force)"
            if live
            else ""
        ),
    )

    bundles: dict[str, str | None] = dict.fromkeys(containers)
    if bundled:
        phase("deploy", "start", f"bundled trainer to {n_nodes} nodes")
        got = on_nodes(
            job,
            lambda n: deploy.ensure_agent(
                targets[n.container].transport,
                containers[n.container].workdir,
                containers[n.container].python,
                bundle=trainer_bundle(),
            ),
            finish_on_interrupt=False,
        )
        failed = {k: v for k, v in got.items() if isinstance(v, OrchError)}
        if failed:
            name, exc = next(iter(failed.items()))
            phase("deploy", "fail", f"{name}: {exc}")
            raise exc
        bundles = {k: str(v) for k, v in got.items()}
        phase("deploy", "ok", f"{n_nodes} nodes")
    else:
        phase("deploy", "skip", "the job's own command")

    secrets = secret_values(
        {**job.env, **extra_env, **{k: v for c in containers.values() for k, v in c.env.items()}}
    )
    progress = {n.container: NodeProgress(n, targets[n.container]) for n in job.nodes}
    phase(
        "start",
        "start",
        f"torchrun on {n_nodes} nodes, rendezvous {job.rdzv_endpoint}, run {run_id}",
    )

    done.stage = "start"

    def start(n: JobNode) -> LaunchAnswer:
        c = containers[n.container]
        run_dir = f"{c.workdir.rstrip('/')}/runs/{run_id}"
        cmd = node_command(
            job,
            n,
            c,
            run_id=run_id,
            run_dir=run_dir,
            bundle_dir=bundles[n.container],
            trainer_args=trainer_args,
        )
        req = launch_request(
            c,
            cmd,
            run_id,
            n.gpu_indices,
            grace_s=grace_s,
            settle_s=0.5,
            force=force,
            target=n.container,
        )
        env = {**node_env(job, n, c), **extra_env}
        try:
            answer = targets[n.container].launch(req, env, timeout=grace_s + 60.0)
        except AgentRefused as exc:
            done.refused.add(n.container)
            msg = redact(str(exc.said or exc.doc), secrets)
            raise LaunchFailed(f"{n.label}: could not start: {msg}") from None
        done.started.add(n.container)
        return answer

    started = on_nodes(job, start)
    bad = {k: v for k, v in started.items() if isinstance(v, OrchError)}
    for name, answer in started.items():
        if isinstance(answer, LaunchAnswer):
            progress[name].run_dir, progress[name].log_path = answer.run_dir, answer.log_path
    if bad:
        name, exc = next(iter(bad.items()))
        node = job.node(name)
        phase("start", "fail", str(exc).splitlines()[0])
        ok = [job.node(k) for k, v in started.items() if not isinstance(v, OrchError)]
        done.stage = "stopping"
        stopped = (
            stop_job(
                inventory,
                job,
                grace_s=FAIL_STOP_GRACE_S,
                run_id=run_id,
                nodes=ok,
                by=f"orch launch {job.name}: {node.label} failed to start",
            )
            if ok
            else []
        )
        raise JobLaunchFailed(_failed_text(job, node, str(exc), stopped, run_id), node, stopped)
    phase("start", "ok", f"run {run_id} on {n_nodes} nodes")
    done.stage = "started"

    def result(verified: bool | None) -> JobLaunchResult:
        return JobLaunchResult(
            job.name,
            run_id,
            job.rdzv_endpoint,
            tuple(p.to_dict() for p in progress.values()),
            verified,
            time.monotonic() - t0,
            tuple(phases),
        )

    if not verify:
        phase("verify", "skip", "--no-verify")
        return result(None)
    timeout = max(containers[n.container].limits.startup_timeout_s for n in job.nodes)
    phase(
        "verify",
        "start",
        f"every node at the rendezvous and past its first step, up to {timeout:g} s",
    )
    try:
        verify_job(inventory, job, run_id, progress, timeout_s=timeout, secrets=secrets, done=done)
    except JobLaunchFailed as exc:
        phase("verify", "fail", str(exc).splitlines()[0])
        raise
    phase(
        "verify",
        "ok",
        f"{n_nodes} nodes rendezvoused (ranks {', '.join(str(p.group_rank if p.group_rank is not None else p.node.rank) for p in progress.values())}) and stepping",
    )
    return result(True)


def _look(p: NodeProgress, run_id: str) -> None:
    """One snapshot of a node (continuing its log where the last one stopped)."""
    t = p.target
    try:
        snap = (
            t.snapshot(t.offset, run_id=run_id)
            if t.offset is not None
            else t.snapshot(0, run_id=run_id)
        )
    except OrchError as exc:
        p.state = "unreachable"
        p.lines.append(f"[orch] {exc}")
        return
    p.snapshot = snap
    if snap.run is not None and snap.run.run_id == run_id:
        scan(p, snap.run.new_log_lines)
    if snap.session is not None:
        scan(p, [x for x in snap.session.pane_tail if RENDEZVOUS.search(x) or GROUP_RANK.search(x)])
    p.first_step = p.first_step or (
        snap.run is not None and snap.run.run_id == run_id and stepped(snap)
    )
    grace = p.target.container.limits.startup_grace_s
    p.state = target_state(snap, startup_grace_s=grace)
    if p.state == "starting" and snap.run is not None:
        p.state = "running"  # alive; what verify waits for is the rendezvous and a step


def verify_job(
    inventory: Inventory,
    job: JobConfig,
    run_id: str,
    progress: dict[str, NodeProgress],
    *,
    timeout_s: float,
    secrets: Sequence[str] = (),
    done: Done | None = None,
) -> None:
    """Poll every node until all rendezvoused with their listed rank and stepped.

    ``done.stage`` becomes ``stopping`` while a failure stops the nodes (for Ctrl-C's message).

    Raises:
        JobLaunchFailed: a node died, its container stopped, torchrun ranked it otherwise, or
            the deadline passed; the other nodes were stopped first.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        on_nodes(job, lambda n: _look(progress[n.container], run_id), finish_on_interrupt=False)
        for n in job.nodes:
            p = progress[n.container]
            if p.state in DEAD_STATES:
                _fail(inventory, job, run_id, p, _death_text(p, run_id, secrets), done)
            if p.group_rank is not None and p.group_rank != n.rank:
                _fail(
                    inventory,
                    job,
                    run_id,
                    p,
                    f"torchrun's c10d rendezvous gave it group rank {p.group_rank}, not {n.rank} as "
                    f"listed (c10d ranks nodes by their sorted --local-addr)",
                    done,
                )
        if all(p.ready for p in progress.values()):
            return
        if time.monotonic() >= deadline:
            late = [p for p in progress.values() if not p.ready]
            first = late[0]
            why = "never reached the rendezvous" if not first.rendezvous else "made no step"
            names = ", ".join(
                f"{p.node.label} ({'no rendezvous' if not p.rendezvous else 'no step'})"
                for p in late
            )
            _fail(
                inventory,
                job,
                run_id,
                first if len(late) == 1 else None,
                f"{why} within {timeout_s:g} s; waiting: {names}",
                done,
            )
        time.sleep(VERIFY_POLL_S)


def _death_text(p: NodeProgress, run_id: str, secrets: Sequence[str]) -> str:
    """Why node ``p`` is dead: exit status or container, when, the last lines, a diagnosis."""
    snap = p.snapshot
    when = (
        "before the rendezvous"
        if not p.rendezvous
        else "before its first step"
        if not p.first_step
        else "during startup"
    )
    if p.state == "stopped" and snap is not None and snap.container_status not in (None, "running"):
        return f"its container stopped {when} (pct status: {snap.container_status})"
    status: RunStatus | None = None
    try:
        status = p.target.call(run_request(p.target.container, run_id))
    except OrchError as exc:
        log.info("%s: no run status: %s", p.node.container, exc)
    code = status.exit_status if status is not None else None
    lines = [
        redact(str(x), secrets) for x in (status.log_tail if status is not None else p.lines[-30:])
    ]
    how = f"exit status {code}" if code is not None else "no exit status (vanished)"
    diagnosis = diagnose(lines, code)
    tail = "\n".join(f"    | {x}" for x in lines[-12:]) or "    (the log is empty)"
    return f"died {when}: {how}\n  last log lines ({p.log_path}):\n{tail}" + (
        f"\n  diagnosis: {diagnosis}" if diagnosis else ""
    )


def _fail(
    inventory: Inventory,
    job: JobConfig,
    run_id: str,
    culprit: NodeProgress | None,
    why: str,
    done: Done | None = None,
) -> None:
    """Stop every node (the culprit too: a dead one answers not-running), then raise."""
    if done is not None:
        done.stage = "stopping"
    blame = culprit.node if culprit is not None else None
    by = f"orch launch {job.name}: " + (
        f"{blame.label} failed" if blame else "the job did not start in time"
    )
    stopped = stop_job(inventory, job, grace_s=FAIL_STOP_GRACE_S, run_id=run_id, by=by)
    raise JobLaunchFailed(_failed_text(job, blame, why, stopped, run_id), blame, stopped)


def _failed_text(
    job: JobConfig, node: JobNode | None, why: str, stopped: Sequence[NodeStop], run_id: str
) -> str:
    who = f"node {node.label}" if node is not None else "the job"
    first, _, rest = why.partition("\n")
    text = f"{job.name}: {who} {first}" + (f"\n{rest}" if rest else "")
    done = [s for s in stopped if s.answer is not None and s.answer.stopped]
    if done:
        text += "\n  stopped the other nodes: " + ", ".join(
            f"{s.node.label} ({'/'.join(s.answer.signals) or 'no signal'}, exit {s.answer.exit_status})"
            for s in done
            if s.answer is not None
        )
    errs = [s for s in stopped if s.error]
    if errs:
        text += "\n  could not stop: " + "; ".join(f"{s.node.label}: {s.error}" for s in errs)
    text += (
        f"\n  the run directories are kept (run {run_id}): orch logs {job.name} --node "
        f"{node.container if node else job.nodes[0].container}, orch postmortem {job.name}"
    )
    return text
