"""Agent commands for the run lifecycle: ``launch``, ``stop``, ``runs``, ``logs``.

Runs inside the container (standard library and ``orchestrator.wire.model`` only).
Each command prints one JSON document on stdout (``logs --follow`` prints one
JSON line per chunk) and exits 0 (done), 1 (failed), 2 (bad arguments) or
4 (refused: a live run is in the way; pass ``--force``).

Run layout: ``<workdir>/runs/<run-id>/`` holds ``manifest.json``, ``command``
(the shell text that runs), ``wrapper.sh``, ``env`` (the run's environment, 0600,
from the launch's stdin), ``train.log`` (tee -a),
``exit_status`` (written by the wrapper, also on signals), ``wrapper.pid`` and
``pgid`` (the command's process group), ``tee.err`` (tee's own complaints, e.g.
``No space left on device`` when the disk fills: space reserved at launch, so it can
be written on a full disk; blank-padded), ``tee_status`` (tee's exit status, when
the disk let it be written), ``.exit_status.reserve`` (space for ``exit_status`` on a
full disk), ``stop_requested`` (JSON ``{"at", "signal",
"by", "grace_s"}``, written by ``stop`` before its first signal, so a verdict can
tell an operator's stop from a crash). ``<workdir>/runs/current`` holds the
newest run id, written atomically.

The tmux session is built in one tmux command sequence: a placeholder window,
then the session's ``history-limit``, then the run window, then
``remain-on-exit on``. The run window starts ``env -i bash wrapper.sh RUN_DIR``:
nothing of the tmux server's environment (whoever started that server, with
whatever ``SSH_*``/``XDG_*`` they had) reaches the run, and no value is on a
command line; the wrapper exports the ``env`` file before anything else. The
wrapper waits for a ``go`` file that the agent writes only after reading both
options back, so even an instant crash leaves its pane, its exit status and its
log (seed 000).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.agent import tmux
from orchestrator.agent.answer import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    RunError,
    emit,
    guard,
)
from orchestrator.agent.logs import read_from, tail_lines
from orchestrator.agent.procs import group_members, proc_stat
from orchestrator.agent.rundir import (
    ENV,
    NAME_RE,
    STATUS_RESERVE,
    STOP_REQUEST,
    TEE_ERR,
    TMUX_PID,
    carry_checkpoints,
    current_run_id,
    git_rev,
    list_runs,
    read_int,
    reserve,
    resolve_run_dir,
    run_state,
    runs_root,
    wrapper_alive,
    wrapper_pid,
)
from orchestrator.agent.runenv import (
    MAX_ENV_DOC_BYTES,
    carried_env,
    env_records,
    parse_env_document,
    parse_env_records,
    run_env,
    run_environment,
)
from orchestrator.agent.wrapper import WRAPPER
from orchestrator.wire import requests as rq
from orchestrator.wire.answers import LaunchAnswer, LogAnswer, RunsAnswer, StopAnswer, StopRequest
from orchestrator.wire.formats import new_run_id, parse_gpu_spec
from orchestrator.wire.model import RunManifest
from orchestrator.wire.paths import atomic_write
from orchestrator.wire.secrets import mask_env

_SESSION_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


# --- stop ------------------------------------------------------------------------------------


def _signal_run(run_dir: Path, sig: int) -> list[int]:
    pgid = read_int(run_dir / "pgid")
    if not pgid:  # still waiting for go: end the wrapper itself
        rec = wrapper_pid(run_dir)
        targets = [rec[0]] if rec and wrapper_alive(run_dir) else []
    else:
        targets = group_members(pgid)
        if targets:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
    for pid in targets:  # once each: a second SIGINT would cut a checkpoint short
        st = proc_stat(pid)
        if st is not None and (not pgid or st[2] != pgid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    return targets


def stop_run(
    run_dir: Path, grace_s: float, poll_s: float = 0.1, by: str | None = None
) -> StopAnswer:
    """SIGINT, then SIGTERM at half of ``grace_s``, then SIGKILL at ``grace_s``; idempotent.

    A running run first gets ``stop_requested`` (time, first signal, ``by``: who
    asked), so its end reads as a stop, not a crash. Signals go to the command's
    process group (and descendants that left it), never to tee or the wrapper, so
    the log and the exit status are written. The session and the run directory
    stay. Waits up to 10 s more for the wrapper to write ``exit_status``.
    """
    before = run_state(run_dir)
    if before.state != "running":
        return StopAnswer(
            False,
            run_dir.name,
            before.state,
            before.exit_status,
            stop_requested=before.stop_requested,
        )
    plan = [(0.0, signal.SIGINT), (grace_s / 2, signal.SIGTERM), (grace_s, signal.SIGKILL)]
    request = StopRequest(time.time(), plan[0][1].name, by or _default_by(), grace_s)
    atomic_write(run_dir / STOP_REQUEST, json.dumps(request.to_dict()) + "\n")
    t0 = time.monotonic()
    sent: list[str] = []
    alive = True
    while plan or alive:
        now = time.monotonic() - t0
        if plan and now >= plan[0][0]:
            _at, sig = plan.pop(0)
            if _signal_run(run_dir, sig):
                sent.append(sig.name)
        pgid = read_int(run_dir / "pgid")
        alive = bool(group_members(pgid)) if pgid else wrapper_alive(run_dir)
        if not alive:
            break
        time.sleep(poll_s)
    deadline = time.monotonic() + 10.0
    while read_int(run_dir / "exit_status") is None and time.monotonic() < deadline:
        if not wrapper_alive(run_dir):
            break
        time.sleep(poll_s)
    after = run_state(run_dir)
    return StopAnswer(
        True,
        run_dir.name,
        after.state,
        after.exit_status,
        tuple(sent),
        round(time.monotonic() - t0, 3),
        request,
    )


def _default_by() -> str:
    """Who asked, when the operator did not say: the agent's user id."""
    return f"agent stop (uid {os.getuid()})"


def _archive_session(session: str, run_dir: Path | None) -> None:
    """Keep the old pane's last screen in its run directory, then remove the session."""
    if run_dir is not None and run_dir.is_dir():
        screen = tmux.capture_history(session)
        if screen is not None:
            atomic_write(run_dir / "pane.txt", "".join(f"{line}\n" for line in screen))
    tmux.kill_session(session)


# --- launch ----------------------------------------------------------------------------------


def _previous_env(root: Path, run_id: str) -> dict[str, str]:
    """The variables run ``run_id`` was given, from its 0600 ``env`` file (a relaunch keeps
    them: never through argv). ``ValueError`` when that run is not there."""
    old = root / run_id
    if not NAME_RE.match(run_id) or not old.is_dir():
        raise ValueError(f"--env-from: no run {run_id!r}")
    try:
        names = list(json.loads((old / "manifest.json").read_text()).get("env") or {})
        wanted = carried_env(dict.fromkeys(names, ""), names)
        data = (old / ENV).read_bytes() if wanted else b""
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"--env-from {run_id}: cannot read its environment: {exc}"[:300]) from None
    return carried_env(parse_env_records(data), names)


def launch(args: argparse.Namespace) -> LaunchAnswer:
    """Create the run directory, start the session, say go, watch it for ``--settle`` s."""
    workdir = Path(args.workdir)
    if not _SESSION_RE.match(args.session):
        raise RunError(EXIT_USAGE, "bad-session", f"bad session name {args.session!r}")
    run_id = args.run_id or new_run_id(None)
    if not NAME_RE.match(run_id) or run_id == "current":
        raise RunError(EXIT_USAGE, "bad-run-id", f"bad run id {run_id!r} (letters, digits, ._-)")
    try:
        gpus = tuple(parse_gpu_spec(args.gpus)) if args.gpus else ()
        given = (
            parse_env_document(sys.stdin.buffer.read(MAX_ENV_DOC_BYTES + 1))
            if args.env_stdin
            else {}
        )
        if args.env_from:
            given = {**_previous_env(runs_root(workdir), args.env_from), **given}
        env = run_env(given, gpus)
    except ValueError as exc:
        raise RunError(EXIT_USAGE, "bad-argument", str(exc)) from None
    root = runs_root(workdir)
    run_dir = root / run_id
    if run_dir.exists():
        raise RunError(
            EXIT_REFUSED,
            "run-exists",
            f"run directory {run_dir} already exists; "
            "choose another --name (orch never overwrites a run)",
            run_dir=str(run_dir),
        )

    old = tmux.TmuxReader().state(args.session, 0)
    replaced: StopAnswer | None = None
    if old.exists:
        old_id = current_run_id(workdir)
        old_dir = root / old_id if old_id else None
        live = not old.pane_dead
        if live and not args.force:
            raise RunError(
                EXIT_REFUSED,
                "session-live",
                f"tmux session {args.session!r} is live (run {old_id or 'unknown'}); "
                "stop it first (orch stop) or launch with --force",
                session=args.session,
                run_id=old_id,
            )
        if live and old_dir is not None and old_dir.is_dir():
            replaced = stop_run(old_dir, args.grace, by=f"launch --force of {run_id}")
        try:
            _archive_session(args.session, old_dir)
            stuck = tmux.session_exists(args.session)
        except tmux.TmuxTimeout as exc:
            raise RunError(EXIT_FAILED, "tmux-wedged", str(exc)) from None
        if stuck:
            raise RunError(
                EXIT_FAILED,
                "session-stuck",
                f"could not remove the old tmux session {args.session!r}",
            )

    carry_from = root / args.carry_from if args.carry_from else None
    if carry_from is not None and (not NAME_RE.match(args.carry_from) or not carry_from.is_dir()):
        raise RunError(EXIT_USAGE, "bad-run-id", f"--carry-from: no run {args.carry_from!r}")
    root.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir()
    carried, carry_error = carry_checkpoints(carry_from, run_dir) if carry_from else ([], None)
    manifest = RunManifest(
        run_id=run_id,
        command=args.cmd,
        workdir=str(workdir),
        session=args.session,
        started_at=time.time(),
        gpus=gpus,
        env=mask_env(env),
        git_rev=git_rev(workdir),
        orch_version=args.orch_version,
        target=args.target,
    )
    atomic_write(run_dir / "manifest.json", json.dumps(manifest.to_dict(), indent=2) + "\n")
    atomic_write(run_dir / "command", args.cmd + "\n")
    atomic_write(run_dir / "wrapper.sh", WRAPPER, 0o755)
    bundle = Path(__file__).resolve().parents[2]
    internal = {
        "ORCH_RUN_DIR": str(run_dir),
        "ORCH_AGENT_PATH": "" if args.no_recorder else str(bundle),
        "ORCH_AGENT_PYTHON": sys.executable or "python3",
        "ORCH_RECORD_INTERVAL_S": str(args.record_interval),
    }
    atomic_write(run_dir / ENV, env_records(run_environment(os.environ, env, internal)), 0o600)
    reserve(run_dir / TEE_ERR)
    reserve(run_dir / STATUS_RESERVE)
    atomic_write(root / "current", run_id + "\n")

    start = [
        shutil.which("env") or "/usr/bin/env",
        "-i",
        shutil.which("bash") or "bash",
        str(run_dir / "wrapper.sh"),
        str(run_dir),
    ]
    try:
        pane = tmux.start_session(args.session, str(workdir), shlex.join(start))
    except Exception as exc:  # noqa: BLE001 - libtmux's errors, a wedged server: all one answer
        with contextlib.suppress(Exception):
            tmux.kill_session(args.session)
        raise RunError(
            EXIT_FAILED,
            "tmux-failed",
            f"tmux could not start the session: {str(exc).strip() or type(exc).__name__}",
            run_dir=str(run_dir),
        ) from None
    remain, hist = pane.remain_on_exit, pane.history_limit
    if remain != "on" or hist != str(tmux.HISTORY_LIMIT):
        with contextlib.suppress(Exception):
            tmux.kill_session(args.session)
        raise RunError(
            EXIT_FAILED,
            "tmux-options",
            f"tmux options not in force (remain-on-exit={remain!r}, "
            f"history-limit={hist!r}); nothing was started",
            run_dir=str(run_dir),
        )
    pane_pid = pane.pane_pid
    st = proc_stat(pane_pid) if pane_pid is not None else None
    if st is None:
        raise RunError(
            EXIT_FAILED,
            "wrapper-gone",
            "the run's wrapper did not start; check that bash exists in the container",
            run_dir=str(run_dir),
        )
    atomic_write(run_dir / "wrapper.pid", f"{pane_pid} {st[3]}\n")
    server = proc_stat(st[1])  # the pane's parent: this run's own tmux server
    if server is not None:
        atomic_write(run_dir / TMUX_PID, f"{st[1]} {server[3]}\n")
    atomic_write(run_dir / "go", f"{time.time():.3f}\n")

    state = run_state(run_dir, tail=20, session=args.session)
    deadline = time.monotonic() + args.settle
    while time.monotonic() < deadline and state.state == "running":
        time.sleep(0.05)
        state = run_state(run_dir, tail=20, session=args.session)
    return LaunchAnswer(
        run_id=run_id,
        run_dir=str(run_dir),
        session=args.session,
        log_path=str(run_dir / "train.log"),
        manifest=manifest,
        state=state,
        history_limit=int(hist),
        replaced=replaced,
        carried=tuple(carried),
        carry_error=carry_error,
    )


# --- commands --------------------------------------------------------------------------------


def _chunk(run_dir: Path, got: dict[str, Any]) -> LogAnswer:
    """:func:`~orchestrator.agent.logs.read_from`'s chunk as the answer."""
    return LogAnswer(
        run_dir.name, tuple(got["lines"]), got["offset"], got["size"], got["truncated"]
    )


def follow(path: Path, offset: int, interval_s: float, run_dir: Path) -> Iterator[LogAnswer]:
    """Chunks of new complete lines from ``offset``; ends one read after the run exits."""
    while True:
        finished = run_state(run_dir).state != "running"
        chunk = _chunk(run_dir, read_from(path, offset))
        offset = chunk.offset
        if chunk.lines or chunk.truncated:
            yield chunk
        if finished and not chunk.lines:
            yield replace(chunk, lines=(), end=True, state=run_state(run_dir))
            return
        if not chunk.lines:
            time.sleep(interval_s)


def _cmd_launch(args: argparse.Namespace) -> int:
    emit(launch(args).to_dict())
    return EXIT_OK


def _cmd_stop(args: argparse.Namespace) -> int:
    emit(stop_run(resolve_run_dir(args.workdir, args.run_id), args.grace, by=args.by).to_dict())
    return EXIT_OK


def _cmd_runs(args: argparse.Namespace) -> int:
    if args.run_id or args.current:
        run_dir = resolve_run_dir(args.workdir, args.run_id)
        emit(run_state(run_dir, tail=args.tail, session=args.session).to_dict())
    else:
        runs = tuple(list_runs(args.workdir))
        emit(RunsAnswer(args.workdir, current_run_id(args.workdir), runs).to_dict())
    return EXIT_OK


def _cmd_logs(args: argparse.Namespace) -> int:
    run_dir = resolve_run_dir(args.workdir, args.run_id)
    log = run_dir / "train.log"
    if args.follow:
        offset = args.offset
        if offset is None:
            lines, offset = tail_lines(log, args.lines)
            emit(LogAnswer(run_dir.name, tuple(lines), offset).to_dict())
        for chunk in follow(log, offset, args.interval, run_dir):
            emit(chunk.to_dict())
    elif args.offset is not None:
        emit(_chunk(run_dir, read_from(log, args.offset, args.max_bytes)).to_dict())
    else:
        lines, size = tail_lines(log, args.lines)
        emit(LogAnswer(run_dir.name, tuple(lines), size, size, log_exists=log.exists()).to_dict())
    return EXIT_OK


def register(subparsers: Any) -> None:
    """Add ``launch``, ``stop``, ``runs`` and ``logs`` to the agent's subparsers.

    Each parser gets ``func``: a handler taking the parsed namespace and
    returning the exit code (it prints its JSON itself).
    """

    def common(p: argparse.ArgumentParser, session: bool = True) -> None:
        p.add_argument("--workdir", required=True, help="the container's workdir")
        if session:
            p.add_argument("--session", default=rq.SESSION, help="tmux session name")

    def L(name: str) -> Any:  # the launch request's default
        return rq.default(rq.LaunchRequest, name)

    def G(name: str) -> Any:  # the logs request's default
        return rq.default(rq.LogsRequest, name)

    p = subparsers.add_parser("launch", help="start a run in tmux (wrapper, tee, exit status)")
    common(p)
    p.add_argument("--cmd", required=True, help="shell command to run")
    p.add_argument("--run-id", default=None, help="run id (default: a timestamp)")
    p.add_argument(
        "--env-stdin",
        action="store_true",
        help='read the run\'s variables from stdin: {"env": {"NAME": "value"}} (never '
        "on a command line: ps shows argv)",
    )
    p.add_argument("--gpus", default=L("gpus"), help="GPU indices, e.g. 0-3,6")
    p.add_argument("--force", action="store_true", help="stop a live session of that name first")
    p.add_argument("--grace", type=float, default=L("grace_s"), help="seconds --force waits (s)")
    p.add_argument(
        "--settle", type=float, default=L("settle_s"), help="seconds to watch after go (s)"
    )
    p.add_argument(
        "--record-interval",
        type=float,
        default=L("record_interval_s"),
        help="flight recorder period (s)",
    )
    p.add_argument("--no-recorder", action="store_true", help="do not start the flight recorder")
    p.add_argument("--orch-version", default=None)
    p.add_argument("--target", default=None, help="the target's name, for the manifest")
    p.add_argument(
        "--env-from",
        default=None,
        metavar="RUN_ID",
        help="the variables that run was given (its 0600 env file) carry over; "
        "stdin's win (a relaunch)",
    )
    p.add_argument(
        "--carry-from",
        default=None,
        metavar="RUN_ID",
        help="hard-link that run's checkpoints/ into the new run (a resuming relaunch)",
    )
    p.set_defaults(func=guard(_cmd_launch))

    p = subparsers.add_parser("stop", help="SIGINT, SIGTERM, SIGKILL the run's command")
    common(p, session=False)
    p.add_argument("--run-id", default=None, help="default: the current run")
    p.add_argument(
        "--grace",
        type=float,
        default=rq.default(rq.StopRequest, "grace_s"),
        help="seconds before SIGKILL (s)",
    )
    p.add_argument("--by", default=None, help="who asks, for stop_requested (orch stop by u@h)")
    p.set_defaults(func=guard(_cmd_stop))

    p = subparsers.add_parser("runs", help="list runs (or one with --run-id/--current)")
    common(p)
    p.add_argument("--run-id", default=None)
    p.add_argument("--current", action="store_true", help="only the current run, in detail")
    p.add_argument(
        "--tail",
        type=int,
        default=rq.default(rq.RunRequest, "tail"),
        help="log lines to include (detail only)",
    )
    p.set_defaults(func=guard(_cmd_runs))

    p = subparsers.add_parser("logs", help="tail or follow a run's log by byte offset")
    common(p, session=False)
    p.add_argument("--run-id", default=None)
    p.add_argument("-n", "--lines", type=int, default=G("lines"))
    p.add_argument("--offset", type=int, default=None, help="read from this byte offset")
    p.add_argument("--max-bytes", type=int, default=G("max_bytes"))
    p.add_argument("-f", "--follow", action="store_true", help="one JSON line per new chunk")
    p.add_argument("--interval", type=float, default=G("interval_s"), help="follow poll period (s)")
    p.set_defaults(func=guard(_cmd_logs))
