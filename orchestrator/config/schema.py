"""The hosts.yaml schema: one row per key, the source of validation and of docs/hosts-yaml.md.

``config_reader.py`` reads each key by its ``kind``; :func:`schema_markdown`
renders the reference, regenerated with
``python -m orchestrator.config.inventory --markdown > docs/hosts-yaml.md`` (a test fails
when the committed file drifts from it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from orchestrator.config.limits import Limits

TOP_LEVEL = ("defaults", "hosts", "containers", "jobs")
"""The top level of hosts.yaml holds exactly these mappings."""


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One key of a host or container entry: how it is read and how it is documented."""

    key: str
    attr: str
    kind: str
    type_doc: str
    default_doc: str
    doc: str
    in_defaults: bool = True
    nullable: bool = False


HOST_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec(
        "address",
        "address",
        "address",
        "string",
        "the `ssh_config` alias",
        "IP or DNS name of the Proxmox host. Required unless `ssh_config` is set.",
        in_defaults=False,
    ),
    FieldSpec("port", "port", "port", "integer 1-65535", "`22`", "SSH port."),
    FieldSpec(
        "user",
        "user",
        "login",
        "string",
        "`root`",
        "SSH user; it must be allowed to run `pct` (root on Proxmox).",
    ),
    FieldSpec(
        "identity_file",
        "identity_file",
        "path",
        "path",
        "none (ssh-agent, `~/.ssh/id_*`)",
        "Private key file. `~` expands; a relative path is relative to the directory "
        "of hosts.yaml.",
        nullable=True,
    ),
    FieldSpec(
        "ssh_config",
        "ssh_config",
        "alias",
        "string",
        "none",
        "A `Host` alias in `~/.ssh/config`; its HostName, User, Port, IdentityFile, "
        "ProxyJump and ProxyCommand fill what this entry leaves unset, read as `ssh -G` "
        "reads them (Include, Match; docs/ssh.md). `orch hosts HOST --ssh` shows the result.",
        in_defaults=False,
        nullable=True,
    ),
    FieldSpec(
        "known_hosts",
        "known_hosts",
        "path",
        "path",
        "`~/.ssh/known_hosts`",
        "File the host key is checked against. Unknown keys are refused (`orch trust "
        "HOST` records one); `~` expands, relative to hosts.yaml's directory.",
        nullable=True,
    ),
    FieldSpec(
        "proxy_jump",
        "proxy_jump",
        "login",
        "string `[user@]host[:port]`",
        "none",
        "Jump host, as `ssh -J`: `j1,j2,...` for a chain (first hop first), each hop "
        "resolved through `~/.ssh/config`.",
        nullable=True,
    ),
    FieldSpec(
        "connect_timeout_s",
        "connect_timeout_s",
        "seconds",
        "number > 0",
        "`10`",
        "Seconds to wait for TCP connect, SSH handshake and authentication.",
    ),
    FieldSpec(
        "keepalive_s",
        "keepalive_s",
        "seconds",
        "number > 0",
        "`5`",
        "Seconds between liveness checks on an open connection.",
    ),
    FieldSpec(
        "observe",
        "observe",
        "observe",
        "`auto`, `host` or `container`",
        "`auto`",
        "Where `check`, `watch` and `export` observe this host's containers from: `host` (one "
        "observer process on the Proxmox host reads every container, its GPUs and the kernel "
        "log, over one SSH channel), `container` (an agent inside each container through `pct "
        "exec`), `auto` (the host when it has Python >= 3.10, else the containers). `orch "
        "doctor` says which path each container uses and why.",
    ),
    FieldSpec(
        "host_python",
        "host_python",
        "text",
        "string",
        "`python3`",
        "Interpreter on the Proxmox host for the host observer and the host probe.",
    ),
    FieldSpec(
        "agent_dir",
        "agent_dir",
        "hostdir",
        "absolute path",
        "`/var/lib/orch`",
        "Directory on the Proxmox host for orch's host-side agent, deployed by content hash. "
        "It must be owned by the SSH user (root) and writable by nobody else: orch refuses "
        "to run from one that is not.",
    ),
)

CONTAINER_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec(
        "host",
        "host",
        "hostref",
        "string",
        "`local` for the container named `local`",
        "A key of `hosts`, or `local` (this machine: no SSH, no pct).",
        in_defaults=False,
    ),
    FieldSpec(
        "vmid",
        "vmid",
        "vmid",
        "integer >= 100",
        "none",
        "Proxmox container id (`pct exec VMID`). Required on a host; absent for local.",
        in_defaults=False,
        nullable=True,
    ),
    FieldSpec(
        "address",
        "address",
        "address",
        "string",
        "none",
        "The container's IP address on the job network (the network between the nodes of a "
        "`jobs:` entry), not how orch reaches it (that is always the host's SSH and pct). "
        "Required for a container that is a job node.",
        in_defaults=False,
        nullable=True,
    ),
    FieldSpec(
        "workdir",
        "workdir",
        "workdir",
        "absolute path",
        "`/root/orch`",
        "Directory in the container holding the agent and `runs/`. For `host: local`, `~` "
        "expands, a relative path is relative to hosts.yaml's directory, and the default is "
        "`~/.local/state/orch/local/NAME` (a `defaults:` workdir applies only to containers "
        "on hosts).",
    ),
    FieldSpec(
        "session",
        "session",
        "session",
        "string",
        "`train`",
        "tmux session the run lives in. No `.` or `:` (tmux cannot hold them), "
        "no control characters, not empty.",
    ),
    FieldSpec(
        "gpus",
        "gpus",
        "gpus",
        "mapping role -> GPU list",
        "`{}` (every GPU, no roles)",
        'GPU indices by role, e.g. `{target: [0,1,2,3,4], drafter: "5-7"}`. A list '
        'may hold integers and ranges (`"0-4"`); a GPU belongs to one role at most.',
        in_defaults=False,
    ),
    FieldSpec(
        "env",
        "env",
        "env",
        "mapping NAME -> string",
        "`{}`",
        "Environment of every command orch runs in the container (the agent, the run), laid "
        "over `PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin`, "
        "`HOME=/root`, `LANG=C.UTF-8`; nothing of the host's environment is passed (pct "
        "would keep it, with its PATH forced to `/sbin:/bin:/usr/sbin:/usr/bin`). "
        "Values are taken literally; names that look secret (`*TOKEN*`, `*KEY*`, "
        "`*SECRET*`, `*PASSWORD*`) are masked in everything orch writes and reach only the "
        "run, over stdin into its 0600 `env` file: never a command line, which `ps` shows "
        "(the others are also `env -i NAME=value` arguments of every command). Merged key "
        "by key with `defaults.env`.",
    ),
    FieldSpec(
        "command",
        "command",
        "command",
        "string, or list of strings",
        "the bundled trainer",
        "What `orch launch` runs: a shell command line, or an argv list (quoted by orch).",
        nullable=True,
    ),
    FieldSpec(
        "python",
        "python",
        "text",
        "string",
        "`python3`",
        "Interpreter in the container for the agent and the bundled trainer.",
    ),
    FieldSpec(
        "requires",
        "requires",
        "requires",
        "list of module names",
        "`[]`",
        "Python modules that must import in the container before launch (preflight).",
    ),
    FieldSpec(
        "trainer_config",
        "trainer_config",
        "text",
        "string",
        "none",
        "Config file for the bundled trainer.",
        nullable=True,
    ),
    FieldSpec(
        "thresholds",
        "limits",
        "thresholds",
        "mapping",
        "see below",
        "Detector thresholds (table below). Merged key by key with `defaults.thresholds`.",
    ),
    FieldSpec(
        "log_patterns",
        "log_patterns",
        "patterns",
        "mapping name -> regex",
        "`{}`",
        "Extra log signatures (Python regular expressions) flagged as `log-signature`. "
        "Merged key by key with `defaults.log_patterns`.",
    ),
    FieldSpec(
        "log_format",
        "log_format",
        "framework",
        "a progress reader's name",
        "detected from the log",
        "Which framework prints the run's progress lines (docs/progress.md lists the readers: "
        "`hf-trainer`, `lightning`, `deepspeed`, `megatron`, `torchtitan`, ...); "
        "`log_patterns` still override single metrics.",
        nullable=True,
    ),
    FieldSpec(
        "poll_interval",
        "poll_interval_s",
        "seconds",
        "number > 0",
        "`2`",
        "Seconds between snapshots in `watch`.",
    ),
)


# --- restart policy: the `restart:` key and its reference section ----------------

RESTART_FIELD = FieldSpec(
    "restart",
    "restart",
    "restart",
    "mapping, or `false`",
    "none (never restarted)",
    "When `orch supervise` / `orch check --heal` relaunch a dead run (section below). Merged "
    "key by key with `defaults.restart`; `restart: false` turns it off for one container.",
)
CONTAINER_FIELDS = (*CONTAINER_FIELDS, RESTART_FIELD)


def restart_markdown() -> list[str]:
    """The ``restart:`` section of docs/hosts-yaml.md, from :data:`~orchestrator.config.restart.RESTART_KEYS`."""
    from orchestrator.config.restart import RESTART_KEYS

    out = [
        "## Restart policy (`restart:`)",
        "",
        "How often and how soon a dead run may be relaunched; whether a relaunch can help is the"
        " playbook's call (`restart.retryable`, docs/self-healing.md). Example:"
        " `restart: {max: 3, window: 6h, backoff: [60, 300, 900], on: [crashed, silent-death,"
        " stall]}`.",
        "",
    ]
    return [*out, *_key_table(RESTART_KEYS), ""]


def _key_table(keys: Iterable[Any]) -> list[str]:
    """A ``key | type | default | meaning`` table of ``keys`` (FieldSpec or restart keys)."""
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    return rows + [
        f"| `{k.key}` | {_cell(k.type_doc)} | {_cell(k.default_doc)} | {_cell(k.doc)} |"
        for k in keys
    ]


# --- end of the restart policy block -------------------------------------------------------


JOB_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec(
        "nodes",
        "nodes",
        "nodes",
        "list of container names (or mappings)",
        "required",
        "The containers of the job, in rank order: node 0 hosts the rendezvous. An entry is a "
        "name, or `{container: NAME, procs: N, gpus: {...}}` to set that node's own processes "
        "or GPUs. Each container must have an `address`; a container belongs to one job at "
        "most. torchrun's c10d ranks nodes by their sorted address, so the addresses must "
        "sort (as text) in the listed order.",
    ),
    FieldSpec(
        "procs_per_node",
        "procs",
        "procs",
        "integer >= 1",
        "`1`",
        "Processes torchrun starts on each node (`--nproc-per-node`); the bundled trainer "
        "uses all of a node's GPUs from one process.",
    ),
    FieldSpec(
        "gpus",
        "gpus",
        "gpus",
        "mapping role -> GPU list",
        "each node's container `gpus`",
        "GPUs every node uses, by role (as a container's `gpus`); `CUDA_VISIBLE_DEVICES` of "
        "each node and what preflight checks are idle.",
    ),
    FieldSpec(
        "rendezvous",
        "rendezvous",
        "rendezvous",
        "mapping `{port, endpoint}`",
        "`{port: 29400}`",
        "The c10d rendezvous (`--rdzv-backend c10d`): `port`, and `endpoint` (`HOST:PORT`), "
        "by default the first node's address and that port. The run id is orch's run id "
        "(`--rdzv-id`).",
    ),
    FieldSpec(
        "command",
        "command",
        "command",
        "string, or list of strings",
        "the bundled trainer",
        "What torchrun runs after its own options on every node: a script and its arguments "
        "(`train.py --lr 1e-3`) or `-m module ...`; an argv list is quoted by orch.",
        nullable=True,
    ),
    FieldSpec(
        "trainer_config",
        "trainer_config",
        "text",
        "string",
        "each node's container `trainer_config`",
        "Config of the bundled trainer (a bundled name such as `tiny-cpu`, or a path in the "
        "containers).",
        nullable=True,
    ),
    FieldSpec(
        "env",
        "env",
        "env",
        "mapping NAME -> string",
        "`{LOGLEVEL: INFO}`",
        "Environment of every node, laid over its container's `env` (e.g. `NCCL_SOCKET_IFNAME`, "
        "`GLOO_SOCKET_IFNAME`: the job network's interface). `LOGLEVEL=INFO` makes torchrun "
        "log its rendezvous (each node's rank), which launch and postmortem read.",
    ),
    FieldSpec(
        "collective_timeout",
        "collective_timeout_s",
        "seconds",
        "number > 0",
        "torch's (30 min gloo, 10 min NCCL)",
        "Seconds a collective waits for the other ranks before it fails: the bundled "
        "trainer's `--dist-timeout`; a custom command finds it in `$ORCH_COLLECTIVE_TIMEOUT_S`.",
        nullable=True,
    ),
)


def _job_markdown() -> list[str]:
    """The ``jobs:`` section of docs/hosts-yaml.md."""
    out = [
        "## Jobs (`jobs.NAME`)",
        "",
        "One torchrun job over several containers, on one host or several (docs/jobs.md)."
        " The shortest is `jobs: {pair: {nodes: [ct200, ct201]}}`: the bundled trainer under"
        " `torchrun --nnodes 2 --rdzv-backend c10d`, each node with its container's"
        " `trainer_config`. A job name must differ from every container name; `orch launch`,"
        " `stop`, `logs`, `check`, `watch`, `status`, `export` and `postmortem` take either."
        " Refused with file:line: a node that is not a container, a node listed twice, a"
        " container in two jobs, a node without an `address`, addresses out of rank order.",
        "",
    ]
    return [*out, *_key_table(JOB_FIELDS), ""]


_LIMIT_NOTES = {
    "imbalance_util_pct": "Utilization spread (percentage points) between GPUs of one role "
    "that counts as imbalance.",
    "imbalance_samples": "Consecutive imbalanced samples before gpu-imbalance fires.",
    "min_free_disk_gib": "Free disk (GiB) under the workdir below which orch warns.",
}
"""Words for Limits fields that carry no docstring in limits.py (a docstring there wins)."""


def limit_docs() -> dict[str, str]:
    """Each Limits field's attribute docstring, read from limits.py's source.

    A field without its own docstring shares the next one's when they form a group
    (``ghost_util_pct``, ``ghost_mem_mib`` -> ``ghost_samples``), else a note above.
    """
    import ast
    import inspect

    from orchestrator.config import limits as limits_module

    tree = ast.parse(inspect.getsource(limits_module))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Limits")
    docs: dict[str, str] = {}
    pending: list[str] = []
    for stmt, nxt in zip(cls.body, [*cls.body[1:], None], strict=True):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        pending.append(stmt.target.id)
        if (
            isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            for name in pending:
                docs[name] = " ".join(nxt.value.value.split())
            pending = []
        elif stmt.target.id in _LIMIT_NOTES:
            docs[stmt.target.id] = _LIMIT_NOTES[stmt.target.id]
            pending.remove(stmt.target.id)
    return docs


def _yaml_default(value: Any) -> str:
    if value is None:
        return "`null`"
    if isinstance(value, tuple):
        return "`[" + ", ".join(str(v) for v in value) + "]`"
    return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def schema_markdown() -> str:
    """docs/hosts-yaml.md, generated from the field tables above and from ``Limits``."""
    out = [
        "# hosts.yaml reference",
        "",
        "<!-- GENERATED by `python -m orchestrator.config.inventory --markdown > docs/hosts-yaml.md`;"
        " do not edit (tests/config/test_config_docs.py fails when it drifts). -->",
        "",
        "orch reads its inventory from the first of: `-c/--config PATH`, `$ORCH_CONFIG`,"
        " `./hosts.yaml`, `~/.config/orch/hosts.yaml` (`$XDG_CONFIG_HOME/orch/hosts.yaml` when"
        " set). A path given with `-c` or `$ORCH_CONFIG` must exist. With no file at all, the"
        " inventory holds just the built-in `local` target. The example at the repository root"
        " (`hosts.yaml`) is a commented walkthrough.",
        "",
        "The top level is exactly four mappings, each optional:",
        "",
        "| key | holds |",
        "|---|---|",
        "| `defaults` | values for every host and container that does not set its own"
        " (keys marked *defaults: yes* below) |",
        "| `hosts` | Proxmox hosts by name, reached over SSH |",
        "| `containers` | LXC containers (targets) by name; `local` is built in |",
        "| `jobs` | torchrun jobs over several containers (and hosts), by name |",
        "",
        "Any mistake stops orch with one line naming the file, the line and the key path, and"
        " exit code 2, e.g. `hosts.yaml:7: hosts.pve1.prot: unknown key; did you mean 'port'?`."
        " Unknown keys, wrong types, duplicate keys or names, a vmid that is not an integer"
        " >= 100, a container on an undefined host and a session name tmux cannot hold are all"
        " refused. orch warns when the file is writable by group or others (`chmod go-w`).",
        "",
    ]
    for title, specs, intro in (
        ("Hosts (`hosts.NAME`)", HOST_FIELDS, "The name `local` is reserved."),
        (
            "Containers (`containers.NAME`)",
            CONTAINER_FIELDS,
            "`local` exists even when the file does not name it (`host: local`, no vmid). Any"
            " container may use `host: local` to run on this machine.",
        ),
    ):
        out += [
            f"## {title}",
            "",
            intro,
            "",
            "| key | type | default | defaults: | meaning |",
            "|---|---|---|---|---|",
        ]
        for s in specs:
            out.append(
                f"| `{s.key}` | {_cell(s.type_doc)} | {_cell(s.default_doc)} | "
                f"{'yes' if s.in_defaults else 'no'} | {_cell(s.doc)} |"
            )
        out.append("")
    out += _job_markdown()
    docs = limit_docs()
    out += [
        "## Thresholds (`thresholds:`)",
        "",
        "Keys are the fields of `orchestrator.config.limits.Limits`; units are in the names."
        " Integers counting `_samples` must be >= 1, `_ratio` lies in 0..1, other numbers"
        " are >= 0.",
        "",
        "| key | default | meaning |",
        "|---|---|---|",
    ]
    defaults = Limits()
    for f in fields(Limits):
        out.append(
            f"| `{f.name}` | {_yaml_default(getattr(defaults, f.name))} | "
            f"{_cell(docs.get(f.name, ''))} |"
        )
    out.append("")
    out += restart_markdown()
    return "\n".join(out)
