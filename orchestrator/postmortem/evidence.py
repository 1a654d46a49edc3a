"""The evidence of one run and the history it reconstructs (pure).

:mod:`orchestrator.postmortem.collect` gathers an :class:`Evidence` (agent, host, kernel log);
:func:`reconstruct_history` turns its flight recorder back into a snapshot history and
:func:`final_snapshot` its last state, which :mod:`orchestrator.postmortem.verdict` judges.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.detect.host import OOM_WINDOW_S as OOM_WINDOW_S  # re-exported
from orchestrator.wire.model import (
    GpuSample,
    HostProbe,
    Metrics,
    NvmlStatus,
    ProcessInfo,
    RunManifest,
    RunState,
    SchemaError,
    SessionState,
    Snapshot,
)
from orchestrator.wire.text import BAD_DATA_PREFIX, bounded_int, plausible_time


@dataclass(frozen=True, slots=True)
class Evidence:
    """Everything collected about one run; texts already redacted. Times are Unix s.

    ``stop_requested_*`` come from the run's ``stop_requested`` file, written by the
    agent's ``stop`` before its first signal (``None``: nobody asked).
    """

    target: str
    collected_at: float
    run_id: str | None = None
    run_dir: str | None = None
    manifest: RunManifest | None = None
    container_status: str | None = None
    pct_status_text: str = ""
    exit_status: int | None = None
    exit_status_at: float | None = None
    run_state: str | None = None
    log_tail: tuple[str, ...] = ()
    log_exists: bool = False
    log_mtime: float | None = None
    log_size_bytes: int | None = None
    pane: tuple[str, ...] = ()
    gpu_history: tuple[dict[str, Any], ...] = ()
    metrics: tuple[dict[str, Any], ...] = ()
    kernel_log: tuple[str, ...] = ()
    kernel_log_source: str | None = None
    probe: HostProbe | None = None
    final: Snapshot | None = None
    run_pids: tuple[int, ...] = ()
    agent: dict[str, Any] = field(default_factory=dict)
    errors: tuple[str, ...] = ()
    stop_requested_at: float | None = None
    stop_requested_by: str | None = None
    stop_signal: str | None = None
    tee_error: str | None = None
    """What tee said on its stderr (the run's ``tee.err``), e.g. "tee: .../train.log: No space
    left on device": the log stopped growing there (the pane kept the output)."""
    vmid: int | None = None
    """The container's vmid: host events of other containers are not this run's."""
    previous_boot: bool = False
    """The host rebooted since the run started: the kernel log holds the boot before this one
    too (``journalctl -k -b -1``), marked in ``kernel_log`` and on each event (``boot``)."""
    kernel_log_note: str | None = None
    """What the kernel log cannot tell (a volatile journal: the boot before this one is not
    kept, agent/kernel.py ``VOLATILE_NOTE``), ``None`` when nothing is missing."""


# --- reconstruct (pure) ----------------------------------------------------------------------


def checked_records(records: Sequence[Any]) -> tuple[tuple[dict[str, Any], ...], str | None]:
    """``metrics.jsonl`` records fit to draw: a mapping whose ``time`` is a Unix time in seconds
    (2000-2100: not milliseconds, not nanoseconds) and whose ``step``, when there, is an int
    below 2**53; (the records kept, a ``bad data:`` error saying what was dropped, or ``None``).

    >>> kept, why = checked_records([{"time": 1.7e9, "step": 1}, {"time": 1.7e12, "step": 2},
    ...                              {"time": 1.7e9, "step": 10**400}])
    >>> len(kept), why
    (1, 'bad data: metrics.jsonl: 2 of 3 records dropped (time 1700000000000.0 is not a Unix time in seconds)')
    """
    kept, first, dropped = [], None, 0
    for r in records:
        why = None
        if not isinstance(r, dict):
            why = "not a mapping"
        elif plausible_time(r.get("time")) is None:
            why = f"time {r.get('time')!r:.40} is not a Unix time in seconds"
        elif r.get("step") is not None and bounded_int(r.get("step")) is None:
            why = "step out of range"
        if why is None:
            kept.append(r)
        else:
            dropped += 1
            first = first or why
    if not dropped:
        return tuple(kept), None
    return tuple(
        kept
    ), f"{BAD_DATA_PREFIX}: metrics.jsonl: {dropped} of {len(records)} records dropped ({first})"


def _metric_at(records: Sequence[dict[str, Any]], at: float) -> Metrics | None:
    """The newest ``metrics.jsonl`` record at or before ``at`` as :class:`Metrics`.

    >>> m = _metric_at([{"time": 1.0, "step": 5, "tok_s": 100}, {"time": 3.0, "step": 6}], 2.0)
    >>> (m.step, m.tokens_per_s, m.throughput, m.throughput_unit, m.seen_at)
    (5, 100.0, 100.0, 'tokens/s', 1.0)
    >>> _metric_at([{"time": 3.0, "step": 6}], 2.0) is None
    True
    """
    best = None
    for r in records:
        t = r.get("time")
        if isinstance(t, (int, float)) and t <= at and (best is None or t >= best["time"]):
            best = r

    def num(v: Any) -> float | None:
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    if best is None:
        return None
    step = best.get("step")
    tok_s = num(best.get("tok_s"))
    return Metrics(
        step=step if isinstance(step, int) else None,
        loss=num(best.get("loss")),
        tokens_per_s=tok_s,
        throughput=tok_s,
        throughput_unit="tokens/s" if tok_s is not None else None,
        acc_len=num(best.get("acc_len")),
        tau=num(best.get("tau")),
        seen_at=float(best["time"]),
    )


def _sample(
    ev: Evidence, record: dict[str, Any], session: str, manifest: RunManifest | None
) -> Snapshot | None:
    """One flight-recorder line as a snapshot (``None`` when unreadable)."""
    try:
        at = plausible_time(record["t"])
        if at is None:
            return None
        gpus = tuple(GpuSample.from_dict(g) for g in record.get("gpus") or ())
        procs = tuple(ProcessInfo.from_dict(p) for p in record.get("procs") or ())
        nvml = NvmlStatus.from_dict(record["nvml"]) if record.get("nvml") else None
    except (KeyError, TypeError, ValueError, SchemaError):
        return None
    live = any(not p.zombie and p.state != "Z" for p in procs)
    exited = ev.exit_status_at is not None and at >= ev.exit_status_at
    run = RunState(
        run_id=ev.run_id or "?",
        run_dir=ev.run_dir or "",
        manifest=manifest,
        log_exists=ev.log_exists,
        exit_status=ev.exit_status if exited else None,
        exit_status_at=ev.exit_status_at if exited else None,
        stop_requested_at=ev.stop_requested_at if exited else None,
        stop_requested_by=ev.stop_requested_by if exited else None,
    )
    # A sample with a live process had its session; after the death the session is unknown.
    sess = SessionState(name=session, exists=True, pane_dead=False) if live else None
    return Snapshot(
        target=ev.target,
        taken_at=at,
        session=sess,
        run=run,
        processes=procs,
        gpus=gpus,
        nvml=nvml,
        metrics=_metric_at(ev.metrics, at),
        container_status="running",
    )


def final_snapshot(ev: Evidence) -> Snapshot:
    """The state now: the agent's snapshot when it saw this run, else one built from the evidence.

    The run's ``new_log_lines`` are the whole log tail and the pane is the captured
    screen, so the log detectors see what the postmortem shows; alone, it is a first
    snapshot (whose lines are never progress). :func:`reconstruct_history` moves the
    tail to the recorder sample of when it was written. The metrics are the agent's
    reading of that tail with ``seen_at`` no later than the log's mtime (a re-read tail
    is not a line seen now), else the newest ``metrics.jsonl`` record.
    """
    snap = ev.final
    state = ev.agent.get("state") or {}
    tmux = state.get("tmux") or {}
    session = str(ev.agent.get("session") or (ev.manifest.session if ev.manifest else "train"))
    same = snap is not None and snap.run is not None and snap.run.run_id == ev.run_id
    if ev.container_status not in (None, "running"):
        return Snapshot(
            target=ev.target,
            taken_at=ev.collected_at,
            container_status=ev.container_status,
            errors=ev.errors,
        )
    if ev.run_id is None:
        base = snap or Snapshot(target=ev.target, taken_at=ev.collected_at)
        return dataclasses.replace(base, container_status=ev.container_status)
    run = RunState(
        run_id=ev.run_id,
        run_dir=ev.run_dir or "",
        manifest=ev.manifest,
        log_path=(ev.run_dir or "") + "/train.log",
        log_exists=ev.log_exists,
        log_size_bytes=ev.log_size_bytes,
        log_mtime=ev.log_mtime,
        log_offset=ev.log_size_bytes or 0,  # the tail was read to the log's end
        new_log_lines=ev.log_tail,
        exit_status=ev.exit_status,
        exit_status_at=ev.exit_status_at,
        heartbeat_age_s=(ev.agent.get("heartbeat") or {}).get("age_s"),
        stop_requested_at=ev.stop_requested_at,
        stop_requested_by=ev.stop_requested_by,
    )
    sess = SessionState(
        name=session,
        exists=bool(tmux.get("exists")),
        server_running=bool(ev.agent.get("tmux_server_running", True)),
        pane_dead=tmux.get("pane_dead"),
        pane_dead_status=tmux.get("pane_dead_status"),
        pane_dead_signal=tmux.get("pane_dead_signal"),
        pane_pid=tmux.get("pane_pid"),
        pane_tail=ev.pane[-50:],
    )
    procs: tuple[ProcessInfo, ...] = snap.processes if same and snap is not None else ()
    known = {p.pid for p in procs}
    extra = [
        ProcessInfo(pid=int(p), ppid=0, name="?", state="R")
        for p in state.get("command_pids") or ()
        if isinstance(p, int) and p not in known
    ]
    return Snapshot(
        target=ev.target,
        taken_at=ev.collected_at,
        session=sess,
        run=run,
        processes=(*procs, *extra),
        gpus=snap.gpus if snap is not None else (),
        nvml=snap.nvml if snap is not None else None,
        metrics=_reread(snap.metrics if same and snap is not None else None, ev.log_mtime)
        or _metric_at(ev.metrics, ev.collected_at),
        container_status=ev.container_status,
        errors=(
            *(snap.errors if snap is not None else ()),
            *(e for e in ev.errors if e.startswith(BAD_DATA_PREFIX)),
        ),
    )


def _reread(m: Metrics | None, log_mtime: float | None) -> Metrics | None:
    """Metrics parsed from a re-read tail: seen no later than the log was last written.

    >>> _reread(Metrics(step=7, seen_at=100.0), 40.0).seen_at
    40.0
    """
    if m is None or log_mtime is None or m.seen_at is None or m.seen_at <= log_mtime:
        return m
    return dataclasses.replace(m, seen_at=log_mtime)


def _place_tail(
    samples: list[Snapshot], final: Snapshot, log_mtime: float | None
) -> list[Snapshot]:
    """The history with the log tail on the first sample at or after ``log_mtime`` (when
    those lines were new), not on the final state: the postmortem's own read of the tail
    is no progress, or a hung live run would never show its stall. A log written after
    the last sample keeps its tail on the final state (it did grow since)."""
    lines = final.run.new_log_lines if final.run is not None else ()
    if not samples or not lines:
        return [*samples, final]
    at = next(
        (i for i, s in enumerate(samples) if log_mtime is None or s.taken_at >= log_mtime), None
    )
    run = samples[at].run if at is not None else None
    if at is None or run is None:
        return [*samples, final]
    assert final.run is not None
    out = list(samples)
    read = dataclasses.replace(  # the read reached the log's end, as the final state's did
        run,
        new_log_lines=lines,
        log_offset=final.run.log_offset,
        log_size_bytes=final.run.log_size_bytes,
    )
    out[at] = dataclasses.replace(samples[at], run=read)
    return [*out, dataclasses.replace(final, run=dataclasses.replace(final.run, new_log_lines=()))]


def reconstruct_history(ev: Evidence) -> list[Snapshot]:
    """Flight-recorder samples (oldest first) then the final state: the detectors' history.

    The log tail rides on the sample of when it was written (:func:`_place_tail`).
    """
    session = str(ev.agent.get("session") or (ev.manifest.session if ev.manifest else "train"))
    out = [
        s
        for r in ev.gpu_history
        if (s := _sample(ev, r, session, ev.manifest)) is not None and s.taken_at <= ev.collected_at
    ]
    out.sort(key=lambda s: s.taken_at)
    return _place_tail(out, final_snapshot(ev), ev.log_mtime)
