"""A job's nodes and the torchrun command each one runs (pure), and the read/stop side of a job:
``orch stop JOB``, ``orch logs JOB --node N``, the job's current run.

:mod:`orchestrator.lifecycle.job_launch` starts a job (preflight, deploy, start, verify).

Every node runs, in its container's tmux session with the same wrapper, tee and exit status
as a single run (one run id shared by all nodes)::

    [env PYTHONPATH=BUNDLE] PYTHON -m torch.distributed.run --nnodes N --nproc-per-node P
        --node-rank I --rdzv-backend c10d --rdzv-endpoint ADDR:PORT --rdzv-id RUN_ID
        --local-addr NODE_ADDR --max-restarts 0 --rdzv-conf is_host=0|1
        -m trainer --config CFG --run-dir RUN_DIR [--dist-timeout S] [TRAINER_ARGS]

``python -m torch.distributed.run`` is what the ``torchrun`` script runs (its entry point),
with the container's own interpreter rather than whichever ``torchrun`` is first on PATH.
c10d ranks nodes by ``--local-addr`` (sorted), which config/jobs.py checks matches the list;
node 0 hosts the rendezvous store (``is_host=1`` when the endpoint is its own address; every
other node says ``is_host=0``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from orchestrator.config.inventory import ContainerConfig, Inventory
from orchestrator.config.jobs import JobConfig, JobNode
from orchestrator.errors import OrchError, UsageError
from orchestrator.lifecycle.bundle import trainer_argv
from orchestrator.wire.answers import LogAnswer, RunsAnswer, StopAnswer
from orchestrator.wire.quoting import command_line, with_env

T = TypeVar("T")

JOB_ENV = ("ORCH_JOB", "ORCH_JOB_NODE_RANK", "ORCH_JOB_NNODES")
"""Variables every node's run gets (and its manifest records): which job, which node."""


def node_container(inventory: Inventory, job: JobConfig, node: JobNode) -> ContainerConfig:
    """The node's container as the job runs it: the job's trainer config and GPUs."""
    c = inventory.container(node.container)
    return dataclasses.replace(
        c, trainer_config=job.trainer_config or c.trainer_config, gpus=dict(node.gpus)
    )


def torchrun_argv(job: JobConfig, node: JobNode, run_id: str) -> list[str]:
    """torchrun's own options for ``node`` (after ``python -m torch.distributed.run``).

    >>> from orchestrator.config.jobs import JobConfig, JobNode
    >>> job = JobConfig("pair", (JobNode("ct200", 0, "10.0.0.2"), JobNode("ct201", 1, "10.0.0.3")),
    ...                 rdzv_endpoint="10.0.0.2:29400")
    >>> " ".join(torchrun_argv(job, job.nodes[1], "R1"))
    '--nnodes 2 --nproc-per-node 1 --node-rank 1 --rdzv-backend c10d --rdzv-endpoint 10.0.0.2:29400 --rdzv-id R1 --local-addr 10.0.0.3 --max-restarts 0 --rdzv-conf is_host=0'
    >>> torchrun_argv(job, job.nodes[0], "R1")[-2:]
    ['--rdzv-conf', 'is_host=1']
    """
    argv = [
        "--nnodes",
        str(len(job.nodes)),
        "--nproc-per-node",
        str(node.procs),
        "--node-rank",
        str(node.rank),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        job.rdzv_endpoint,
        "--rdzv-id",
        run_id,
        "--local-addr",
        node.address,
        "--max-restarts",
        "0",
    ]
    host = job.rdzv_endpoint.rpartition(":")[0].strip("[]")
    # no guessing from the hostname: only the node whose address is the endpoint serves the
    # store (torchrun guesses "mine" for any local address: two nodes sharing one would race
    # to bind the port, and the loser fails the rendezvous with EADDRINUSE)
    argv += ["--rdzv-conf", f"is_host={1 if host == node.address else 0}"]
    return argv


def node_command(
    job: JobConfig,
    node: JobNode,
    container: ContainerConfig,
    *,
    run_id: str,
    run_dir: str,
    bundle_dir: str | None,
    trainer_args: Sequence[str] = (),
) -> str:
    """The shell command node ``node`` runs (see the module docstring).

    ``bundle_dir`` is where the bundled trainer was deployed (``None``: the job has its own
    ``command``, which torchrun runs as given).

    >>> from orchestrator.config.jobs import JobConfig, JobNode
    >>> from orchestrator.config.inventory import ContainerConfig
    >>> job = JobConfig("pair", (JobNode("ct200", 0, "10.0.0.2"),), rdzv_endpoint="10.0.0.2:29400",
    ...                 collective_timeout_s=30.0)
    >>> c = ContainerConfig("ct200", "pve1", vmid=200, trainer_config="tiny-cpu")
    >>> cmd = node_command(job, job.nodes[0], c, run_id="R", run_dir="/w/runs/R", bundle_dir="/b")
    >>> cmd.startswith("env PYTHONPATH=/b python3 -m torch.distributed.run --nnodes 1 ")
    True
    >>> cmd.split("--max-restarts 0 --rdzv-conf is_host=1 ")[1]
    '-m trainer --config /b/trainer/configs/tiny-cpu.yaml --run-dir /w/runs/R --dist-timeout 30'
    """
    head = [container.python, "-m", "torch.distributed.run", *torchrun_argv(job, node, run_id)]
    timeout = job.collective_timeout_s
    if bundle_dir is None:
        assert job.command is not None
        env = {"ORCH_COLLECTIVE_TIMEOUT_S": f"{timeout:g}"} if timeout else {}
        return command_line(with_env(head, env)) + " " + job.command
    program = trainer_argv(container, bundle_dir, run_dir, trainer_args)
    if timeout:
        program[6:6] = ["--dist-timeout", f"{timeout:g}"]  # after --config X --run-dir Y
    return command_line(with_env([*head, *program], {"PYTHONPATH": bundle_dir}))


def node_env(job: JobConfig, node: JobNode, container: ContainerConfig) -> dict[str, str]:
    """The run's environment on ``node``: the container's, the job's, then which job and node.

    >>> from orchestrator.config.jobs import JobConfig, JobNode
    >>> from orchestrator.config.inventory import ContainerConfig
    >>> job = JobConfig("pair", (JobNode("ct200", 0, "a"), JobNode("ct201", 1, "b")),
    ...                 env={"LOGLEVEL": "INFO"})
    >>> node_env(job, job.nodes[1], ContainerConfig("ct201", "h", env={"X": "1"}))
    {'X': '1', 'LOGLEVEL': 'INFO', 'ORCH_JOB': 'pair', 'ORCH_JOB_NODE_RANK': '1', 'ORCH_JOB_NNODES': '2'}
    """
    return {
        **container.env,
        **job.env,
        "ORCH_JOB": job.name,
        "ORCH_JOB_NODE_RANK": str(node.rank),
        "ORCH_JOB_NNODES": str(len(job.nodes)),
    }


def on_nodes(
    job: JobConfig,
    fn: Callable[[JobNode], T],
    nodes: Sequence[JobNode] | None = None,
    *,
    finish_on_interrupt: bool = True,
) -> dict[str, T | OrchError]:
    """``fn(node)`` for every node (or ``nodes``) at once: container -> value, or the OrchError
    it raised (anything else propagates: a bug, not a node's problem).

    Ctrl-C (``KeyboardInterrupt`` in the calling thread) propagates. With
    ``finish_on_interrupt`` the calls in flight finish first (a second Ctrl-C stops that wait),
    so that ``fn``'s own record of what it did is complete; without it, nothing waits for them
    (the caller closes their connections: :func:`orchestrator.transport.connect.close_all`).
    """
    chosen = list(job.nodes if nodes is None else nodes)
    if not chosen:
        return {}

    def one(n: JobNode) -> T | OrchError:
        try:
            return fn(n)
        except OrchError as exc:
            return exc

    pool = ThreadPoolExecutor(max_workers=min(16, len(chosen)))
    try:
        futures = [pool.submit(one, n) for n in chosen]
        got = {n.container: f.result() for n, f in zip(chosen, futures, strict=True)}
    except KeyboardInterrupt:
        if finish_on_interrupt:
            with contextlib.suppress(KeyboardInterrupt):
                pool.shutdown(wait=True)
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    except BaseException:
        pool.shutdown(wait=True)
        raise
    pool.shutdown(wait=True)
    return got


def pick_node(job: JobConfig, text: str) -> JobNode:
    """``--node``: a container name or a rank number.

    >>> from orchestrator.config.jobs import JobConfig, JobNode
    >>> job = JobConfig("pair", (JobNode("ct200", 0, "a"), JobNode("ct201", 1, "b")))
    >>> pick_node(job, "1").container, pick_node(job, "ct200").rank
    ('ct201', 0)
    >>> pick_node(job, "ct2")
    Traceback (most recent call last):
    ...
    orchestrator.errors.UsageError: --node ct2: job pair's nodes are ct200 (rank 0), ct201 (rank 1)
    """
    for n in job.nodes:
        if text in (n.container, str(n.rank)):
            return n
    known = ", ".join(n.label for n in job.nodes)
    raise UsageError(f"--node {text}: job {job.name}'s nodes are {known}")


# --- the job's run, stop, logs (I/O through the agent) ---------------------------------------


def current_run(inventory: Inventory, job: JobConfig) -> str:
    """The job's current run id: the newest run of the first node that answers.

    Raises:
        UsageError: no node has a run (never launched); the last node's error otherwise.
    """
    from orchestrator.lifecycle.runs import runs

    errors: list[str] = []
    for n in job.nodes:
        try:
            got: RunsAnswer = runs(inventory, n.container)
        except OrchError as exc:
            errors.append(f"{n.label}: {str(exc).splitlines()[0]}")
            continue
        if got.current:
            return got.current
        errors.append(f"{n.label}: no run")
    raise UsageError(
        f"job {job.name} has no run to show ({'; '.join(errors)}); launch it: orch launch {job.name}"
    )


@dataclass(frozen=True, slots=True)
class NodeStop:
    """One node's outcome of ``orch stop JOB``: the agent's answer or why there is none."""

    node: JobNode
    answer: StopAnswer | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node.container,
            "rank": self.node.rank,
            **(self.answer.to_dict() if self.answer else {}),
            "error": self.error,
        }


def stop_job(
    inventory: Inventory,
    job: JobConfig,
    *,
    grace_s: float = 60.0,
    run_id: str | None = None,
    by: str | None = None,
    nodes: Sequence[JobNode] | None = None,
) -> list[NodeStop]:
    """Stop the job's run on every node at once (SIGINT, SIGTERM at half ``grace_s``, SIGKILL),
    each recorded as requested (``stop_requested``, ``by``). A node that cannot be reached is
    reported in its ``error``; the others are stopped anyway."""
    from orchestrator.lifecycle.stop import operator, stop

    rid = run_id or current_run(inventory, job)
    who = by or f"orch stop {job.name} by {operator()}"
    got = on_nodes(
        job,
        lambda n: stop(inventory, n.container, grace_s=grace_s, run_id=rid, by=who),
        nodes,
    )
    chosen = list(job.nodes if nodes is None else nodes)
    return [
        NodeStop(n, None, str(v).splitlines()[0]) if isinstance(v, OrchError) else NodeStop(n, v)
        for n, v in ((n, got[n.container]) for n in chosen)
    ]


def job_logs(
    inventory: Inventory, job: JobConfig, *, lines: int = 50, run_id: str | None = None
) -> list[tuple[JobNode, LogAnswer | str]]:
    """The last ``lines`` lines of the job's run on every node (or why a node has none)."""
    from orchestrator.lifecycle.runs import logs

    rid = run_id or current_run(inventory, job)
    got = on_nodes(job, lambda n: logs(inventory, n.container, lines=lines, run_id=rid))
    return [
        (n, str(v).splitlines()[0] if isinstance(v, OrchError) else v)
        for n, v in ((n, got[n.container]) for n in job.nodes)
    ]


def node_of(job: JobConfig, container: str) -> JobNode:
    """The node of ``container`` in ``job`` (``UsageError`` when it is none)."""
    try:
        return job.node(container)
    except KeyError:
        raise UsageError(f"{container} is not a node of job {job.name}") from None


def job_names(inventory: Inventory, names: Sequence[str]) -> tuple[list[str], list[str]]:
    """``names`` split into (containers, jobs), each validated; a job expands to its nodes.

    With no names: every container but ``local``, and every job.
    """
    if not names:
        return [n for n in inventory.containers if n != "local"], list(inventory.jobs)
    containers: list[str] = []
    jobs: list[str] = []
    for name in names:
        if name in inventory.jobs:
            jobs.append(name)
            containers.extend(inventory.jobs[name].containers)
        else:
            inventory.container(name)  # raises UsageError naming the known ones
            containers.append(name)
    return list(dict.fromkeys(containers)), list(dict.fromkeys(jobs))


def is_job(inventory: Inventory, name: str) -> bool:
    return name in inventory.jobs


def mapping_of(results: Mapping[str, T | OrchError]) -> dict[str, str]:
    """The errors of an :func:`on_nodes` result: container -> first line."""
    return {k: str(v).splitlines()[0] for k, v in results.items() if isinstance(v, OrchError)}


def status_rows(
    inventory: Inventory, jobs: Sequence[str], rows: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``orch status`` rows with each job as one row (its worst node's state, the nodes'
    total tokens/s) and its nodes beneath (``job`` and ``rank`` set); other rows after.

    >>> from orchestrator.config.inventory import parse_inventory
    >>> inv = parse_inventory("hosts: {h: {address: x}}\\ncontainers:\\n"
    ...     "  a: {host: h, vmid: 200, address: 10.0.0.1}\\n  b: {host: h, vmid: 201, address: 10.0.0.2}\\n"
    ...     "jobs: {pair: {nodes: [a, b]}}\\n")
    >>> out = status_rows(inv, ["pair"], [{"target": "a", "state": "running", "tokens_per_s": 10.0},
    ...                                   {"target": "b", "state": "crashed", "tokens_per_s": None}])
    >>> [(r["target"], r["state"], r.get("rank")) for r in out]
    [('pair', 'crashed', None), ('a', 'running', 0), ('b', 'crashed', 1)]
    >>> out[0]["tokens_per_s"], out[0]["kind"]
    (10.0, 'job')
    """
    from orchestrator.monitor.jobs import worst_state

    by_name = {r["target"]: r for r in rows}
    out: list[dict[str, Any]] = []
    placed: set[str] = set()
    for name in jobs:
        job = inventory.job(name)
        nodes = [
            {**by_name[n.container], "job": name, "rank": n.rank}
            for n in job.nodes
            if n.container in by_name
        ]
        rates = [r["tokens_per_s"] for r in nodes if r.get("tokens_per_s") is not None]
        out.append(
            {
                "target": name,
                "kind": "job",
                "state": worst_state([r.get("state") or "unreachable" for r in nodes]),
                "reachable": any(r.get("reachable") for r in nodes),
                "tokens_per_s": sum(rates) if rates else None,
                "nodes": [r["target"] for r in nodes],
                "rendezvous": job.rdzv_endpoint,
            }
        )
        out.extend(nodes)
        placed.update(r["target"] for r in nodes)
    out.extend(r for r in rows if r["target"] not in placed)
    return out
