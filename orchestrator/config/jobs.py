"""hosts.yaml ``jobs:``: one torchrun job over several containers (and hosts), validated.

A job names its nodes (containers, in rank order), how many processes each runs (or the
GPUs it uses, by role), the c10d rendezvous (default endpoint: the first node's address on
the job network and port 29400), the command torchrun runs (default: the bundled trainer),
extra environment and the collective timeout. Every mistake is one ``ConfigError`` naming
file, line and key, as for the rest of hosts.yaml:

    hosts.yaml:31: jobs.pair.nodes[1]: 'ct299' is not a container; did you mean 'ct201'?

Ranks follow the list. torchrun's c10d rendezvous ranks nodes in the sorted order of
their ``--local-addr`` (torch ``dynamic_rendezvous._mark_rendezvous_complete`` sorts the node
descriptors, address first), and orch passes each node's job-network address there, so a
list whose addresses do not sort that way is refused here rather than ranked otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from orchestrator.config.reader import NodeReader, describe, join_key, show, suggest
from orchestrator.config.schema import JOB_FIELDS, FieldSpec

DEFAULT_RDZV_PORT = 29400
"""torchrun's customary c10d rendezvous port (its docs' examples)."""


@dataclass(frozen=True, slots=True)
class JobNode:
    """One node of a job: ``container`` runs torchrun's agent as node ``rank``.

    ``address`` is the container's address on the job network (``--local-addr``; rank 0's is
    the rendezvous endpoint by default); ``gpus`` the GPUs by role it uses (the job's, else
    the container's); ``procs`` the processes torchrun starts there (``--nproc-per-node``).
    """

    container: str
    rank: int
    address: str
    procs: int = 1
    gpus: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        """Every GPU the node uses, sorted, each once."""
        return tuple(sorted({i for ids in self.gpus.values() for i in ids}))

    @property
    def label(self) -> str:
        """``ct201 (rank 1)``: how messages name a node.

        >>> JobNode("ct201", 1, "10.0.0.2").label
        'ct201 (rank 1)'
        """
        return f"{self.container} (rank {self.rank})"


@dataclass(frozen=True, slots=True)
class JobConfig:
    """A validated ``jobs.NAME`` entry. ``command`` is what torchrun runs after its own options
    (``None``: the bundled trainer); ``collective_timeout_s`` is the trainer's
    ``--dist-timeout`` (``None``: torch's default)."""

    name: str
    nodes: tuple[JobNode, ...]
    rdzv_port: int = DEFAULT_RDZV_PORT
    rdzv_endpoint: str = ""
    command: str | None = None
    trainer_config: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    collective_timeout_s: float | None = None

    @property
    def containers(self) -> tuple[str, ...]:
        """The nodes' container names, in rank order."""
        return tuple(n.container for n in self.nodes)

    def node(self, name: str) -> JobNode:
        """The node run by container ``name`` (``KeyError`` when none is)."""
        for n in self.nodes:
            if n.container == name:
                return n
        raise KeyError(name)


DEFAULT_JOB_ENV = {"LOGLEVEL": "INFO"}
"""torchrun logs each node's rendezvous result (``group_rank=N``) at INFO only."""


def _reader_kinds(r: NodeReader) -> dict[str, Any]:
    """The job-only field kinds, read with ``r`` (the others are NodeReader's)."""

    def procs(node: yaml.Node, key: str) -> int:
        return r.integer(node, key, 1, 1024, "an integer from 1 to 1024")

    def rendezvous(node: yaml.Node, key: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, knode, vnode in r.mapping(node, key):
            sub = join_key(key, name)
            if name == "port":
                out["port"] = r.kind_port(vnode, sub)
            elif name == "endpoint":
                out["endpoint"] = _endpoint(r, vnode, sub)
            elif name == "backend":
                if r.text(vnode, sub) != "c10d":
                    raise r.fail(vnode, sub, "only c10d is supported (torchrun's default)")
            else:
                raise r.fail(
                    knode, sub, f"unknown key{suggest(name, ['port', 'endpoint', 'backend'])}"
                )
        return out

    return {"procs": procs, "rendezvous": rendezvous}


def _endpoint(r: NodeReader, node: yaml.Node, key: str) -> str:
    """``HOST:PORT`` with a port from 1 to 65535 (``[v6]:PORT`` too)."""
    text = r.word(node, key, "HOST:PORT")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise r.fail(
            node, key, f"must be HOST:PORT with a port from 1 to 65535 (got {show(text)!r})"
        )
    return text


def _field(
    r: NodeReader, spec: FieldSpec, node: yaml.Node, key: str, kinds: Mapping[str, Any]
) -> Any:
    if spec.nullable and r.is_null(node):
        return None
    if spec.kind in kinds:
        return kinds[spec.kind](node, key)
    return r.field(spec, node, key)


def build_jobs(
    r: NodeReader,
    section: yaml.Node,
    containers: Mapping[str, Any],
    container_nodes: Mapping[str, yaml.Node],
) -> dict[str, JobConfig]:
    """Every ``jobs.NAME`` of ``section`` against the inventory's containers.

    ``containers`` maps a name to its ``ContainerConfig`` (``address``, ``gpus`` are read);
    ``container_nodes`` to the line of its entry, for messages.

    Raises:
        ConfigError: file:line and key of the first mistake.
    """
    kinds = _reader_kinds(r)
    specs = {s.key: s for s in JOB_FIELDS}
    owner: dict[str, tuple[str, int]] = {}
    jobs: dict[str, JobConfig] = {}
    for name, knode, vnode in r.mapping(section, "jobs", "name"):
        key = join_key("jobs", name)
        if not name or not name.isprintable() or "/" in name or name.startswith("-"):
            raise r.fail(
                knode,
                key,
                "names must be printable, not empty, without '/' and not starting with '-'",
            )
        if name in containers:
            raise r.fail(
                knode,
                key,
                f"a container is called {show(name)!r} too; give the job another name (commands take either)",
            )
        values: dict[str, Any] = {}
        nodes: dict[str, yaml.Node] = {}
        for fname, fknode, fvnode in r.mapping(vnode, key):
            spec = specs.get(fname)
            if spec is None:
                raise r.fail(
                    fknode, join_key(key, fname), f"unknown key{suggest(fname, list(specs))}"
                )
            nodes[spec.attr] = fvnode
            if spec.kind != "nodes":
                values[spec.attr] = _field(r, spec, fvnode, join_key(key, fname), kinds)
        if "nodes" not in nodes:
            raise r.fail(
                knode,
                join_key(key, "nodes"),
                "missing (required): the containers of the job, in rank order",
            )
        job_nodes = _nodes(
            r, nodes["nodes"], join_key(key, "nodes"), values, containers, kinds, owner
        )
        for i, n in enumerate(job_nodes):
            owner[n.container] = (name, nodes["nodes"].value[i].start_mark.line + 1)
        rdzv = values.pop("rendezvous", None) or {}
        port = int(rdzv.get("port", DEFAULT_RDZV_PORT))
        endpoint = rdzv.get("endpoint") or f"{_host_part(job_nodes[0].address)}:{port}"
        env = {**DEFAULT_JOB_ENV, **(values.pop("env", None) or {})}
        values.pop("procs", None)
        values.pop("gpus", None)
        jobs[name] = JobConfig(
            name=name, nodes=job_nodes, rdzv_port=port, rdzv_endpoint=endpoint, env=env, **values
        )
    return jobs


def _host_part(address: str) -> str:
    """An address as the host of ``HOST:PORT`` (an IPv6 address in brackets).

    >>> _host_part("10.0.0.2"), _host_part("fd00::2")
    ('10.0.0.2', '[fd00::2]')
    """
    return f"[{address}]" if ":" in address else address


def _nodes(
    r: NodeReader,
    node: yaml.Node,
    key: str,
    job: Mapping[str, Any],
    containers: Mapping[str, Any],
    kinds: Mapping[str, Any],
    owner: Mapping[str, tuple[str, int]],
) -> tuple[JobNode, ...]:
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        got = "an empty list" if isinstance(node, yaml.SequenceNode) else describe(node)
        raise r.fail(node, key, f"must be a list of at least one container name (got {got})")
    seen: dict[str, int] = {}
    out: list[JobNode] = []
    for i, item in enumerate(node.value):
        ikey = f"{key}[{i}]"
        own: dict[str, Any] = {}
        if isinstance(item, yaml.MappingNode):
            for fname, fknode, fvnode in r.mapping(item, ikey):
                sub = join_key(ikey, fname)
                if fname == "container":
                    own["container"] = r.text(fvnode, sub, "a container name")
                elif fname == "procs":
                    own["procs"] = kinds["procs"](fvnode, sub)
                elif fname == "gpus":
                    own["gpus"] = r.kind_gpus(fvnode, sub)
                else:
                    raise r.fail(
                        fknode, sub, f"unknown key{suggest(fname, ['container', 'procs', 'gpus'])}"
                    )
            if "container" not in own:
                raise r.fail(
                    item,
                    join_key(ikey, "container"),
                    "missing (required): the container of this node",
                )
        else:
            own["container"] = r.text(item, ikey, "a container name")
        name = own["container"]
        ct = containers.get(name)
        if ct is None:
            raise r.fail(
                item,
                ikey,
                f"{show(name)!r} is not a container{suggest(name, [c for c in containers if c != 'local'], 'containers')}",
            )
        if name in seen:
            raise r.fail(item, ikey, f"{name} is listed twice (first as {key}[{seen[name]}])")
        if name in owner:
            other, line = owner[name]
            raise r.fail(
                item,
                ikey,
                f"{name} is already a node of job {other!r} (line {line}); a container runs one job at a time",
            )
        seen[name] = i
        address = getattr(ct, "address", None)
        if not address:
            raise r.fail(
                item,
                ikey,
                f"container {name} has no address on the job network; set containers.{name}.address",
            )
        gpus = own.get("gpus", job.get("gpus"))
        out.append(
            JobNode(
                container=name,
                rank=i,
                address=address,
                procs=int(own.get("procs", job.get("procs") or 1)),
                gpus=dict(gpus if gpus is not None else getattr(ct, "gpus", {})),
            )
        )
    addresses = [n.address for n in out]
    for i, (a, b) in enumerate(zip(addresses, addresses[1:], strict=False)):
        if a == b:
            raise r.fail(
                node.value[i + 1],
                f"{key}[{i + 1}]",
                f"{out[i + 1].container} has the same address as {out[i].container} ({a}); each node needs its own",
            )
        if b < a:
            raise r.fail(
                node.value[i + 1],
                f"{key}[{i + 1}]",
                f"torchrun's c10d rendezvous ranks nodes by their sorted address, and "
                f"{out[i + 1].container} ({b}) sorts before {out[i].container} ({a}); list the "
                f"nodes in that order (addresses compare as text)",
            )
    return tuple(out)
