"""Agent command ``evidence``: everything a postmortem needs from one run directory, in one call.

Runs inside the container (standard library and the agent package only). Bounded
by construction: the log and the flight recorder are read from the end
(:func:`~orchestrator.agent.logs.tail_lines`), never whole, within a byte budget;
log and pane lines are cut as the snapshot's are (``logs.MAX_LINE_BYTES``), the
pane capture is at most ``--pane-lines`` lines. Prints one JSON document
(:class:`~orchestrator.wire.answers.EvidenceAnswer`)::

    {"ok": true, "now": <container clock, Unix s>, "run_id", "run_dir",
     "manifest": {...} | null, "exit_status": int | null, "exit_status_at": mtime | null,
     "state": <RunStatus with tmux info>, "tmux_server_running": bool,
     "log": {"path", "exists", "size_bytes", "mtime", "tail": [...]},
     "pane": {"lines": [...], "error": str | null},
     "gpu_history": [<gpu.jsonl records>], "gpu_history_total_lines_read": n,
     "metrics": [<metrics.jsonl records>], "heartbeat": {"text", "age_s"} | null,
     "pgid": int | null, "wrapper_pid": int | null, "files": {name: size_bytes},
     "stop_requested": {"at", "signal", "by", "grace_s"} | null,
     "tee": {"error": str | null, "status": int | null}}

``tee.error`` is what tee said on its stderr (``tee.err``; e.g. "tee: .../train.log:
No space left on device" when the disk filled and the log stopped growing), ``tee.status``
its exit status once it ended (``null`` while it runs, or when the full disk kept the
wrapper from writing ``tee_status``).

The equivalent by hand: ``cat manifest.json exit_status; tail -n 200 train.log;
tmux capture-pane -p -J -t =SESSION:run -S -200; tail -n 720 gpu.jsonl; cat tee.err``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from orchestrator.agent.answer import EXIT_OK, emit, guard
from orchestrator.agent.logs import bound_lines, tail_lines
from orchestrator.agent.rundir import (
    current_run_id,
    read_int,
    read_text,
    resolve_run_dir,
    run_state,
)
from orchestrator.agent.tmux import RUN_WINDOW, TmuxReader
from orchestrator.wire.answers import EvidenceAnswer, Heartbeat, LogTail, PaneCapture, TeeReport
from orchestrator.wire.requests import SESSION, EvidenceRequest, default
from orchestrator.wire.text import BadDocument, loads_bounded

DEFAULT_LOG_LINES: int = default(EvidenceRequest, "log_lines")
DEFAULT_PANE_LINES: int = default(EvidenceRequest, "pane_lines")
DEFAULT_GPU_SAMPLES: int = default(EvidenceRequest, "gpu_samples")
DEFAULT_METRIC_RECORDS: int = default(EvidenceRequest, "metric_records")
JSONL_MAX_LINE_BYTES = 64 * 1024
"""Longest flight-recorder record read (a longer one is cut, so unreadable, so skipped)."""
GPU_HISTORY_MAX_BYTES = 4 << 20
"""Most bytes of ``gpu.jsonl`` (+ ``.1``) read: 720 samples of 8 GPUs fit several times."""
METRICS_MAX_BYTES = 1 << 20


def _jsonl_tail(path: Path, n: int, max_bytes: int = METRICS_MAX_BYTES) -> list[dict[str, Any]]:
    """The last ``n`` JSON-object lines of ``path`` (unreadable lines skipped; read from the end)."""
    if n <= 0 or max_bytes <= 0:
        return []
    lines, _size = tail_lines(path, n, max_line_bytes=JSONL_MAX_LINE_BYTES, max_bytes=max_bytes)
    out = []
    for line in lines:
        try:
            doc = loads_bounded(line, max_bytes=JSONL_MAX_LINE_BYTES, max_depth=16)
        except BadDocument:
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


def gpu_history(run_dir: Path, n: int) -> list[dict[str, Any]]:
    """The newest ``n`` flight-recorder samples, from ``gpu.jsonl`` and (if short) ``gpu.jsonl.1``."""
    newest = _jsonl_tail(run_dir / "gpu.jsonl", n, GPU_HISTORY_MAX_BYTES)
    if len(newest) < n:
        left = GPU_HISTORY_MAX_BYTES - sum(len(json.dumps(d)) for d in newest)
        older = _jsonl_tail(run_dir / "gpu.jsonl.1", n - len(newest), left)
        newest = older + newest
    return newest


def capture_pane(session: str, lines: int) -> tuple[list[str], str | None]:
    """The run pane's screen plus up to ``lines`` of scrollback (trailing blank lines dropped)."""
    out, error = TmuxReader().capture(f"={session}:{RUN_WINDOW}", lines)
    return (bound_lines(out[-lines:]), None) if error is None else ([], error)


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:
        return None


def collect(args: argparse.Namespace) -> EvidenceAnswer:
    """The evidence document for ``args.run_id`` (default: the current run)."""
    run_dir = resolve_run_dir(args.workdir, args.run_id)
    now = time.time()
    manifest: dict[str, Any] | None = None
    manifest_error = None
    try:
        loaded = loads_bounded((run_dir / "manifest.json").read_text())
        manifest = loaded if isinstance(loaded, dict) else None
    except FileNotFoundError:
        manifest_error = "manifest.json missing"
    except (OSError, ValueError) as exc:
        manifest_error = f"manifest.json unreadable: {str(exc)[:200]}"
    session = str((manifest or {}).get("session") or args.session)
    state = run_state(run_dir, session=session)
    exit_st = _stat(run_dir / "exit_status")
    log = run_dir / "train.log"
    log_st = _stat(log)
    tail, _ = tail_lines(log, args.log_lines)
    server = TmuxReader().server_running()
    pane: list[str] = []
    pane_error: str | None = "no tmux server running" if not server else None
    if server and state.tmux is not None and state.tmux.exists:
        pane, pane_error = capture_pane(session, args.pane_lines)
    elif server:
        pane_error = f"no tmux session {session!r}"
    beat = run_dir / "heartbeat"
    beat_st = _stat(beat)
    wrapper = (read_text(run_dir / "wrapper.pid") or "").split()
    files = {
        p.name: st.st_size
        for p in sorted(run_dir.iterdir())
        if (st := _stat(p)) is not None and p.is_file()
    }
    log_tail = LogTail(
        path=str(log),
        exists=log_st is not None,
        size_bytes=log_st.st_size if log_st else None,
        mtime=log_st.st_mtime if log_st else None,
        tail=tuple(tail),
    )
    beat_text = (read_text(beat) or "")[:100]
    return EvidenceAnswer(
        now=now,
        run_id=run_dir.name,
        run_dir=str(run_dir),
        state=state,
        log=log_tail,
        pane=PaneCapture(tuple(pane), pane_error),
        current=current_run_id(args.workdir),
        manifest=manifest,
        manifest_error=manifest_error,
        exit_status=state.exit_status,
        exit_status_at=exit_st.st_mtime if exit_st else None,
        session=session,
        tmux_server_running=server,
        gpu_history=tuple(gpu_history(run_dir, args.gpu_samples)),
        metrics=tuple(_jsonl_tail(run_dir / "metrics.jsonl", args.metric_records)),
        heartbeat=Heartbeat(beat_text, round(now - beat_st.st_mtime, 3)) if beat_st else None,
        pgid=read_int(run_dir / "pgid"),
        wrapper_pid=int(wrapper[0]) if wrapper and wrapper[0].isdigit() else None,
        files=files,
        stop_requested=state.stop_requested,
        tee=TeeReport(state.tee_error, state.tee_status),
    )


def _cmd_evidence(args: argparse.Namespace) -> int:
    emit(collect(args).to_dict())
    return EXIT_OK


def register(subparsers: Any) -> None:
    """Add ``evidence`` to the agent's argparse subparsers (called by ``__main__.build_parser``)."""
    p = subparsers.add_parser("evidence", help="a run's postmortem evidence (bounded reads)")
    p.add_argument("--workdir", required=True, help="the container's workdir")
    p.add_argument("--session", default=SESSION, help="tmux session (the manifest's wins)")
    p.add_argument("--run-id", default=None, help="default: the current run")
    p.add_argument(
        "--log-lines", type=int, default=DEFAULT_LOG_LINES, help="log lines from the end"
    )
    p.add_argument("--pane-lines", type=int, default=DEFAULT_PANE_LINES, help="pane lines")
    p.add_argument("--gpu-samples", type=int, default=DEFAULT_GPU_SAMPLES, help="gpu.jsonl lines")
    p.add_argument("--metric-records", type=int, default=DEFAULT_METRIC_RECORDS)
    p.set_defaults(func=guard(_cmd_evidence))
