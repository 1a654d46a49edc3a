"""Acting on the restart decision: the I/O half of ``orch supervise`` and ``orch check --heal``.

One :meth:`Healer.round` takes the monitor's newest judgement of every unit with a ``restart:``
policy and, for a unit whose run died:

1. collects the postmortem's verdict once per death (the journal keeps the cause after that);
2. takes the unit's restart lock (``<db>.restart-<unit hash>.lock``, flock: whoever restarts a
   unit holds it until the outcome is journaled; a killed holder's lock dies with it), then the
   history lock (the one ``orch check``'s alerts use), reads the journal, closes a dead
   claimer's claim (``interrupted``, or ``restarted`` when its new run is current), calls
   :func:`~orchestrator.heal.decide.decide`, and journals what is new, a ``restart`` claim
   included, before anything is done: two supervisors can never both restart a unit, and a
   supervisor killed at any point never grants an extra restart;
3. hands back the restarts to carry out (:meth:`Healer.execute`: the procedure, through
   :func:`~orchestrator.lifecycle.procedures.run_procedure`, with the dead run as
   ``expect_run``; the outcome journaled, the unit lock released).

:meth:`Healer.notify` sends every outcome (a notice) and every give-up (a page, with the verdict
and the remedy) once: delivered entries get ``notified_at`` under the history lock, a failed
delivery is tried again next round, as ``orch check``'s alerts are.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config.inventory import ContainerConfig, Inventory
from orchestrator.errors import OrchError
from orchestrator.heal.decide import (
    Decision,
    Diagnosis,
    NodeView,
    close_orphan_claim,
    decide,
    interrupted,
    should_record,
)
from orchestrator.monitor import alerts
from orchestrator.monitor.history import History, default_path
from orchestrator.monitor.journal import NOTICE_ACTIONS, JournalEntry
from orchestrator.monitor.judge import Judgement
from orchestrator.playbooks.loader import Playbook, RestartRule
from orchestrator.wire.model import Severity

log = logging.getLogger(__name__)

NOTICE_MAX_AGE_S = 24 * 3600.0
"""Outcomes older than this are never announced (a sink configured later is not flooded)."""
LOCK_TIMEOUT_S = 30.0
"""The longest wait for the history lock (a check holds it for its read-judge-alert-write)."""


def whoami(command: str) -> str:
    """``orch supervise pid 4242 on ops1``: who decided, for the journal and ``stop_requested``."""
    return f"{command} pid {os.getpid()} on {socket.gethostname()}"


class UnitLock:
    """The restart lock of one unit: an flock on ``<db>.restart-<sha1(unit)[:12]>.lock``.

    Held by whoever carries out a restart of the unit, from its claim until its outcome is
    journaled. The kernel drops it when the holder dies, so a crashed supervisor never wedges
    the unit: the next one sees the claim unfinished and counts it (``interrupted``).
    """

    def __init__(self, db_path: Path, unit: str) -> None:
        digest = hashlib.sha1(unit.encode(), usedforsecurity=False).hexdigest()[:12]
        self.path = db_path.with_name(f"{db_path.name}.restart-{digest}.lock")
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        """Take the lock without waiting; ``False`` when another holder has it."""
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None


@dataclass
class HealOptions:
    """Where the journal lives, who decides, and where notices go."""

    db_path: Path | None = None
    by: str = field(default_factory=lambda: whoami("orch supervise"))
    webhook_url: str | None = None
    notify_cmd: Sequence[str] | None = None
    extra_secrets: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Restart:
    """A claimed restart, to carry out with :meth:`Healer.execute` (the unit lock is held)."""

    decision: Decision
    config: ContainerConfig
    lock: UnitLock


DiagnoseFn = Callable[[Inventory, str], "Diagnosis | None"]


def collect_diagnosis(inventory: Inventory, name: str) -> Diagnosis | None:
    """The postmortem's verdict of ``name``'s current run (``None`` when it cannot be had)."""
    from orchestrator.postmortem.collect import collect
    from orchestrator.postmortem.verdict import judge

    c = inventory.container(name)
    try:
        v = judge(collect(inventory, name), limits=c.limits, roles=c.roles_by_gpu).verdict
    except OrchError as exc:
        log.info("%s: no verdict (%s); deciding on the findings", name, exc)
        return None
    return Diagnosis(v.kind, v.playbook, v.summary, v.remedy, v.evidence)


def restart_rules(playbooks: Sequence[Playbook]) -> dict[str, RestartRule]:
    """Playbook id -> its ``restart:`` rule (the retryable table)."""
    return {p.id: p.restart for p in playbooks if p.restart is not None}


def node_view(j: Judgement, config: ContainerConfig) -> NodeView:
    run = j.snapshot.run
    gpus = tuple(run.manifest.gpus) if run and run.manifest and run.manifest.gpus else ()
    return NodeView(
        j.name, j.state, j.snapshot, j.findings, gpus or config.gpu_indices, config.limits
    )


class Healer:
    """Decides (with :func:`~orchestrator.heal.decide.decide`) and acts for the units of an
    inventory that have a ``restart:`` policy. ``echo`` gets every journal entry written and
    every procedure step's progress (``on_entry``/``echo``: the views print them)."""

    def __init__(
        self,
        inventory: Inventory,
        opts: HealOptions,
        *,
        diagnose: DiagnoseFn = collect_diagnosis,
        on_entry: Callable[[JournalEntry], None] | None = None,
        echo: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        from orchestrator.detect.engine import default_playbooks

        self.inventory = inventory
        self.opts = opts
        self.db_path = Path(opts.db_path) if opts.db_path is not None else default_path()
        self.playbooks = tuple(default_playbooks())
        self.rules = restart_rules(self.playbooks)
        self.diagnose = diagnose
        self.on_entry = on_entry or (lambda e: log.info("%s", e.line()))
        self.echo = echo or (lambda line: log.info("%s", line))
        self.clock = clock
        self.secrets = alerts.environment_secrets([c.env for c in inventory.containers.values()])
        self.secrets |= opts.extra_secrets
        History.open(
            self.db_path, inventory=self.inventory
        ).close()  # fail early (HistoryError) on an unusable database

    def policy_units(self, names: Sequence[str]) -> list[str]:
        """The names that have a ``restart:`` policy."""
        return [n for n in names if self.inventory.container(n).restart is not None]

    # --- deciding ------------------------------------------------------------------------------

    def round(self, judgements: Sequence[Judgement]) -> list[Restart]:
        """Decide for every judged unit with a policy; journal; return the claimed restarts."""
        out = []
        for j in judgements:
            cfg = self.inventory.container(j.name)
            if cfg.restart is None:
                continue
            try:
                r = self._unit(j, cfg)
            except OrchError as exc:  # a locked or broken history: next round tries again
                log.warning("%s: no restart decision this round: %s", j.name, exc)
                continue
            except Exception:  # one unit's bug must not stop the others' care
                log.exception(
                    "%s: no restart decision this round (a bug: please report it)", j.name
                )
                continue
            if r is not None:
                out.append(r)
        return out

    def _unit(self, j: Judgement, cfg: ContainerConfig) -> Restart | None:
        node = node_view(j, cfg)
        with History.open(self.db_path, inventory=self.inventory) as history:
            journal = history.journal(j.name)
        open_claim = bool(journal) and journal[-1].action == "restart"
        dead = j.state in ("crashed", "dead", "stalled", "stopped") or any(
            f.kind == "container-stopped" for f in j.findings
        )
        if not dead and not open_claim:
            return None
        diagnosis = None
        fresh = node.run_id is not None and not any(e.run_id == node.run_id for e in journal)
        if fresh and j.state in ("crashed", "dead", "stalled"):
            diagnosis = self.diagnose(self.inventory, j.name)
        lock = UnitLock(self.db_path, j.name)
        if not lock.try_acquire():
            log.debug("%s: a restart is in progress elsewhere", j.name)
            return None
        claimed = False
        try:
            with (
                History.open(self.db_path, inventory=self.inventory) as history,
                history.locked(LOCK_TIMEOUT_S),
            ):
                journal = history.journal(j.name)
                now = self.clock()
                fix = self._close_claim(j.name, journal, node.run_id, now)
                if fix is not None:
                    journal = [*journal, *self._write(history, [fix])]
                assert cfg.restart is not None
                d = decide(
                    j.name,
                    [node],
                    diagnosis,
                    cfg.restart,
                    journal,
                    now,
                    rules=self.rules,
                    claim_alive=False,
                )
                if should_record(d, journal):
                    self._write(history, [d.entry(now, self.opts.by)])
                claimed = d.action == "restart"
        finally:
            if not claimed:
                lock.release()
        return Restart(d, cfg, lock) if claimed else None

    def _close_claim(
        self, unit: str, journal: Sequence[JournalEntry], current: str | None, now: float
    ) -> JournalEntry | None:
        """The outcome of a claim left open by a claimer that died (we hold the unit lock)."""
        if not journal or journal[-1].action != "restart":
            return None
        observed = close_orphan_claim(
            unit, journal, current, claim_alive=False, now=now, by=self.opts.by
        )
        return observed or interrupted(unit, journal[-1], now, self.opts.by)

    def _write(self, history: History, entries: Sequence[JournalEntry]) -> list[JournalEntry]:
        written = history.append_journal([redacted(e, self.secrets) for e in entries])
        for e in written:
            self.on_entry(e)
        return written

    # --- acting --------------------------------------------------------------------------------

    def execute(self, r: Restart) -> JournalEntry:
        """Carry out a claimed restart (its procedure), journal the outcome, release the lock."""
        from orchestrator.lifecycle.procedures import (
            plan_procedure,
            procedure_context,
            run_procedure,
        )
        from orchestrator.playbooks.loader import get_playbook

        d, name = r.decision, r.config.name
        launched: list[str] = []
        assert d.procedure is not None and r.config.restart is not None
        try:
            steps = plan_procedure(
                get_playbook(self.playbooks, d.procedure), procedure_context(r.config)
            )
            run_procedure(
                steps,
                self.inventory,
                name,
                echo=lambda line: self.echo(f"{name}: {line}"),
                by=f"orch restart by {self.opts.by}",
                expect_run=d.run_id,
                settle_timeout_s=r.config.restart.settle_timeout_s,
                stop_grace_s=r.config.restart.stop_grace_s,
                launched=launched,
            )
            new = launched[-1] if launched else None
            action, reason = "restarted", f"{d.procedure}: run {new} started ({d.reason})"
        except OrchError as exc:
            new = launched[-1] if launched else None
            first = (
                str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            )
            action, reason = "restart-failed", f"{d.procedure} failed: {first}"
        except Exception as exc:  # journal it; the lock must be released
            log.exception("%s: restart failed unexpectedly", name)
            new = launched[-1] if launched else None
            action, reason = (
                "restart-failed",
                f"{d.procedure} failed: {type(exc).__name__}: {exc}"[:300],
            )
        entry = JournalEntry(
            unit=name,
            at=self.clock(),
            action=action,
            reason=reason,
            run_id=d.run_id,
            note=action,
            trigger=d.trigger,
            cause=d.cause,
            procedure=d.procedure,
            attempt=d.attempt,
            new_run_id=new,
            evidence=d.evidence,
            remedy=d.remedy,
            by=self.opts.by,
        )
        try:
            with (
                History.open(self.db_path, inventory=self.inventory) as history,
                history.locked(LOCK_TIMEOUT_S * 4),
            ):
                entry = self._write(history, [entry])[0]
        finally:
            r.lock.release()
        return entry

    # --- telling -------------------------------------------------------------------------------

    def notify(self) -> list[str]:
        """Deliver each pending notice and page once; problems (undelivered) as lines."""
        notifier = alerts.Notifier(webhook_url=self.opts.webhook_url, command=self.opts.notify_cmd)
        if not notifier.configured:
            return []
        problems: list[str] = []
        with (
            History.open(self.db_path, inventory=self.inventory) as history,
            history.locked(LOCK_TIMEOUT_S),
        ):
            now = self.clock()
            pending = [
                e
                for e in history.journal()
                if e.action in NOTICE_ACTIONS
                and e.notified_at is None
                and now - e.at <= NOTICE_MAX_AGE_S
            ]
            if not pending:
                return []
            notes = [notification(e) for e in pending]
            worst = max(n.severity for n in notes)
            secrets = alerts.environment_secrets(
                [c.env for c in self.inventory.containers.values()]
            )
            body = alerts.payload(
                notes,
                status=worst.name,
                secrets=secrets | self.opts.extra_secrets,
                source="orch supervise",
            )
            results = notifier.deliver(body)
            for d in results:
                if not d.ok:
                    problems.append(f"{d.sink} notice not delivered: {d.detail}")
            if all(d.ok for d in results):
                history.journal_notified([e.id for e in pending if e.id is not None], now)
        return problems


def redacted(e: JournalEntry, secrets: set[str]) -> JournalEntry:
    """``e`` with every secret-looking value masked (evidence quotes log lines, which may echo
    a token): what the journal stores and every view shows.

    >>> redacted(JournalEntry("ct", 0.0, "give-up", "r", evidence=("token hf_x1",)), {"hf_x1"}).evidence
    ('token ***',)
    """
    if not secrets:
        return e
    from orchestrator.wire.secrets import redact_tree

    return JournalEntry.from_dict(redact_tree(e.to_dict(), secrets))


def notification(e: JournalEntry) -> alerts.Notification:
    """A journal entry as a notice (a restart's outcome, WARNING) or a page (a give-up,
    CRITICAL, with the verdict in its evidence and the remedy)."""
    page = e.action == "give-up"
    run = e.run_id or "-"
    if e.action == "restarted":
        summary = f"run {run} restarted as {e.new_run_id} (attempt {e.attempt}): {e.reason}"
    elif e.action == "give-up":
        summary = f"run {run} not restarted: {e.reason}"
    else:
        summary = f"run {run}: {e.reason}"
    extra: dict[str, Any] = {"remedy": tuple(e.remedy)} if page else {}
    return alerts.Notification(
        event=e.action,
        target=e.unit,
        kind=e.cause or e.trigger or "unknown",
        severity=Severity.CRITICAL if page else Severity.WARNING,
        summary=summary,
        since=e.at,
        playbook=e.cause,
        evidence=tuple(e.evidence),
        **extra,
    )
