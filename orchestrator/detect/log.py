"""Log detector: the run's new log lines and last pane screen against the signature playbooks.

Pure: the playbooks are passed in (the engine loads the bundled set once).
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.config.limits import Limits
from orchestrator.detect.base import History, reachable
from orchestrator.playbooks.loader import LogMatcher, Playbook
from orchestrator.wire.model import Finding


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
        lines = s.run.new_log_lines if s.run is not None else ()
        seen.update(map(str.strip, lines))
        if not matcher.may_hit(lines):  # the usual snapshot: one search for all its lines
            n += len(lines)
            continue
        for line in lines:
            n += 1
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
