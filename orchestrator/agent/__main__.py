"""``python3 -m orchestrator.agent <command>``: the in-container agent's command line.

Commands print JSON on stdout: one document (``facts``, ``snapshot``, ``probe``,
``record`` prints a summary at the end) or one line per interval (``stream``).
Exit codes: 0 done, 1 failed, 2 bad arguments. Problems found while observing
are data in the JSON, not exit codes.

``stream`` exits as soon as its reader goes away (stdout hang-up or a failed
write), its parent changes, or stdin closes after having carried a request: no
orphan agents. A line on stdin asks for a snapshot now.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import select
import sys
import time
from typing import Any

from orchestrator.wire import requests as rq
from orchestrator.wire.model import SCHEMA_VERSION


def _emit(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, separators=(",", ":"), default=str) + "\n")
    sys.stdout.flush()


def _observer(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from orchestrator.agent.snapshot import Observer, ObserverConfig

    try:
        patterns = json.loads(args.log_patterns) if args.log_patterns else None
        if patterns is not None and not isinstance(patterns, dict):
            raise ValueError("--log-patterns: expected a JSON object {metric: regex}")
        return _make(Observer, ObserverConfig, args, patterns)
    except ValueError as exc:
        _emit({"ok": False, "error": "bad-arguments", "message": str(exc)})
        raise SystemExit(2) from None


def _make(Observer: Any, ObserverConfig: Any, args: argparse.Namespace, patterns: Any) -> Any:
    obs = Observer(
        ObserverConfig(
            target=args.target,
            workdir=args.workdir,
            session=args.session,
            tail_lines=args.tail_lines,
            gpu_deadline_s=args.gpu_deadline,
            gpu_source=args.gpu_source,
            socket_name=args.socket_name,
            socket_path=args.socket_path,
            log_patterns=patterns,
        )
    )
    obs.resume(args.run_id, args.offset)
    return obs


def cmd_snapshot(args: argparse.Namespace) -> int:
    obs = _observer(args)
    _emit(obs.observe_dict())
    obs.close()
    return 0


class _Wait:
    """Waits between stream lines while watching stdin (requests) and stdout (hang-up).

    A line on stdin asks for a snapshot now. Transports may close stdin right at
    the start (ssh ``shutdown_write``, ``/dev/null``), so EOF on a stdin that never
    carried a request only stops watching it; EOF after a request means the
    operator left. A hang-up or error on stdout (the reader went away) is noticed
    at once through ``poll``, without waiting for the next write to fail.
    """

    def __init__(self, watch_stdin: bool) -> None:
        self._poll = select.poll()
        self._stdin = watch_stdin
        self._used = False
        self._poll.register(1, 0)  # POLLERR/POLLHUP are always reported
        if watch_stdin:
            self._poll.register(0, select.POLLIN)

    def wait(self, timeout_s: float) -> str:
        """``"tick"`` after ``timeout_s``, ``"now"`` on a request, ``"gone"`` when the operator left."""
        for fd, ev in self._poll.poll(max(timeout_s, 0.0) * 1000):
            if fd == 1:
                return "gone"
            if ev & (select.POLLIN | select.POLLHUP):
                try:
                    data = os.read(0, 65536)
                except OSError:
                    data = b""
                if data:
                    self._used = True
                    return "now"
                self._poll.unregister(0)
                if self._used:
                    return "gone"
            elif ev & (select.POLLERR | select.POLLNVAL):
                self._poll.unregister(0)
        return "tick"


def cmd_stream(args: argparse.Namespace) -> int:
    obs = _observer(args)
    try:
        return _every(args, obs.observe_dict)
    finally:
        obs.close()


def _every(args: argparse.Namespace, make: Any) -> int:
    """Print ``make()`` as one JSON line every ``--interval`` until the reader goes away (or
    ``--count`` lines); a line on stdin asks for one at once."""
    parent = os.getppid()
    out = sys.stdout.buffer
    waiter = _Wait(not args.ignore_stdin)
    sent = 0
    while True:
        start = time.monotonic()
        line = json.dumps(make(), separators=(",", ":")).encode() + b"\n"
        try:
            out.write(line)
            out.flush()
        except (BrokenPipeError, OSError, ValueError):
            return 0
        sent += 1
        if args.count and sent >= args.count:
            return 0
        while True:
            left = args.interval - (time.monotonic() - start)
            if left <= 0:
                break
            what = waiter.wait(min(left, 1.0))
            if what == "gone" or os.getppid() != parent:
                return 0
            if what == "now":
                break
        if os.getppid() != parent:
            return 0


def cmd_facts(args: argparse.Namespace) -> int:
    from orchestrator.agent.facts import gather

    _emit(
        gather(
            args.workdir,
            with_torch=args.torch,
            torch_timeout_s=args.torch_timeout,
            gpu_deadline_s=args.gpu_deadline,
            gpu_source=args.gpu_source,
            socket_name=args.socket_name,
            socket_path=args.socket_path,
        )
    )
    return 0


def cmd_record(args: argparse.Namespace) -> int:
    from orchestrator.agent.record import record

    if not os.path.isdir(args.run_dir):
        _emit({"ok": False, "error": f"no such run directory: {args.run_dir}"})
        return 1
    n = record(
        args.run_dir,
        interval_s=args.interval,
        max_bytes=args.max_bytes,
        pid=args.pid,
        linger_s=args.linger,
        max_duration_s=args.max_duration,
        gpu_deadline_s=args.gpu_deadline,
        gpu_source=args.gpu_source,
    )
    _emit({"ok": True, "samples": n, "schema_version": SCHEMA_VERSION})
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    from orchestrator.agent.probe import probe

    result = probe(
        args.vmid,
        args.since,
        host=args.host,
        timeout_s=args.timeout,
        gpu_deadline_s=args.gpu_deadline,
        gpu_source=args.gpu_source,
        proc_root=args.proc_root,
        previous_boot=args.previous_boot,
    )
    _emit({"schema_version": SCHEMA_VERSION, **result.to_dict()})
    return 0


def _host_observer(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from orchestrator.agent.host import HostObserver, parse_specs

    try:
        specs = parse_specs(args.containers)
    except ValueError as exc:
        _emit({"ok": False, "error": "bad-arguments", "message": str(exc)})
        raise SystemExit(2) from None
    return HostObserver(
        specs,
        host=args.host,
        since=args.since,
        cursor=args.cursor,
        timeout_s=args.timeout,
        gpu_deadline_s=args.gpu_deadline,
        gpu_source=args.gpu_source,
        state_path=args.state,
    )


SERVED_BY = "oneshot"
"""``host-observe``'s ``served_by``: ``resident`` in the resident observer's serving child
(:mod:`orchestrator.agent.resident`), else ``oneshot``. Readers ignore it."""


def cmd_host_observe(args: argparse.Namespace) -> int:
    from orchestrator.agent.host import document_json

    obs = _host_observer(args)
    try:
        _emit({**document_json(obs.observe()), "served_by": SERVED_BY})
    finally:
        obs.close()
    return 0


def cmd_host_stream(args: argparse.Namespace) -> int:
    from orchestrator.agent.host import KERNEL_EVERY_S, document_json

    obs = _host_observer(args)
    obs.kernel_every_s = min(KERNEL_EVERY_S, max(args.interval, 0.0) * 5)
    try:
        return _every(args, lambda: document_json(obs.observe()))
    finally:
        obs.close()


GPU_DEADLINE_ENV = "ORCH_AGENT_GPU_DEADLINE_S"
GPU_DEADLINE_S = 2.0


def gpu_deadline_default(env: dict[str, str] | None = None) -> float:
    """``--gpu-deadline``'s default: ``$ORCH_AGENT_GPU_DEADLINE_S`` when a positive number,
    else 2.0 s (a value that is not one is ignored, not fatal: the agent must still report).

    >>> gpu_deadline_default({}), gpu_deadline_default({GPU_DEADLINE_ENV: "10"})
    (2.0, 10.0)
    >>> gpu_deadline_default({GPU_DEADLINE_ENV: "soon"}), gpu_deadline_default({GPU_DEADLINE_ENV: "-1"})
    (2.0, 2.0)
    """
    raw = (os.environ if env is None else env).get(GPU_DEADLINE_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return GPU_DEADLINE_S
    return value if 0 < value < float("inf") else GPU_DEADLINE_S


def _gpu_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpu-deadline",
        type=float,
        default=gpu_deadline_default(),
        help=f"longest wait on NVML / nvidia-smi per collection (s; default {GPU_DEADLINE_S}, "
        f"env {GPU_DEADLINE_ENV})",
    )
    p.add_argument(
        "--gpu-source",
        choices=("auto", "nvml", "nvidia-smi"),
        default=None,
        help="where GPU readings come from (default auto; env ORCH_AGENT_GPU_SOURCE)",
    )


def _observe_opts(p: argparse.ArgumentParser) -> None:
    snap = functools.partial(rq.default, rq.SnapshotRequest)
    p.add_argument("--workdir", default=".", help="the container's workdir (runs/ lives here)")
    p.add_argument("--session", default=snap("session"), help="tmux session (the manifest's wins)")
    p.add_argument("--target", default=snap("target"), help="name recorded in the snapshot")
    p.add_argument(
        "--tail-lines", type=int, default=snap("tail_lines"), help="pane lines to capture"
    )
    p.add_argument("--offset", type=int, default=None, help="log byte offset to continue from")
    p.add_argument("--run-id", default=None, help="run the offset belongs to")
    p.add_argument("--log-patterns", default=None, help="JSON {metric: regex} overrides")
    p.add_argument("--socket-name", default=None, help="tmux -L socket name")
    p.add_argument("--socket-path", default=None, help="tmux -S socket path")
    _gpu_opts(p)


OWN_COMMANDS = frozenset(
    {"snapshot", "stream", "facts", "record", "probe", "host-observe", "host-stream"}
)


def build_parser(with_runs: bool = True) -> argparse.ArgumentParser:
    """The agent's parser; ``with_runs=False`` leaves out the run commands (``runs.py``, ``evidence.py``)."""
    parser = argparse.ArgumentParser(prog="orchestrator.agent", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("snapshot", help="one JSON observation")
    _observe_opts(p)
    p.set_defaults(func=cmd_snapshot)

    p = sub.add_parser("stream", help="one JSON observation per interval until stdin closes")
    _observe_opts(p)
    p.add_argument(
        "--interval",
        type=float,
        default=rq.default(rq.StreamRequest, "interval_s"),
        help="seconds between observations",
    )
    p.add_argument(
        "--count",
        type=int,
        default=rq.default(rq.StreamRequest, "count"),
        help="stop after N lines (0: never)",
    )
    p.add_argument("--ignore-stdin", action="store_true", help="do not read requests from stdin")
    p.set_defaults(func=cmd_stream)

    p = sub.add_parser("facts", help="python, tmux, NVML, GPUs, disk, sessions (torch optional)")
    p.add_argument("--workdir", default=".", help="workdir whose free disk is reported")
    p.add_argument("--torch", action="store_true", help="also time `import torch` and CUDA")
    p.add_argument(
        "--torch-timeout",
        type=float,
        default=rq.default(rq.FactsRequest, "torch_timeout_s"),
        help="limit for the torch check (s)",
    )
    p.add_argument("--socket-name", default=None, help="tmux -L socket name")
    p.add_argument("--socket-path", default=None, help="tmux -S socket path")
    _gpu_opts(p)
    p.set_defaults(func=cmd_facts)

    p = sub.add_parser("record", help="flight recorder: GPU + process samples to gpu.jsonl")
    p.add_argument("--run-dir", required=True, help="the run directory")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--max-bytes", type=int, default=8 << 20, help="rotate gpu.jsonl past this size")
    p.add_argument("--pid", type=int, default=None, help="process whose tree is sampled")
    p.add_argument("--linger", type=float, default=30.0, help="keep sampling after exit_status (s)")
    p.add_argument("--max-duration", type=float, default=None, help="stop after this long (s)")
    _gpu_opts(p)
    p.set_defaults(func=cmd_record)

    p = sub.add_parser("probe", help="HOST side: pct status, kernel log, GPU PIDs -> vmid")
    p.add_argument("--vmid", type=int, action="append", default=[], help="container to ask about")
    p.add_argument("--since", type=float, default=None, help="kernel events since (Unix s)")
    p.add_argument(
        "--host", default=rq.default(rq.ProbeRequest, "host"), help="name recorded in the probe"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=rq.default(rq.ProbeRequest, "timeout_s"),
        help="limit per host command (s)",
    )
    p.add_argument("--proc-root", default=None, help="/proc to map PIDs in (env ORCH_PROC_ROOT)")
    p.add_argument(
        "--previous-boot",
        action="store_true",
        help="also the kernel log of the boot before this one (journalctl -b -1)",
    )
    _gpu_opts(p)
    p.set_defaults(func=cmd_probe)

    host = functools.partial(rq.default, rq.HostObserveRequest)
    host_stream = functools.partial(rq.default, rq.HostStreamRequest)
    for name, func, what in (
        ("host-observe", cmd_host_observe, "HOST side: one document for every container"),
        ("host-stream", cmd_host_stream, "HOST side: one document per interval until stdin closes"),
    ):
        p = sub.add_parser(name, help=what)
        p.add_argument(
            "--containers",
            required=True,
            help="JSON list of {name, vmid, workdir, session, log_patterns, run_id, offset}",
        )
        p.add_argument("--host", default=host("host"), help="name recorded in the document")
        p.add_argument("--since", type=float, default=None, help="kernel lines since (Unix s)")
        p.add_argument("--cursor", default=None, help="kernel lines after this journal cursor")
        p.add_argument(
            "--timeout", type=float, default=host("timeout_s"), help="limit per pct/journalctl (s)"
        )
        p.add_argument("--state", default=None, help="file keeping the containers' init PIDs")
        _gpu_opts(p)
        if name == "host-stream":
            p.add_argument(
                "--interval",
                type=float,
                default=host_stream("interval_s"),
                help="seconds between documents",
            )
            p.add_argument(
                "--count",
                type=int,
                default=host_stream("count"),
                help="stop after N lines (0: never)",
            )
            p.add_argument("--ignore-stdin", action="store_true", help="ignore requests on stdin")
        p.set_defaults(func=func)

    if not with_runs:
        return parser
    from orchestrator.agent import evidence, runs

    runs.register(sub)
    evidence.register(sub)
    return parser


def main(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    """Run one command; ``parser``: a ``build_parser(with_runs=False)`` made before (the
    resident observer's, built once), for the :data:`OWN_COMMANDS` only."""
    argv = sys.argv[1:] if argv is None else argv
    own = bool(argv) and argv[0] in OWN_COMMANDS
    # The run commands' module costs ~50 ms to import; one-shot snapshots skip it.
    parser = parser if parser is not None and own else build_parser(with_runs=not own)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
