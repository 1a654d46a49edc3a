"""Run and target detectors: death, exit, stall, reachability, container, protocol.

Silent death, unreachable and container-stopped are kept strictly apart:
an unreachable target tells nothing about the run; a stopped container explains
why its processes are gone; only a reachable, running container whose run left
no session, no process and no exit status is a *silent death*.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from orchestrator.config.limits import Limits
from orchestrator.detect.base import (
    History,
    alive,
    ended_on_request,
    fmt_num,
    fmt_time,
    gpu,
    manifest_of,
    reachable,
    run_gpus,
    session_gone,
    signal_name,
    signal_number_name,
    trailing,
)
from orchestrator.wire.model import Finding, Severity, Snapshot
from orchestrator.wire.progress import read_line
from orchestrator.wire.requests import EXIT_LINE

PROTOCOL_PREFIX = "agent protocol error"


def _is_protocol_error(text: str) -> bool:
    """``agent protocol error: ...`` or ``lxc200: agent protocol error: ...`` (AgentProtocolError's form).

    >>> _is_protocol_error("lxc200: agent protocol error: truncated JSON line")
    True
    >>> _is_protocol_error("connection refused")
    False
    """
    return text.startswith(PROTOCOL_PREFIX) or f": {PROTOCOL_PREFIX}" in text


def _protocol_only(snap: Snapshot) -> bool:
    return (
        not snap.reachable and bool(snap.errors) and all(_is_protocol_error(e) for e in snap.errors)
    )


def _stopped(snap: Snapshot) -> bool:
    """pct says the container is stopped, or has no such container (``missing``)."""
    return snap.container_status in ("stopped", "missing")


HOST_KEY_REFUSALS = ("HOST KEY REVOKED", "HOST KEY CHANGED", "host key not known")
"""The markers of orch.errors' HostKeyRevoked, HostKeyChanged and HostKeyUnknown messages."""


def unreachable(history: History, limits: Limits) -> list[Finding]:
    """The newest snapshot is the transport's marker: "unreachable since T", never a death."""
    del limits
    if not history or history[-1].reachable or _protocol_only(history[-1]):
        return []
    run = trailing(history, lambda s: not s.reachable and not _protocol_only(s))
    last = history[-1]
    seen = reachable(history)
    last_seen = f"; last data {fmt_time(seen[-1].taken_at)}" if seen else ""
    # a refused host key is no passing outage: the summary (what `orch check` prints) says it
    refused = next((e for e in last.errors if any(m in e for m in HOST_KEY_REFUSALS)), "")
    return [
        Finding(
            kind="unreachable",
            severity=Severity.WARNING,
            target=last.target,
            summary=(
                f"unreachable since {fmt_time(run[0].taken_at)} ({len(run)} failed polls"
                f"{last_seen}); the run's state is unknown, not dead"
                + (f": {refused}" if refused else "")
            ),
            since=run[0].taken_at,
            evidence=tuple(dict.fromkeys(e for s in run[-3:] for e in s.errors)),
        )
    ]


def agent_protocol_error(history: History, limits: Limits) -> list[Finding]:
    """The agent answered something we cannot read (garbage, truncated, future schema)."""
    del limits
    if not history:
        return []
    last = history[-1]
    errors = [e for e in last.errors if _is_protocol_error(e)]
    if not errors:
        return []
    run = trailing(history, lambda s: any(_is_protocol_error(e) for e in s.errors))
    return [
        Finding(
            kind="agent-protocol-error",
            severity=Severity.WARNING,
            target=last.target,
            summary=f"the agent's answer could not be read: {errors[0]}",
            since=run[0].taken_at,
            evidence=tuple(errors[:5]),
        )
    ]


def container_stopped(history: History, limits: Limits) -> list[Finding]:
    """``pct status`` says the container is stopped: every process in it is gone with it."""
    del limits
    snaps = reachable(history)
    if not snaps or not _stopped(snaps[-1]):
        return []
    run = trailing(snaps, _stopped)
    last = snaps[-1]
    what = "does not exist" if last.container_status == "missing" else "stopped"
    return [
        Finding(
            kind="container-stopped",
            severity=Severity.CRITICAL,
            target=last.target,
            summary=f"container {what} (pct status: {last.container_status}) since "
            f"{fmt_time(run[0].taken_at)}" + (f": {last.errors[0]}" if last.errors else ""),
            since=run[0].taken_at,
            evidence=(f"pct status: {last.container_status}", *last.errors[:2]),
        )
    ]


def silent_death(history: History, limits: Limits) -> list[Finding]:
    """Manifest says started, but no tmux session/server, no process and no exit status (seed 000)."""
    del limits
    snaps = reachable(history)
    if not snaps or _stopped(snaps[-1]):
        return []
    last = snaps[-1]
    if last.run is None or last.run.manifest is None or last.run.exit_status is not None:
        return []
    if not session_gone(last) or alive(last):
        return []

    def dead(s: Snapshot) -> bool:
        return s.run is not None and s.run.exit_status is None and session_gone(s) and not alive(s)

    run = trailing(snaps, dead)
    manifest = last.run.manifest
    sess = last.session
    evidence = [
        f"manifest: run {manifest.run_id} started {fmt_time(manifest.started_at)}",
        "tmux: no server running"
        if sess is None or not sess.server_running
        else f"tmux: no session {sess.name!r}",
        "processes: none",
        "exit_status: missing",
        "train.log: never created"
        if not last.run.log_exists
        else f"train.log: {last.run.log_size_bytes} bytes",
    ]
    if last.run.heartbeat_age_s is not None:
        evidence.append(f"heartbeat: {last.run.heartbeat_age_s:.0f} s old")
    return [
        Finding(
            kind="silent-death",
            severity=Severity.CRITICAL,
            target=last.target,
            summary=(
                f"run {manifest.run_id} vanished: no tmux session, no process and no exit status "
                f"(started {fmt_time(manifest.started_at)})"
                + ("; its log was never created" if not last.run.log_exists else "")
            ),
            gpus=tuple(manifest.gpus),
            since=run[0].taken_at,
            evidence=tuple(evidence),
            playbook="silent-death",
        )
    ]


TRAINER_FINISHED = "trainer: finished"
"""The bundled trainer's last line after a full run (docs/trainer.md, "Other lines")."""
WRAPPER_EXIT = EXIT_LINE
"""The run wrapper's last pane line (:data:`orchestrator.wire.requests.EXIT_LINE`): the pane shows
the output's end."""
_TRAINER_CMD_RE = re.compile(r"(?:^|\s)-m\s+trainer(?:\s|$)")


def _trainer_step(line: str) -> int | None:
    """The step of a bundled-trainer metrics line (``step=N ...`` first), read by the one
    progress parser; ``None`` for any other line.

    >>> _trainer_step("step=3 loss=4.1 acc_len=0.00 tok/s=1948"), _trainer_step("x step=3")
    (3, None)
    """
    if not line.startswith("step="):
        return None
    r = read_line(line)
    return r.step if r is not None else None


def _runs_bundled_trainer(command: str) -> bool:
    """The manifest's command runs the bundled trainer (``python -m trainer``).

    >>> _runs_bundled_trainer("env PYTHONPATH=/b python3 -m trainer --config c.yaml")
    True
    >>> _runs_bundled_trainer("python3 -m trainer_v2 --x")
    False
    """
    return _TRAINER_CMD_RE.search(command) is not None


def _same_run(snaps: list[Snapshot], last: Snapshot) -> list[Snapshot]:
    """The snapshots of ``last``'s run (a stored history may hold an older run's)."""
    rid = last.run.run_id if last.run is not None else None
    return [s for s in snaps if s.run is not None and s.run.run_id == rid]


def _last_step(snaps: list[Snapshot]) -> tuple[int | None, float | None]:
    """(step, seen_at) of the newest snapshot that carries a step (``orch check`` continues the
    log at an offset, so a snapshot that read no new line has no metrics)."""
    for s in reversed(snaps):
        if s.metrics is not None and s.metrics.step is not None:
            return s.metrics.step, s.metrics.seen_at
    return None, None


def _ends_without_final_line(lines: Sequence[str]) -> bool | None:
    """Whether the end of the trainer's output (``lines``) lacks ``trainer: finished``.

    ``None`` when it cannot tell: no metrics line in ``lines``. ``finished`` is printed
    after every metrics line, so metrics lines without it end a run that never finished.

    >>> _ends_without_final_line(["step=3 loss=4.1 acc_len=0.00 tok/s=1948 lr=9.0e-04 gpu_mem=-"])
    True
    >>> _ends_without_final_line(["step=8 loss=4.1", "trainer: finished step=8 wall_s=2"])
    False
    >>> _ends_without_final_line(["Exception ignored in: <function _after_fork>"]) is None
    True
    """
    if any(x.startswith(TRAINER_FINISHED) for x in lines):
        return False
    return True if any(_trainer_step(x) is not None for x in lines) else None


def _missing_final_line(snaps: list[Snapshot], last: Snapshot) -> tuple[str, ...] | None:
    """Evidence that the bundled trainer exited 0 without ``trainer: finished``, else ``None``.

    Only where the end of the output is known: the newest log read of the run reached
    the log's current end (``log_offset`` = the newest ``log_size_bytes``; the log of an
    exited run no longer grows), or the pane still shows the wrapper's closing line.
    An older piece of a log read in pieces (``orch check``) is never needed: the line
    would come after the last metrics line, in the same read.
    """
    run, sess = last.run, last.session
    if run is None or run.manifest is None or not _runs_bundled_trainer(run.manifest.command):
        return None
    mine = _same_run(snaps, last)
    pane = tuple(sess.pane_tail if sess is not None else ())
    verdicts: list[tuple[bool | None, tuple[str, ...]]] = []
    if any(x.startswith(WRAPPER_EXIT) for x in pane):
        verdicts.append((_ends_without_final_line(pane), pane))
    read = next((s.run for s in reversed(mine) if s.run is not None and s.run.new_log_lines), None)
    size = run.log_size_bytes
    if read is not None and size and read.log_offset == size:
        verdicts.append((_ends_without_final_line(read.new_log_lines), read.new_log_lines))
    if not verdicts or any(v is False for v, _ in verdicts) or all(v is None for v, _ in verdicts):
        return None
    lines = next(ls for v, ls in verdicts if v)
    step, _ = _last_step(mine)
    if step is None:
        steps = [n for x in lines if (n := _trainer_step(x)) is not None]
        step = steps[-1] if steps else None
    return (
        f"last step {step if step is not None else '?'}",
        f"no {TRAINER_FINISHED!r} line after the last metrics line",
        *[x for x in lines if x.strip()][-5:],
    )


def exit_status(history: History, limits: Limits) -> list[Finding]:
    """``crashed`` (exit status != 0, the signal named above 128, or a dead pane) or ``finished`` (0).

    ``finished`` is a WARNING, not INFO, when the bundled trainer (``-m trainer`` in the
    manifest) exited 0 without its final ``trainer: finished`` line while the pane shows the
    end of its output: ``os._exit``, or output lost before the flush (``silent-exit@N``).
    """
    del limits
    snaps = reachable(history)
    if not snaps:
        return []
    last = snaps[-1]
    run = last.run
    sess = last.session
    status: int | None = run.exit_status if run is not None else None
    how = ""
    if status is None and sess is not None and sess.exists and sess.pane_dead:
        if sess.pane_dead_signal:
            status = 128 + sess.pane_dead_signal
            how = f" (pane dead, signal {signal_number_name(sess.pane_dead_signal)})"
        elif sess.pane_dead_status is not None:
            status = sess.pane_dead_status
            how = " (pane dead)"
    if status is None:
        return []
    first = next((s for s in snaps if s.run is not None and s.run.exit_status == status), last)
    at = (
        run.exit_status_at if run is not None and run.exit_status_at is not None else first.taken_at
    )
    tail = tuple(sess.pane_tail[-5:]) if sess is not None else ()
    # the log's last lines as read: the newest snapshot of this run that read any
    read = next(
        (
            s.run.new_log_lines
            for s in reversed(_same_run(snaps, last))
            if s.run is not None and s.run.new_log_lines
        ),
        (),
    )
    if read:
        tail = tuple(read[-5:])
    run_id = run.run_id if run is not None else "?"
    gpus = tuple(run.manifest.gpus) if run is not None and run.manifest is not None else ()
    asked = run.stop_requested_at if run is not None else None
    by = (run.stop_requested_by if run is not None else None) or "orch stop"
    sig = signal_name(status)
    what = f"exit status {status}" + (f" = {sig}" if sig else "")

    def one(
        kind: str, severity: Severity, summary: str, evidence: tuple[str, ...]
    ) -> list[Finding]:
        return [
            Finding(
                kind=kind,
                severity=severity,
                target=last.target,
                summary=summary,
                gpus=gpus,
                since=at,
                evidence=evidence,
                exit_status=status,
                signal=sig,
            )
        ]

    if ended_on_request(asked, at):  # orch stop asked first: info, never a page
        return one(
            "finished",
            Severity.INFO,
            f"run {run_id} stopped by {by} at {fmt_time(asked)}: {what}",
            (f"stop_requested: {fmt_time(asked)}", f"exit_status: {status}", *tail),
        )
    if status == 0 and (missing := _missing_final_line(snaps, last)) is not None:
        step = missing[0].removeprefix("last step ")
        return one(
            "finished",
            Severity.WARNING,
            f"run {run_id} exited 0 at step {step} without the trainer's final line "
            f"{TRAINER_FINISHED!r} (os._exit? output lost before the flush?) at {fmt_time(at)}",
            ("exit_status: 0", *missing),
        )
    if status == 0:
        return one(
            "finished",
            Severity.INFO,
            f"run {run_id} finished (exit status 0) at {fmt_time(at)}",
            ("exit_status: 0",),
        )
    # Whether a SIGKILL was the OOM killer is the engine's call, from the host kernel log.
    return one(
        "crashed",
        Severity.CRITICAL,
        f"run {run_id} crashed: {what}{how} at {fmt_time(at)}",
        (f"exit_status: {status}" + (f" ({sig})" if sig else ""), *tail),
    )


def _progressed(prev: Snapshot | None, cur: Snapshot) -> bool:
    if cur.run is not None and cur.run.new_log_lines and prev is not None:
        return True
    if prev is None or prev.metrics is None or cur.metrics is None:
        return False
    a, b = prev.metrics.step, cur.metrics.step
    return a is not None and b is not None and b > a


def stall(
    history: History,
    limits: Limits,
    roles: dict[int, str] | None = None,
    now: float | None = None,
) -> list[Finding]:
    """The process lives but no new log line and no step progress for ``stall_timeout_s``.

    The last progress is the newest of: a snapshot that brought new log lines or a
    higher step, the log's mtime, the metrics' ``seen_at``, the launch time. The
    GPUs tell the kind: ~100 % is a stuck kernel or collective (NCCL hangs spin),
    ~0 % a deadlock or a CPU-side wait. ``now`` (Unix s) evaluates the quiet time at
    a later instant than the newest snapshot.

    Progress seen in a snapshot counts at the log's mtime when that is earlier (``orch
    check`` reads lines written long ago; the postmortem re-reads the tail).

    Before the run's first step (no step in any snapshot of the run and no heartbeat
    file) the timeout is ``max(stall_timeout_s, startup_grace_s)``: importing torch,
    loading weights and compiling print nothing for minutes. "last step N" is the
    newest snapshot with a step (``orch check`` reads the log in pieces).
    """
    snaps = reachable(history)
    if not snaps:
        return []
    last = snaps[-1]
    if last.run is None or last.run.exit_status is not None or not alive(last):
        return []
    marks: list[float] = []
    manifest = manifest_of(snaps)
    if manifest is not None:
        marks.append(manifest.started_at)
    if last.run.log_mtime is not None:
        marks.append(last.run.log_mtime)
    step, seen_at = _last_step(_same_run(snaps, last))
    if seen_at is not None:  # seen, not made: a first read of the tail sees old lines "now"
        mtime = last.run.log_mtime
        marks.append(seen_at if mtime is None else min(seen_at, mtime))
    prev: Snapshot | None = None
    for s in snaps:
        if _progressed(prev, s):  # lines read now were written no later than the log's mtime
            mtime = s.run.log_mtime if s.run is not None else None
            marks.append(s.taken_at if mtime is None else min(s.taken_at, mtime))
        prev = s
    if not marks:
        return []
    progress_at = max(marks)
    quiet_s = max(last.taken_at, now or 0.0) - progress_at
    started = step is not None or last.run.heartbeat_age_s is not None
    timeout_s = (
        limits.stall_timeout_s if started else max(limits.stall_timeout_s, limits.startup_grace_s)
    )
    if quiet_s < timeout_s:
        return []
    gpus = run_gpus(last, roles)
    recent = [s for s in snaps if s.taken_at >= progress_at] or [last]
    utils = [
        x.utilization_pct
        for s in recent[-5:]
        for i in gpus
        if (x := gpu(s, i)) is not None and x.utilization_pct is not None
    ]
    mean = sum(utils) / len(utils) if utils else None
    if mean is None:
        state = "GPU utilization unknown"
    elif mean >= limits.stall_busy_util_pct:
        state = f"GPUs at {mean:.0f} %: a stuck kernel or collective (NCCL hangs spin at 100 %)"
    elif mean <= limits.imbalance_util_pct:
        state = f"GPUs at {mean:.0f} %: a deadlock or a CPU-side wait (data loading, a lock, I/O)"
    else:
        state = f"GPUs at {mean:.0f} % on average"
    return [
        Finding(
            kind="stall",
            severity=Severity.CRITICAL,
            target=last.target,
            summary=(
                f"no new log line and no step progress for {quiet_s:.0f} s "
                f"(timeout {timeout_s:.0f} s{'' if started else ', no step yet: startup grace'}) "
                f"while the process lives; {state}"
            ),
            gpus=tuple(gpus),
            since=progress_at + timeout_s,
            evidence=(
                f"last progress {fmt_time(progress_at)}",
                f"last step {step if step is not None else '?'}",
                f"log mtime {fmt_time(last.run.log_mtime)}",
                f"mean GPU utilization {fmt_num(mean, '%')}",
            ),
        )
    ]


def _shows_output(snap: Snapshot) -> bool:
    """The pane shows a line of the command's own output (not the wrapper's ``[orch]``/``orch:``).

    The wrapper creates the log before it starts the command, and tee writes every line the
    pane shows, so output on the screen means the log should exist by now.

    >>> from orchestrator.wire.model import SessionState
    >>> _shows_output(Snapshot("ct", 1.0, session=SessionState("t", True, pane_tail=("step=1 a",))))
    True
    >>> _shows_output(Snapshot("ct", 1.0, session=SessionState("t", True, pane_tail=("", "[orch] x"))))
    False
    """
    tail = snap.session.pane_tail if snap.session is not None else ()
    return any(x.strip() and not x.startswith(("[orch]", "orch:")) for x in tail)


def log_missing(history: History, limits: Limits) -> list[Finding]:
    """The run's process lives but its log file does not exist (never created, or deleted).

    The seed incident: an ``exec`` in the start script replaced the shell that fed
    ``tee``, so the program ran and printed to the pane while ``train.log`` never
    appeared. Kind ``log-missing``, playbook ``tee-bypass``. A log that an earlier
    snapshot of the run saw is reported as deleted (no playbook: tee writes on into the
    unlinked file, out of orch's reach).

    When it fires: at once when the run has proven it runs (an earlier snapshot saw the
    log, a step was read, a heartbeat exists, or the pane shows the command's output: the
    wrapper creates the log before the command starts); otherwise only past
    ``startup_timeout_s`` after launch (a run may print nothing while it imports).
    Never on wall-clock luck alone: a check 2 s after launch sees a deleted log too.
    """
    snaps = reachable(history)
    manifest = manifest_of(snaps)
    if not snaps or manifest is None:
        return []
    last = snaps[-1]
    if last.run is None or last.run.log_exists or not alive(last):
        return []
    mine = _same_run(snaps, last)
    seen = [s for s in mine if s.run is not None and s.run.log_exists]
    proven = bool(seen) or _last_step(mine)[0] is not None or last.run.heartbeat_age_s is not None
    proven = proven or _shows_output(last)
    lived_s = last.taken_at - manifest.started_at
    if not proven and lived_s < limits.startup_timeout_s:
        return []
    missing = trailing(mine, lambda s: s.run is not None and not s.run.log_exists)
    pane = tuple(last.session.pane_tail[-3:]) if last.session is not None else ()
    where = last.run.log_path or "its log"
    if seen:
        summary = (
            f"{where} was deleted while the run lives ({lived_s:.0f} s after launch; last seen "
            f"{fmt_time(seen[-1].taken_at)}): tee writes on into the unlinked file, unread"
        )
        since, playbook = missing[0].taken_at, None
    else:
        summary = (
            f"the run's process lives {lived_s:.0f} s after launch but {where} does not exist: "
            "output bypasses tee (never created), or the file was deleted"
        )
        since = missing[0].taken_at if proven else manifest.started_at + limits.startup_timeout_s
        playbook = "tee-bypass"
    return [
        Finding(
            kind="log-missing",
            severity=Severity.WARNING,
            target=last.target,
            summary=summary,
            since=since,
            evidence=(f"log_path: {last.run.log_path}", "log_exists: false", *pane),
            playbook=playbook,
        )
    ]
