"""Alerts from ``orch check``: decide what to say (pure), then say it (webhook, command).

Deduplication (:func:`plan`) compares this check's findings with the alert state
kept in SQLite (:class:`~orchestrator.monitor.history.AlertState`):

- a finding not seen before, or whose earlier notification was never delivered: ``new``;
- a finding whose severity changed: ``changed``;
- a finding already announced more than ``renotify_s`` ago: ``repeat``;
- an announced finding that is gone: ``recovered``.

Findings of an unreachable target are *held*: with no data we know nothing new,
so its GPU and run findings neither repeat nor recover until it answers again.

All notifications of one check go out as ONE delivery: a webhook POST whose JSON
body has a Slack-compatible ``text`` plus the structured ``notifications``, and/or
a command hook that gets the same JSON on stdin. A failed delivery is retried
(tenacity), then reported; the check carries on and the alert state is left so
that the next check tries again. Values of secret-looking environment variables
(``*TOKEN*``, ``*KEY*``, ``*SECRET*``, ``*PASSWORD*``...) never leave in a payload.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.monitor.history import AlertState
from orchestrator.wire import secrets as _secrets
from orchestrator.wire.model import Finding, Severity

log = logging.getLogger(__name__)

Key = tuple[str, str, tuple[int, ...]]

# Findings that describe the connection itself; they still move while a target is unreachable.
CONNECTIVITY_KINDS = frozenset({"unreachable", "container-stopped"})


HEAL_EVENTS = ("restarted", "restart-failed", "interrupted", "give-up")
"""Events of ``orch supervise`` / ``orch check --heal`` (a restart's notice, a give-up's page)."""


@dataclass(frozen=True, slots=True)
class Notification:
    """One thing to tell a person. ``event``: ``new``, ``changed``, ``repeat`` or ``recovered``
    (check's findings), or one of :data:`HEAL_EVENTS` (a restart decision; ``remedy`` set)."""

    event: str
    target: str
    kind: str
    severity: Severity
    gpus: tuple[int, ...] = ()
    summary: str = ""
    since: float | None = None
    playbook: str | None = None
    evidence: tuple[str, ...] = ()
    previous_severity: Severity | None = None
    remedy: tuple[str, ...] = ()

    @property
    def key(self) -> Key:
        return (self.target, self.kind, self.gpus)

    def line(self) -> str:
        """One human line.

        >>> Notification("new", "lxc200", "ghost-utilization", Severity.CRITICAL, (3,),
        ...              "GPU 3 at 100 % with 0 MiB").line()
        'CRITICAL lxc200 ghost-utilization [GPU 3]: GPU 3 at 100 % with 0 MiB'
        >>> Notification("recovered", "lxc200", "stall", Severity.WARNING).line()
        'RECOVERED lxc200 stall (was warning)'
        >>> Notification("give-up", "lxc200", "module-not-found", Severity.CRITICAL,
        ...              summary="not retryable").line()
        'CRITICAL lxc200 give-up (module-not-found): not retryable'
        """
        gpus = f" [GPU {','.join(map(str, self.gpus))}]" if self.gpus else ""
        if self.event in HEAL_EVENTS:
            return f"{self.severity.name} {self.target} {self.event} ({self.kind}): {self.summary}"
        if self.event == "recovered":
            return f"RECOVERED {self.target} {self.kind}{gpus} (was {self.severity})"
        head = self.severity.name
        if self.event == "changed" and self.previous_severity is not None:
            head += f" (was {self.previous_severity})"
        elif self.event == "repeat":
            head += " (still)"
        return f"{head} {self.target} {self.kind}{gpus}: {self.summary}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "target": self.target,
            "kind": self.kind,
            "severity": str(self.severity),
            "gpus": list(self.gpus),
            "summary": self.summary,
            "since": self.since,
            "playbook": self.playbook,
            "evidence": list(self.evidence),
            **({"remedy": list(self.remedy)} if self.remedy else {}),
        }


def plan(
    previous: Mapping[Key, AlertState],
    findings: Iterable[Finding],
    *,
    checked: Iterable[str],
    held: Iterable[str] = (),
    now: float,
    renotify_s: float,
    min_severity: Severity = Severity.WARNING,
) -> tuple[list[Notification], dict[Key, AlertState]]:
    """What to announce, and the alert state to keep if every announcement is delivered.

    Args:
        previous: the stored alert states (any targets; only ``checked`` ones are judged).
        findings: this check's findings; those below ``min_severity`` are ignored.
        checked: the targets this check looked at (others keep their state untouched).
        held: checked targets that were unreachable: their non-connectivity states are kept.
        now: Unix seconds (the check's clock).
        renotify_s: seconds after which a still-active finding is announced again.

    >>> f = Finding("ghost-utilization", Severity.CRITICAL, "ct200", "GPU 3 ghost", gpus=(3,))
    >>> notes, state = plan({}, [f], checked=["ct200"], now=100.0, renotify_s=3600)
    >>> [n.event for n in notes], state[f.key].last_notified
    (['new'], 100.0)
    >>> plan(state, [f], checked=["ct200"], now=200.0, renotify_s=3600)[0]
    []
    >>> [n.event for n in plan(state, [], checked=["ct200"], now=300.0, renotify_s=3600)[0]]
    ['recovered']
    """
    checked_set = set(checked)
    held_set = set(held)
    current: dict[Key, Finding] = {}
    for f in findings:
        if f.severity < min_severity or f.target not in checked_set:
            continue
        old = current.get(f.key)
        if old is None or f.severity > old.severity:
            current[f.key] = f

    notes: list[Notification] = []
    states: dict[Key, AlertState] = {}
    for key, f in sorted(current.items()):
        prev = previous.get(key)
        if prev is None or prev.last_notified is None:
            event: str | None = "new"
        elif prev.severity != f.severity:
            event = "changed"
        elif now - prev.last_notified >= renotify_s:
            event = "repeat"
        else:
            event = None
        states[key] = AlertState(
            target=f.target,
            kind=f.kind,
            gpus=f.gpus,
            severity=f.severity,
            summary=f.summary,
            first_seen=prev.first_seen if prev is not None else now,
            last_notified=now if event else (prev.last_notified if prev else None),
        )
        if event:
            notes.append(
                Notification(
                    event=event,
                    target=f.target,
                    kind=f.kind,
                    severity=f.severity,
                    gpus=f.gpus,
                    summary=f.summary,
                    since=f.since,
                    playbook=f.playbook,
                    evidence=f.evidence,
                    previous_severity=prev.severity if prev is not None else None,
                )
            )
    for key, prev in sorted(previous.items()):
        if key in current or prev.target not in checked_set:
            continue
        if prev.target in held_set and prev.kind not in CONNECTIVITY_KINDS:
            states[key] = prev
            continue
        if prev.last_notified is None:
            continue  # never announced, so there is nothing to take back
        notes.append(
            Notification(
                event="recovered",
                target=prev.target,
                kind=prev.kind,
                severity=prev.severity,
                gpus=prev.gpus,
                summary=prev.summary,
            )
        )
    return notes, states


def settle(
    previous: Mapping[Key, AlertState],
    planned: Mapping[Key, AlertState],
    notes: Sequence[Notification],
    delivered: bool,
) -> dict[Key, AlertState]:
    """The alert state to store after a delivery attempt.

    When delivery failed, every announced key goes back to how it was (a new one
    is kept with ``last_notified=None``) so that the next check announces it again.
    """
    if delivered or not notes:
        return dict(planned)
    out = dict(planned)
    for n in notes:
        prev = previous.get(n.key)
        if n.event == "new":
            out[n.key] = replace(planned[n.key], last_notified=None)
        elif prev is not None:
            out[n.key] = prev
    return out


# --- secrets -----------------------------------------------------------------------------


def environment_secrets(extra: Iterable[Mapping[str, str]] = ()) -> set[str]:
    """Secret-looking values from this process's environment and ``extra`` (container env)."""
    out = set(_secrets.secret_values(dict(os.environ)))
    for env in extra:
        out.update(_secrets.secret_values(env))
    return out


# --- delivery ----------------------------------------------------------------------------


def payload(
    notes: Sequence[Notification],
    *,
    status: str,
    titles: Mapping[str, str] | None = None,
    secrets: Iterable[str] = (),
    source: str = "orch check",
) -> dict[str, Any]:
    """The JSON body: Slack-compatible ``text`` plus the structured notifications; ``source``
    heads the text (``orch supervise`` for its notices and pages, each with its remedy).

    >>> n = Notification("new", "ct200", "stall", Severity.WARNING, summary="no step for 700 s",
    ...                  playbook="stall")
    >>> payload([n], status="WARNING", titles={"stall": "Training stalled"})["text"]
    'orch check: WARNING\\nWARNING ct200 stall: no step for 700 s (playbook: Training stalled)'
    """
    titles = titles or {}
    lines = [f"{source}: {status}"]
    for n in notes:
        line = n.line()
        if n.playbook and n.event != "recovered":
            line += f" (playbook: {titles.get(n.playbook, n.playbook)})"
        lines.append(line)
        if n.event == "give-up":  # a page says what the postmortem concluded, then what to do
            lines += [f"  {e}" for e in n.evidence[:1] if e.startswith("verdict: ")]
        lines += [f"  remedy: {r}" for r in n.remedy]
    body = {
        "text": "\n".join(lines),
        "status": status,
        "notifications": [n.to_dict() for n in notes],
    }
    return _secrets.redact_tree(body, secrets)  # type: ignore[no-any-return]


class HookFailed(RuntimeError):
    """The command hook exited non-zero (message: status and its last stderr line)."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """How one sink fared: ``ok`` and, when not, the reason (no secrets in it)."""

    sink: str
    ok: bool
    detail: str = ""


@dataclass
class Notifier:
    """Where alerts go. ``webhook_url``: POST JSON; ``command``: argv fed the JSON on stdin.

    ``attempts`` tries per sink with exponential backoff starting at ``backoff_s``;
    each attempt waits at most ``timeout_s`` seconds.
    """

    webhook_url: str | None = None
    command: Sequence[str] | None = None
    attempts: int = 3
    backoff_s: float = 0.5
    timeout_s: float = 10.0
    _sleep: Any = field(default=time.sleep, repr=False)

    @property
    def configured(self) -> bool:
        return bool(self.webhook_url or self.command)

    def deliver(self, body: Mapping[str, Any]) -> list[Delivery]:
        """Send ``body`` to every configured sink; never raises for a sink's failure."""
        data = json.dumps(body).encode()
        results = []
        if self.webhook_url:
            results.append(self._try("webhook", lambda: self._post(data)))
        if self.command:
            results.append(self._try("command", lambda: self._run(data)))
        return results

    def _try(self, sink: str, fn: Any) -> Delivery:
        import tenacity  # here: a check with nothing to deliver never loads it (~10 ms)

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=tenacity.wait_exponential(multiplier=self.backoff_s, max=10),
            sleep=self._sleep,
            reraise=True,
            before_sleep=lambda rs: log.warning(
                "%s delivery failed (attempt %d): %s",
                sink,
                rs.attempt_number,
                rs.outcome.exception() if rs.outcome else None,
            ),
        )
        try:
            retrying(fn)
        except Exception as exc:  # noqa: BLE001 - a failing sink is reported, never fatal
            return Delivery(sink, False, _describe(exc))
        return Delivery(sink, True)

    def _post(self, data: bytes) -> None:
        import urllib.request  # here: http.client, ssl and email load only to post (~40 ms)

        assert self.webhook_url
        req = urllib.request.Request(
            self.webhook_url,
            data=data,
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "orch-check"},
        )
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # operator-given URL
            resp.read()

    def _run(self, data: bytes) -> None:
        assert self.command
        proc = subprocess.run(
            list(self.command), input=data, capture_output=True, timeout=self.timeout_s, check=False
        )
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
            raise HookFailed(
                f"exit status {proc.returncode}" + (f": {err[-1][:200]}" if err else "")
            )


def _describe(exc: BaseException) -> str:
    """A short reason without the URL (a Slack webhook URL is itself a secret)."""
    import urllib.error

    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return f"cannot connect: {exc.reason}"
    if isinstance(exc, subprocess.TimeoutExpired):
        return f"timed out after {exc.timeout} s"
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {exc.filename}"
    if isinstance(exc, HookFailed):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"[:300]
