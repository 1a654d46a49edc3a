"""One line of ``orch doctor``'s checklist (:class:`Check`), its four statuses and the two
renderings (text with marks, the ``--json`` document). Pure; the checks are in ``doctor.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
MARKS = {OK: "✓", WARN: "!", FAIL: "✗", SKIP: "-"}


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the checklist. ``status``: ok, warn (passes, with advice), fail, skip."""

    name: str
    status: str
    detail: str
    fix: str | None = None

    @property
    def ok(self) -> bool:
        return self.status in (OK, WARN)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "status": self.status,
            "detail": self.detail,
            "fix": self.fix,
        }


def passed(checks: list[Check]) -> bool:
    """Whether nothing failed (warnings and skips after a failure do not count).

    >>> passed([Check("a", OK, ""), Check("b", WARN, "")]), passed([Check("a", FAIL, "")])
    (True, False)
    """
    return not any(c.status == FAIL for c in checks)


def render_text(checks: list[Check]) -> str:
    """The checklist as lines: mark, name, detail; a ``fix:`` line under each failure or warning.

    >>> print(render_text([Check("tmux in ct200", FAIL, "not found", "apt-get install tmux")]))
    ✗ tmux in ct200: not found
        fix: apt-get install tmux
    """
    lines = []
    for c in checks:
        lines.append(f"{MARKS[c.status]} {c.name}: {c.detail}")
        if c.fix and c.status in (FAIL, WARN):
            lines.append(f"    fix: {c.fix}")
    return "\n".join(lines)


def to_json(checks: list[Check]) -> dict[str, Any]:
    """The ``--json`` document: ``{"ok": bool, "checks": [{name, ok, status, detail, fix}]}``."""
    return {"ok": passed(checks), "checks": [c.to_dict() for c in checks]}
