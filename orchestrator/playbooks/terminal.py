"""The failure a log ends on: its last exception, that chain's root cause, torchrun's table.

A log of a dead run holds many errors; the one it ends on is usually the one that killed it,
and in a chain of exceptions ("The above exception was the direct cause of the following
exception", "During handling of the above exception, another exception occurred") the first
is the cause, the later ones wrappers. torch.distributed.elastic's ChildFailedError report
names, under "Root Cause (first observed failure):", the rank that failed first with its
exit code and traceback.

:class:`Terminal` is fed only the lines the matcher's prefilter let in (its :data:`NEEDLES`
join the prefilter), holds a few lines whatever the log's length, and says which lines
carry the terminal failure, best first (:meth:`Terminal.tiers`).

Sources of the shapes: CPython 3.11 Lib/traceback.py (``_cause_message``,
``_context_message``, the final ``Type: message`` line); torch 2.13
torch/distributed/elastic/multiprocessing/errors/__init__.py (the ``Root Cause (first
observed failure):`` section); c10/util/Exception.cpp and libstdc++'s verbose terminate
handler (``terminate called after throwing an instance of 'c10::Error'`` then ``what():``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ROOT_CAUSE = "root cause (first observed failure)"
CHAINED = ("the above exception was the direct cause", "during handling of the above exception")
NEEDLES = ("error", "exception", "interrupt", "what():", ROOT_CAUSE, *CHAINED)
"""Lower-case literals a line needs to matter here (one of them); they join the prefilter."""
SECTION_LINES = 12
"""Lines after "Root Cause (first observed failure):" that belong to that section."""
_EXCEPTION = re.compile(
    r"^(?:\[[^\]]{0,40}\]:?\s*)*(?:[A-Za-z_]\w*\.)*"
    r"[A-Za-z_]\w*(?:Error|Exception|Interrupt|Failure)(?::\s.*)?$"
)
_WHAT = re.compile(r"^\s*(?:\[[^\]]{0,40}\]:?\s*)*what\(\):\s+\S")


@dataclass(slots=True)
class Terminal:
    """Feed lines (only those with a :data:`NEEDLES` literal need come); read :meth:`tiers`.

    >>> t = Terminal()
    >>> for n, s in enumerate(["Traceback (most recent call last):", "OSError: [Errno 5] Input/output error",
    ...                        "The above exception was the direct cause of the following exception:",
    ...                        "RuntimeError: checkpoint failed"], 1):
    ...     t.feed(s, s.lower(), n)
    >>> t.tiers()
    [[], ['OSError: [Errno 5] Input/output error'], ['RuntimeError: checkpoint failed']]
    """

    root: str | None = None
    last: str | None = None
    chained: bool = False
    section: list[str] = field(default_factory=list)
    section_from: int = -(10**9)

    def feed(self, text: str, low: str, lineno: int) -> None:
        """One line (``low`` is it lower-cased); 1-based ``lineno``."""
        if ROOT_CAUSE in low:
            self.section, self.section_from = [], lineno
            return
        if 0 < lineno - self.section_from <= SECTION_LINES:
            self.section.append(text)
        if any(c in low for c in CHAINED):
            self.chained = True
            return
        stripped = text.strip()
        if _EXCEPTION.match(stripped) or _WHAT.match(stripped):
            if not self.chained:
                self.root = stripped
            self.last = stripped
            self.chained = False

    def tiers(self) -> list[list[str]]:
        """The lines naming the terminal failure, best first: torchrun's root-cause section,
        the last chain's root exception, the last exception (a tier may be empty)."""
        root = [self.root] if self.root else []
        last = [self.last] if self.last and self.last != self.root else []
        return [list(self.section), root, last]
