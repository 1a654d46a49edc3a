"""Warm the resident observer before it forks: the pure parts of a check, run on made-up input.

Each request of the resident (:mod:`orchestrator.agent.resident`) is served by a fork. What a
fork builds on first use dies with it: compiled regexes (the progress readers', the metric
parser's), the wire's per-type tables, the ``openat2`` binding, and Python 3.11's specialised
bytecode of every function a check runs hot. Built once in the resident, every fork starts
with them (measured on the sandbox's 8 containers: a serving fork's CPU ~80 -> ~60 ms).

Nothing here reads a container, a host file other than the bundle's own code, NVML, or
runs a command; nothing is written. A failure here is ignored (the fork then builds what it
needs itself, as before): warming is never a reason for a resident not to serve.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable

ROUNDS = 12
"""Times each piece runs: past CPython 3.11's warm-up count (8) so its bytecode specialises."""

SAMPLE_LOG = (
    "step=10 loss=2.31 tok/s=21500",
    "{'loss': 0.52, 'learning_rate': 5e-05, 'epoch': 0.25}",
    " 50%|█████     | 50/100 [00:10<00:10,  4.98it/s, loss=0.512]",
    "Epoch 2/10",
    "  50/100 [==============>...............] - ETA: 15s - loss: 0.7100",
    "iter 120: loss 1.234, time 45.6ms, mfu 30.1%",
    "acc_len=3.2 tau=0.91",
)
"""Log lines of the formats the progress readers know (only parsed, never shipped)."""

SAMPLE_STAT = "42 (python3) S 1 40 40 0 -1 4194560 1 0 0 0 150 50 0 0 20 0 7 0 1000 1 2560 x"
SAMPLE_STATUS = "Name:\tpython3\nNSpid:\t41234\t17\nNSpgid:\t41230\t12\n"
SAMPLE_CGROUP = "0::/lxc/200/ns/user.slice/session-1.scope\n"
SAMPLE_MOUNTINFO = "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"


def prewarm(bundle_dir: str, parser: object | None = None, rounds: int = ROUNDS) -> list[str]:
    """Run each warm-up piece ``rounds`` times; the names of those that failed (ignored)."""
    failed = []
    for name, piece in _pieces(bundle_dir, parser):
        try:
            for _ in range(rounds):
                piece()
        except Exception:  # noqa: BLE001 - warming is best effort
            failed.append(name)
    return failed


def _pieces(bundle_dir: str, parser: object | None) -> list[tuple[str, Callable[[], object]]]:
    from orchestrator.agent.cgroups import parse_cgroup_vmid, parse_mountinfo, parse_proc_cgroup
    from orchestrator.agent.hostprocs import parse_ns_ids
    from orchestrator.agent.logs import split_lines
    from orchestrator.agent.procs import parse_stat_fields
    from orchestrator.agent.runfacts import checked_metrics

    pieces: list[tuple[str, Callable[[], object]]] = [
        ("metrics", _metrics),
        ("document", _document),
        (
            "log lines",
            lambda: split_lines(
                "\n".join(SAMPLE_LOG).encode() + b"\n", 2000, at_start=True, at_eof=True
            ),
        ),
        ("checked metrics", _checked(checked_metrics)),
        ("proc", lambda: (parse_stat_fields(SAMPLE_STAT), parse_ns_ids(SAMPLE_STATUS))),
        (
            "cgroup",
            lambda: (
                parse_proc_cgroup(SAMPLE_CGROUP),
                parse_cgroup_vmid(SAMPLE_CGROUP),
                parse_mountinfo(SAMPLE_MOUNTINFO),
            ),
        ),
        ("root", lambda: _root(bundle_dir, "orchestrator/agent/prewarm.py")),
    ]
    if parser is not None:
        pieces.append(("argv", lambda: _argv(parser)))
    return pieces


def _metrics() -> None:
    from orchestrator.agent.metrics import MetricParser

    for line in SAMPLE_LOG:  # each format detected afresh, as a new run's log is
        MetricParser().parse([line, line], 0.0)
    MetricParser().parse(list(SAMPLE_LOG) * 20, 0.0)


def _checked(checked_metrics: Callable[..., object]) -> Callable[[], object]:
    from orchestrator.wire.model import Metrics

    return lambda: checked_metrics(Metrics(step=3, loss=2.0, tokens_per_s=1.0, seen_at=0.0))


def _document() -> None:
    """A document with every part a real one has, turned to JSON as the command prints it."""
    from orchestrator.agent.host import document_json
    from orchestrator.wire import model as m

    run = m.RunState(
        "r",
        "/w/runs/r",
        manifest=m.RunManifest("r", "cmd", "/w", "train", 0.0, gpus=(0,)),
        new_log_lines=SAMPLE_LOG,
    )
    snap = m.Snapshot(
        "ct",
        0.0,
        session=m.SessionState("train", True, server_running=True, pane_pid=7),
        run=run,
        processes=(m.ProcessInfo(pid=7, ppid=1, name="python3", state="S", host_pid=70),),
        metrics=m.Metrics(step=1, loss=2.0, seen_at=0.0),
        container_status="running",
        vmid=200,
        source="host",
    )
    doc = m.HostDocument(
        host="h",
        taken_at=0.0,
        gpus=(m.GpuSample(index=0, processes=(m.GpuProcess(pid=70, vmid=200),)),),
        nvml=m.NvmlStatus(ok=True),
        containers={"ct": snap},
        visible_gpus={"ct": (0,)},
        container_status={200: "running"},
        kernel_events=(m.KernelEvent(kind="xid", line="x", xid=79),),
        cost=m.AgentCost(cpu_ms=0.0, bytes_read=0, wall_ms=0.0),
    )
    json.dumps({**document_json(doc), "served_by": "resident"}, separators=(",", ":"))


def _root(bundle_dir: str, mine: str) -> None:
    from orchestrator.agent.rootfs import ContainerRoot

    with ContainerRoot(bundle_dir) as root:
        root.read(mine, 256)
        root.read("no-such-file", 256)
        with contextlib.suppress(OSError):
            root.stat(mine)


def _argv(parser: object) -> None:
    specs = json.dumps([{"name": "ct", "vmid": 200, "workdir": "/w"}])
    argv = ["host-observe", "--containers", specs, "--host", "h", "--state", os.devnull]
    args = parser.parse_args(argv)  # type: ignore[attr-defined]
    from orchestrator.agent.host import parse_specs

    parse_specs(args.containers)
