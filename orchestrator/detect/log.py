"""Log detector: the run's new log lines and last pane screen against the signature playbooks.

Pure: the playbooks are passed in (the engine loads the bundled set once).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from orchestrator.config.limits import Limits
from orchestrator.detect.base import History, reachable
from orchestrator.playbooks.loader import LogMatcher, Playbook
from orchestrator.wire.model import Finding

_METRIC_RE = re.compile(r"(?P<key>step|loss|acc_len|tau|tok/s|lr)=(?P<val>[-+0-9.eE]+|nan|inf)")


def parse_metrics(line: str) -> dict[str, float]:
    """Numbers from a bundled-trainer log line (``key=value`` pairs); empty when none.

    >>> parse_metrics("step=120 loss=2.3104 acc_len=3.21 tok/s=21500 lr=3.0e-04")
    {'step': 120.0, 'loss': 2.3104, 'acc_len': 3.21, 'tok/s': 21500.0, 'lr': 0.0003}
    >>> parse_metrics("step=9 loss=2.5 tau=2.31 tau_tf=2.45 tok/s=900 lr=1.0e-03 gpu_mem=-")
    {'step': 9.0, 'loss': 2.5, 'tau': 2.31, 'tok/s': 900.0, 'lr': 0.001}
    >>> parse_metrics("loading shards")
    {}
    """
    out: dict[str, float] = {}
    for m in _METRIC_RE.finditer(line):
        try:
            out[m.group("key")] = float(m.group("val"))
        except ValueError:
            continue
    return out


def log_signatures(
    history: History, limits: Limits, playbooks: Sequence[Playbook] = ()
) -> list[Finding]:
    """One ``log-signature`` finding per matching signature playbook, best match first.

    Lines come from every snapshot's ``run.new_log_lines`` (oldest first), then every
    snapshot's pane screen: what reaches the pane but not the log (tee's own "No space
    left on device", a shell error) may show on one screen only before it scrolls away.
    A pane line identical to a log line or to a line an earlier screen showed is not
    fed again (the pane mirrors the log), so counts are per distinct pane line.
    ``since`` is the snapshot that first showed the line.
    """
    del limits
    snaps = reachable(history)
    if not snaps or not playbooks:
        return []
    matcher = LogMatcher(playbooks)
    first_at: dict[str, float] = {}
    seen: set[str] = set()
    n = 0
    for s in snaps:
        for line in s.run.new_log_lines if s.run is not None else ():
            n += 1
            seen.add(line.strip())
            for pid in matcher.feed(line, n):
                first_at.setdefault(pid, s.taken_at)
    for s in snaps:
        for line in s.session.pane_tail if s.session is not None else ():
            key = line.strip()
            if not key or key in seen:
                continue
            seen.add(key)
            n += 1
            for pid in matcher.feed(line, n):
                first_at.setdefault(pid, s.taken_at)
    last = snaps[-1]
    out = []
    for m in matcher.matches():
        more = f" (x{m.count})" if m.count > 1 else ""
        out.append(
            Finding(
                kind="log-signature",
                severity=m.severity,
                target=last.target,
                summary=f"{m.title}{more}: {m.line.strip()[:200]}",
                since=first_at.get(m.id),
                evidence=(m.line.strip(),),
                playbook=m.id,
            )
        )
    return out
