"""The run directory: its layout and what its files say (the one module that reads it).

``<workdir>/runs/<run-id>/`` (docs/ARCHITECTURE.md, "Run layout in the container") holds
``manifest.json``, ``command``, ``wrapper.sh``, ``train.log`` (tee -a), ``exit_status``
(written by the wrapper, also on signals), ``wrapper.pid`` (the pane's PID and start time),
``tmux.pid`` (the run's own tmux server: the pane's parent's PID and start time), ``pgid``
(the command's process group), ``tee.err`` and ``.exit_status.reserve`` (blanks
reserved at launch, so a full disk can still take tee's complaint and the exit status),
``tee_status``, ``env`` (the run's environment, 0600: :data:`ENV`), ``stop_requested`` (JSON
``{"at", "signal", "by", "grace_s"}``, written by ``stop`` before its first signal), ``heartbeat``
and ``metrics.jsonl`` (the trainer), ``gpu.jsonl`` (the flight recorder).
``<workdir>/runs/current`` holds the newest run id (atomic).

Runs inside the container (standard library and the agent package only).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.agent.answer import EXIT_FAILED, RunError
from orchestrator.agent.logs import tail_lines
from orchestrator.agent.procs import group_members, proc_stat
from orchestrator.wire.model import SchemaError
from orchestrator.wire.text import BadDocument, finite, loads_bounded

if TYPE_CHECKING:
    from orchestrator.wire.answers import RunStatus, StopRequest

RUNS, CURRENT = "runs", "current"
"""``<workdir>/runs/`` holds the run directories; ``runs/current`` the newest run id."""
MANIFEST, LOG, EXIT_STATUS, HEARTBEAT = "manifest.json", "train.log", "exit_status", "heartbeat"
STOP_REQUEST = "stop_requested"
TMUX_PID = "tmux.pid"
"""The run's own tmux server, ``PID START`` (inside the container; start in clock ticks),
written at launch: the one server the host counts for the run, not any process named like one."""
"""File in the run directory that says an operator asked the run to stop (JSON)."""


ENV = "env"
"""The run's whole environment, 0600: ``NAME=VALUE`` records, each ending in a NUL byte (the format
of ``/proc/PID/environ``). The agent writes it from what came over its stdin; the wrapper exports
it before anything else, so no value travels on a command line (``ps`` shows argv to everyone)."""


TEE_ERR = "tee.err"
"""tee's stderr, written in place into blanks reserved at launch (a full disk takes no new file)."""


STATUS_RESERVE = ".exit_status.reserve"
"""Blanks reserved at launch; the wrapper writes ``exit_status`` into them when the disk is full."""


RESERVE_BYTES = 4096
"""Bytes reserved (spaces) for each of ``tee.err`` and the exit status: one page, one block."""


MAX_TEE_ERR_BYTES = 2000
"""Most bytes of ``tee.err`` an answer carries."""


NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def reserve(path: Path, size: int = RESERVE_BYTES) -> None:
    """Create ``path`` holding ``size`` spaces: blocks a writer can overwrite in place on a
    full disk (``<>`` in bash). Copy-on-write file systems (btrfs, ZFS) may still refuse."""
    with path.open("wb") as f:
        f.write(b" " * size)


def read_tee_error(run_dir: Path) -> str | None:
    """tee's complaint from ``tee.err`` (padding blanks dropped, lines joined by ``; ``), or
    ``None`` when tee said nothing (or the file is missing). Reads at most
    ``MAX_TEE_ERR_BYTES``."""
    try:
        with (run_dir / TEE_ERR).open("rb") as f:
            raw = f.read(MAX_TEE_ERR_BYTES)
    except OSError:
        return None
    lines = [x.strip() for x in raw.decode("utf-8", "replace").splitlines()]
    return "; ".join(x for x in lines if x) or None


def read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None


def read_int(path: Path) -> int | None:
    text = read_text(path)
    try:
        return int(text) if text else None
    except ValueError:
        return None


def parse_stop_request(text: str | None) -> StopRequest | None:
    """The ``stop_requested`` file's document, or ``None`` when absent or unreadable.

    >>> parse_stop_request('{"at": 5.0, "signal": "SIGINT", "by": "orch stop by me@pc"}').at
    5.0
    >>> parse_stop_request("garbage") is None, parse_stop_request('{"at": "x"}') is None
    (True, True)
    """
    if not text:
        return None
    from orchestrator.wire.answers import StopRequest  # the run commands' module: ~8 ms

    try:
        doc = loads_bounded(text, max_bytes=1 << 16)
    except BadDocument:
        return None
    at = finite(doc.get("at")) if isinstance(doc, dict) else None
    if at is None:
        return None
    try:
        return StopRequest.from_dict(doc)
    except SchemaError:
        return StopRequest(at=at)


def read_stop_request(run_dir: Path) -> StopRequest | None:
    """The run's ``stop_requested`` (``None``: nobody asked, or the file is unreadable)."""
    return parse_stop_request(read_text(run_dir / STOP_REQUEST))


def wrapper_pid(run_dir: Path) -> tuple[int, int] | None:
    """(PID, start time in clock ticks) from ``wrapper.pid``; written by the agent at launch."""
    parts = (read_text(run_dir / "wrapper.pid") or "").split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def wrapper_alive(run_dir: Path) -> bool:
    """The run's wrapper still exists (its start time guards against PID reuse)."""
    rec = wrapper_pid(run_dir)
    st = proc_stat(rec[0]) if rec else None
    return rec is not None and st is not None and st[0] != "Z" and st[3] == rec[1]


def runs_root(workdir: str | Path) -> Path:
    return Path(workdir) / RUNS


def parse_run_id(text: str) -> str | None:
    """The run id ``runs/current`` holds, ``None`` when empty or not a plain name (it must not
    lead out of ``runs/``).

    >>> parse_run_id("20260101-000000-lr\\n"), parse_run_id("../x"), parse_run_id("")
    ('20260101-000000-lr', None, None)
    """
    run_id = text.strip()
    if not run_id or "/" in run_id or run_id in (".", ".."):
        return None
    return run_id


def current_run_id(workdir: str | Path) -> str | None:
    return parse_run_id(read_text(runs_root(workdir) / CURRENT) or "")


def read_small(path: str, limit: int = 65536) -> tuple[bytes | None, float | None]:
    """(content, mtime) of a small file; ``(None, None)`` when it does not exist."""
    try:
        with open(path, "rb") as fh:
            mtime = os.fstat(fh.fileno()).st_mtime
            return fh.read(limit), mtime
    except OSError:
        return None, None


def parse_exit_status(text: str) -> int | None:
    """The wrapper's exit status file: an integer, maybe with a note after it.

    >>> parse_exit_status("137\\n"), parse_exit_status("exit=2 signal=none"), parse_exit_status("")
    (137, 2, None)

    A number no process exits with (the file was written by someone else) reads as 255:
    the run did end, with a failure (never a 400-digit status on the wire).

    >>> parse_exit_status("9" * 400), parse_exit_status("-4294967296")
    (255, 255)
    """
    for token in text.replace("=", " ").split():
        digits = token.lstrip("-")
        if digits.isascii() and digits.isdigit():
            return int(token) if len(digits) <= 10 and -(2**31) <= int(token) < 2**31 else 255
    return None


def run_state(run_dir: Path, *, tail: int = 0, session: str | None = None) -> RunStatus:
    """What one run directory says: running / exited N / vanished (:func:`run_phase`), and why.

    ``exited``: the wrapper wrote ``exit_status``; ``running``: no exit status
    and the wrapper or the command is alive; ``vanished``: neither (the
    container or the tmux server died, SIGKILL): the silent death of seed 000.
    ``tail`` log lines are included; ``session`` adds that tmux session's state.
    """
    # imported here: an observation (snapshot, host observer) reads run directories
    # without either, and both cost an interpreter that starts per check ~12 ms
    from orchestrator.agent.tmux import TmuxReader
    from orchestrator.wire.answers import RunStatus, run_phase

    exit_status = parse_exit_status(read_text(run_dir / EXIT_STATUS) or "")
    alive = wrapper_alive(run_dir)
    pgid = read_int(run_dir / "pgid")
    members = group_members(pgid) if pgid and exit_status is None else []
    log = run_dir / LOG
    lines, size = tail_lines(log, tail) if tail else ([], None)
    if size is None:
        try:
            size = log.stat().st_size
        except FileNotFoundError:
            size = None
    try:
        manifest = loads_bounded((run_dir / MANIFEST).read_text(), max_bytes=1 << 20)
    except (OSError, ValueError):
        manifest = None
    if not isinstance(manifest, dict):
        manifest = {}
    started_at = manifest.get("started_at")
    tmux_state, this_run = None, None
    if session:
        tmux_state = TmuxReader().state(session, 0)
        rec = wrapper_pid(run_dir)
        this_run = bool(rec and tmux_state.exists and tmux_state.pane_pid == rec[0])
    return RunStatus(
        run_id=run_dir.name,
        run_dir=str(run_dir),
        state=run_phase(exit_status, alive or bool(members)),
        exit_status=exit_status,
        wrapper_alive=alive,
        started=(run_dir / "go").exists(),
        command_alive=bool(members),
        command_pids=tuple(members),
        log_path=str(log),
        log_exists=log.exists(),
        log_size_bytes=size,
        log_tail=tuple(lines),
        stop_requested=read_stop_request(run_dir),
        tee_error=read_tee_error(run_dir),
        tee_status=read_int(run_dir / "tee_status"),
        started_at=finite(started_at),
        command=_text(manifest.get("command")),
        session=_text(manifest.get("session")),
        tmux=tmux_state,
        tmux_is_this_run=this_run,
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def list_runs(workdir: str | Path) -> list[RunStatus]:
    """Every run directory under ``<workdir>/runs``, oldest first."""
    root = runs_root(workdir)
    if not root.is_dir():
        return []
    out = [run_state(d) for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")]
    out.sort(key=lambda r: (r.started_at or 0.0, r.run_id))
    return out


def git_rev(workdir: Path) -> str | None:
    try:
        res = subprocess.run(
            ["git", "-C", str(workdir), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() or None if res.returncode == 0 else None


def resolve_run_dir(workdir: str, run_id: str | None) -> Path:
    rid = run_id or current_run_id(workdir)
    if not rid:
        raise RunError(EXIT_FAILED, "no-run", f"no runs in {runs_root(workdir)}")
    path = runs_root(workdir) / rid
    if not path.is_dir():
        raise RunError(EXIT_FAILED, "no-run", f"no run {rid!r} in {runs_root(workdir)}")
    return path


CHECKPOINTS = "checkpoints"
"""The run directory's checkpoint folder (the bundled trainer's ``--resume auto`` reads it)."""


def carry_checkpoints(src_run: Path, dst_run: Path) -> tuple[list[str], str | None]:
    """Hard-link every file of ``src_run/checkpoints/`` into ``dst_run/checkpoints/``: a relaunch
    with ``--resume auto`` continues from the previous run's newest checkpoint.

    Links, not copies: no space, no time, and the old run's files never change (the trainer
    writes a new file and renames it over a name, so a later save replaces the link, not the
    inode). Temporary files (``.name``) are skipped. Returns (names linked, the first problem
    or ``None``); a file that cannot be linked (another file system) is reported, never copied.
    """
    src = src_run / CHECKPOINTS
    if not src.is_dir():
        return [], None
    dst = dst_run / CHECKPOINTS
    linked: list[str] = []
    problem: str | None = None
    try:
        dst.mkdir(parents=True, exist_ok=True)
        names = sorted(p.name for p in src.iterdir() if p.is_file() and not p.name.startswith("."))
    except OSError as exc:
        return [], f"cannot read {src}: {exc.strerror or exc}"
    for name in names:
        try:
            os.link(src / name, dst / name)
            linked.append(name)
        except OSError as exc:
            problem = problem or f"cannot link {src / name}: {exc.strerror or exc}"
    return linked, problem
