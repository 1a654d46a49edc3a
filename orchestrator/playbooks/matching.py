"""Matching logs against signature playbooks: linear in the log, one line in memory.

A :class:`Signature` is one ``match.log`` entry of a playbook: a regex searched on one
line, or a *stack*, regexes that must match on successive lines (in order, each on a
later line) within a window of ``within`` lines, the way a traceback's frames show a
failure whose message line is missing. :class:`LogMatcher` feeds lines one at a time:

* every regex carries the literal text a line must contain for it to match
  (:func:`literal_needles`); one compiled prefilter over those literals (a trie, so its
  cost does not grow with the number of playbooks) rejects a line that holds none of them
  with a single regex search, which is what almost every line of a healthy log costs;
* a stack keeps, per step, the newest line its partial match could have started on, so
  memory is a few integers per stack whatever the log's length, and a partial match
  older than the window is ignored when the next step arrives.

Each :class:`Match` says how sure it is (``certain`` when the signature names the
failure, ``probable`` when it is the usual cause of a generic symptom) and what to check
next to confirm it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from orchestrator.playbooks.prefilter import Prefilter, anchor, index_cost, prefilter
from orchestrator.playbooks.prefilter import trie_regex as trie_regex  # re-exported (loader, tests)
from orchestrator.playbooks.terminal import NEEDLES as TERMINAL_NEEDLES
from orchestrator.playbooks.terminal import Terminal
from orchestrator.wire.model import Severity

CERTAIN = "certain"
PROBABLE = "probable"
CONFIDENCES = (CERTAIN, PROBABLE)
"""Best first: a ``certain`` signature names the failure; a ``probable`` one names the usual
cause of a generic symptom (a bare "Killed" is usually, not always, the OOM killer)."""
MAX_LINE_CHARS = 65536
"""Longer log lines are matched on their first this-many characters."""
READ_CHUNK_BYTES = 1 << 20
""":func:`iter_log_lines` reads this much at a time (the only buffer besides one line)."""

CONSEQUENCE_PLAYBOOKS = frozenset(
    {"gloo-timeout", "peer-connection-lost", "rendezvous-lost", "torchrun-sigterm", "nccl-timeout"}
)
"""Playbooks naming what a rank reports when *another* rank went away (playbooks/*.yaml):
ranked below every cause, and when one is all there is, it says to read the other's log."""
ABOVE_TERMINAL = 80
"""Playbooks of this priority or more (a lost GPU, a driver mismatch, the OOM killer) explain
whatever exception the log then ends on, so they rank above the terminal error."""
CONSEQUENCE_NOTE = "A consequence: another rank (or process) failed first; read its log. "
Needles = tuple[frozenset[str], ...]


class Matchable(Protocol):
    """What the matcher reads of a playbook (``orchestrator.playbooks.loader.Playbook`` is one): the
    matcher sits below the loader, so it names the fields instead of importing the class."""

    @property
    def id(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def severity(self) -> Severity: ...
    @property
    def priority(self) -> int: ...
    @property
    def confirm(self) -> str: ...
    @property
    def signatures(self) -> tuple[Signature, ...]: ...
    @property
    def remedy(self) -> tuple[str, ...]: ...


@dataclass(frozen=True, slots=True)
class Signature:
    """One ``match.log`` entry: ``patterns`` are one regex (a line) or 2+ (a stack, in order).

    ``within`` is the most lines a stack may span, first frame to last (1 for a line).
    ``needles`` hold, per pattern, the lower-cased literals a line needs (:func:`literal_needles`).

    The regexes are compiled on first use (:func:`compile_once`, once per process and pattern),
    not held: a signature is then plain data that the playbook cache
    (:mod:`orchestrator.playbooks.cache`) reads back without recompiling ~700 regexes, of
    which a check of a healthy fleet runs none (the prefilter rejects its lines first).
    """

    patterns: tuple[str, ...]
    confidence: str = CERTAIN
    confirm: str = ""
    within: int = 1
    needles: tuple[Needles, ...] = field(default=(), repr=False, compare=False)
    bounded: tuple[frozenset[str], ...] = field(default=(), repr=False, compare=False)

    @property
    def is_stack(self) -> bool:
        return len(self.patterns) > 1

    @classmethod
    def build(
        cls, patterns: Sequence[str], confidence: str = CERTAIN, confirm: str = "", within: int = 1
    ) -> Signature:
        """Compile ``patterns`` (``re.error`` on a bad one) and work out their needles.

        >>> s = Signature.build([r"Killed process \\d+"])
        >>> (s.is_stack, s.needles)
        (False, ((frozenset({'killed process '}),),))
        """
        for p in patterns:
            compile_once(p)  # validates, and the process that parses uses it compiled
        parsed = [_needles(p) for p in patterns]
        return cls(
            patterns=tuple(patterns),
            confidence=confidence,
            confirm=confirm,
            within=within,
            needles=tuple(tuple(n) for n, _ in parsed),
            bounded=tuple(b for _, b in parsed),
        )


@functools.cache
def compile_once(pattern: str) -> re.Pattern[str]:
    """``re.compile(pattern)``, once per process (``re``'s own cache holds 512 patterns, fewer
    than the playbooks have); ``re.error`` on a bad pattern."""
    return re.compile(pattern)


@dataclass(frozen=True, slots=True)
class Match:
    """A signature playbook that matched a log: its evidence line (1-based ``lineno``).

    The evidence is the first line of the best ``confidence`` seen; ``count`` is every
    matching line (a stack counts once, on the line that completed it). ``confirm`` is
    the next check that would confirm the diagnosis.
    """

    id: str
    title: str
    severity: Severity
    priority: int
    line: str
    lineno: int
    count: int
    remedy: tuple[str, ...] = ()
    confidence: str = CERTAIN
    confirm: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "severity": str(self.severity),
            "confidence": self.confidence,
            "confirm": self.confirm,
            "line": self.line,
            "lineno": self.lineno,
            "count": self.count,
            "remedy": list(self.remedy),
        }


def literal_needles(pattern: str) -> list[frozenset[str]]:
    r"""Lower-cased literals a line must contain for ``pattern`` to match (a cheap pre-check).

    Each entry is a set of alternatives (any one must be present); all entries are
    required. An empty list means no pre-check is possible: always run the regex.

    >>> literal_needles(r"No space left on device")
    [frozenset({'no space left on device'})]
    >>> sorted(map(sorted, literal_needles(r"(?i)\bloss is (nan|inf)")))
    [['inf', 'nan'], ['loss is ']]
    >>> literal_needles(r"a|b"), literal_needles(r"(?:nan|inf)\\b|x")
    ([], [])
    >>> [sorted(n) for n in literal_needles(r"exits? (?:with|via) signal")]
    [['exit'], ['via', 'with'], [' signal']]
    """
    return _needles(pattern)[0]


def _needles(pattern: str) -> tuple[list[frozenset[str]], frozenset[str]]:
    r""":func:`literal_needles`, and those of its literals the pattern always follows with
    ``\b``: the prefilter may ask for the boundary too ("inf" must not let "info" in).

    >>> _needles(r"(?i)loss[=:] ?(?:nan|inf)\b")[1] == {"nan", "inf"}
    True
    """
    try:
        from re import _parser as sre  # type: ignore[attr-defined]
    except ImportError:  # Python 3.10
        import sre_parse as sre  # type: ignore[no-redef]
    from re import _constants as c  # type: ignore[attr-defined]

    def literal_seq(items: Any) -> str | None:
        chars = []
        for op, av in items:
            if op is not c.LITERAL:
                return None
            chars.append(chr(av))
        return "".join(chars)

    out: list[frozenset[str]] = []
    bounded: set[str] = set()
    run: list[str] = []
    items = list(sre.parse(pattern))

    def at_boundary(i: int) -> bool:
        return i < len(items) and items[i] == (c.AT, c.AT_BOUNDARY)

    def flush(next_i: int) -> None:
        if len(run) >= 3:
            word = "".join(run).lower()
            out.append(frozenset({word}))
            if at_boundary(next_i):
                bounded.add(word)
        run.clear()

    def alternation(branch: Any, next_i: int) -> None:
        alts = [literal_seq(b) for b in branch[1]]
        if all(a and len(a) >= 3 for a in alts):
            words = frozenset(a.lower() for a in alts if a)
            out.append(words)
            if at_boundary(next_i):
                bounded.update(words)

    for i, (op, av) in enumerate(items):
        if op is c.LITERAL:
            run.append(chr(av))
            continue
        flush(i)
        if op is c.BRANCH:  # (?:a|b) is inlined by the parser; a whole-pattern a|b too
            alternation(av, i + 1)
        elif op is c.SUBPATTERN:
            body = list(av[-1])
            if len(body) == 1 and body[0][0] is c.BRANCH:
                alternation(body[0][1], i + 1)
            else:
                lit = literal_seq(body)
                if lit and len(lit) >= 3:
                    out.append(frozenset({lit.lower()}))
                    if at_boundary(i + 1):
                        bounded.add(lit.lower())
    flush(len(items))
    return out, frozenset(bounded)


@dataclass(frozen=True, slots=True)
class _Check:
    """One regex to try on a line: a line signature, or one step of a stack."""

    pb: int
    sig: int
    step: int
    pattern: str
    needles: Needles
    bounded: frozenset[str]


@dataclass(slots=True)
class _Seen:
    """What matched for one playbook so far: first (lineno, line, confirm) per confidence."""

    first: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    count: int = 0
    last_line: int = 0


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a matcher derives from a playbook set before its first line (the same for every
    log: built once per set and process, :func:`_plan_of`)."""

    pbs: tuple[Matchable, ...]
    sigs: tuple[Signature, ...]
    checks: tuple[_Check, ...]
    index: dict[str, list[int]]
    keys: tuple[str, ...]
    always: tuple[int, ...]
    pre: Prefilter | None


def _build_plan(playbooks: Sequence[Matchable]) -> _Plan:
    pbs = tuple(p for p in playbooks if p.kind == "signature" and p.signatures)
    checks: list[_Check] = []
    si = 0
    for pi, pb in enumerate(pbs):
        for sig in pb.signatures:
            # a stack's later steps first, so one line never advances a stack twice
            for step in reversed(range(len(sig.patterns))):
                checks.append(
                    _Check(pi, si, step, sig.patterns[step], sig.needles[step], sig.bounded[step])
                )
            si += 1
    index: dict[str, list[int]] = {}
    unbounded: set[str] = set()  # keys some check needs without a word boundary after
    always: list[int] = []
    for i, chk in enumerate(checks):
        if not chk.needles:
            always.append(i)
            continue
        # index on one requirement, by its part that starts at its rarest character
        key = min(chk.needles, key=index_cost)
        for alt in key:
            word = anchor(alt)
            index.setdefault(word, []).append(i)
            if alt not in chk.bounded:
                unbounded.add(word)
    for word in TERMINAL_NEEDLES:  # lines the terminal-error tracker reads
        index.setdefault(anchor(word), [])
        unbounded.add(anchor(word))
    keys = tuple(sorted(index))
    return _Plan(
        pbs=pbs,
        sigs=tuple(s for pb in pbs for s in pb.signatures),
        checks=tuple(checks),
        index=index,
        keys=keys,
        always=tuple(always),
        pre=prefilter(keys, frozenset(keys) - unbounded) if keys else None,
    )


_PLANS: dict[tuple[int, ...], tuple[Sequence[Matchable], _Plan]] = {}


def _plan_of(playbooks: Sequence[Matchable]) -> _Plan:
    """The plan of ``playbooks``, built once per set: ``orch check`` matches every target's new
    lines against the same set, and building the plan (~700 checks indexed) cost ~2 ms a
    target. Keyed by the identity of the playbook objects (the set is kept alive with its
    plan, so an id is never reused while cached); a few sets at most are kept."""
    ident = tuple(map(id, playbooks))
    hit = _PLANS.get(ident)
    if hit is not None:
        return hit[1]
    plan = _build_plan(playbooks)
    if len(_PLANS) >= 8:
        _PLANS.pop(next(iter(_PLANS)))
    _PLANS[ident] = (tuple(playbooks), plan)
    return plan


class LogMatcher:
    """Feed lines one at a time (or :meth:`run` an iterable); :meth:`matches` ranks the result.

    A line that holds none of the signatures' needles costs a lower-casing and one search
    of the prefilter; only a line that holds one runs the regexes that need it.
    """

    def __init__(self, playbooks: Sequence[Matchable]) -> None:
        plan = _plan_of(playbooks)
        self._pbs = plan.pbs
        self._sigs = plan.sigs
        self._checks = plan.checks
        self._index = plan.index
        self._keys = plan.keys
        self._always = plan.always
        self._pre = plan.pre
        self._quick = plan.pre.quick if plan.pre else None
        self._seen: dict[int, _Seen] = {}
        self._starts: dict[int, list[int | None]] = {}
        self._terminal = Terminal()

    # --- feeding ---

    def feed(self, line: str, lineno: int) -> list[str]:
        """Match one line (1-based ``lineno``); returns the ids it matched (stacks: completed)."""
        low = line[:MAX_LINE_CHARS].lower()
        if not self._always and (self._quick is None or self._quick.search(low) is None):
            return []
        return self._feed_hit(line, lineno)

    def may_hit(self, lines: Sequence[str]) -> bool:
        """False when no line of ``lines`` can match (nor reach the terminal-error tracker):
        one prefilter search over them all, joined, instead of one per line. The prefilter's
        needles hold no newline, so a needle found in the joined text is in one line (a line
        past :data:`MAX_LINE_CHARS` may say True where :meth:`feed` finds nothing: only
        slower, never a miss).

        >>> from orchestrator.playbooks.loader import load_playbooks
        >>> m = LogMatcher(load_playbooks())
        >>> m.may_hit(["step=1 loss=2.3", "step=2 loss=2.2"]), m.may_hit(["x", "Killed"])
        (False, True)
        """
        if self._always or self._quick is None:
            return bool(lines)
        return self._quick.search("\n".join(lines).lower()) is not None

    def run(self, lines: Iterable[str], start: int = 1) -> int:
        """Feed every line of ``lines`` (numbered from ``start``); returns the count fed."""
        n = start - 1
        quick = self._quick
        if self._always or quick is None:
            for n, line in enumerate(lines, start):
                self.feed(line, n)
            return n - start + 1
        search = quick.search
        for n, line in enumerate(lines, start):
            if search(line.lower()) is not None:  # rare: a needle is present
                self._feed_hit(line, n)
        return n - start + 1

    def _feed_hit(self, line: str, lineno: int) -> list[str]:
        text = line[:MAX_LINE_CHARS].rstrip("\r\n")
        low = text.lower()
        self._terminal.feed(text, low, lineno)
        cands = set(self._always)
        for needle in (
            self._pre.present(low) if self._pre else ()
        ):  # only lines the prefilter let in
            cands.update(self._index[needle])
        hit: list[str] = []
        for i in sorted(cands):
            chk = self._checks[i]
            pb = self._pbs[chk.pb]
            sig = self._sigs[chk.sig]
            seen = self._seen.get(chk.pb)
            if (
                seen is not None
                and seen.last_line == lineno
                and CERTAIN in seen.first
                and not sig.is_stack
            ):
                continue  # this line already counts, with the best confidence
            if not all(any(a in low for a in alts) for alts in chk.needles):
                continue
            if compile_once(chk.pattern).search(text) is None:
                continue
            if sig.is_stack and not self._advance(chk, sig, lineno):
                continue
            if seen is None:
                seen = self._seen[chk.pb] = _Seen()
            if seen.last_line != lineno:
                seen.count += 1
                seen.last_line = lineno
                hit.append(pb.id)
            confirm = sig.confirm or pb.confirm
            seen.first.setdefault(sig.confidence, (lineno, text, confirm))
        return hit

    def _advance(self, chk: _Check, sig: Signature, lineno: int) -> bool:
        """Move ``sig``'s stack on: True when this line completes it within the window."""
        starts = self._starts.setdefault(chk.sig, [None] * len(sig.patterns))
        if chk.step == 0:
            starts[0] = lineno
            return len(sig.patterns) == 1
        prev = starts[chk.step - 1]
        if prev is None or prev >= lineno or lineno - prev >= sig.within:
            return False
        cur = starts[chk.step]
        starts[chk.step] = prev if cur is None else max(cur, prev)
        return chk.step == len(sig.patterns) - 1

    # --- result ---

    def matches(self) -> list[Match]:
        """Matching playbooks, best first.

        Causes before consequences (:data:`CONSEQUENCE_PLAYBOOKS`); among causes, those of
        :data:`ABOVE_TERMINAL` priority first, then those that name the failure the log ends
        on (:class:`~orchestrator.playbooks.terminal.Terminal`'s tiers), then priority,
        confidence, severity, earliest line. A consequence on top says so in its ``confirm``.
        """
        out = []
        for pi, seen in self._seen.items():
            pb = self._pbs[pi]
            confidence = next(c for c in CONFIDENCES if c in seen.first)
            lineno, line, confirm = seen.first[confidence]
            out.append(
                Match(
                    id=pb.id,
                    title=pb.title,
                    severity=pb.severity,
                    priority=pb.priority,
                    line=line,
                    lineno=lineno,
                    count=seen.count,
                    remedy=pb.remedy,
                    confidence=confidence,
                    confirm=confirm,
                )
            )
        tier = self._terminal_tiers() if out else {}

        def key(m: Match) -> tuple[int, int, int, int, int, int]:
            if m.id in CONSEQUENCE_PLAYBOOKS:
                cls, t = 2, 0
            elif m.priority >= ABOVE_TERMINAL:
                cls, t = 0, 0
            else:
                cls, t = 1, tier.get(m.id, 9)
            conf = CONFIDENCES.index(m.confidence)
            return (cls, t, -m.priority, conf, -int(m.severity), m.lineno)

        out.sort(key=key)
        if out and out[0].id in CONSEQUENCE_PLAYBOOKS:
            out[0] = replace(out[0], confirm=CONSEQUENCE_NOTE + out[0].confirm)
        return out

    def _terminal_tiers(self) -> dict[str, int]:
        """Playbook id -> the best terminal tier (0 first) whose lines a line signature matches."""
        found: dict[str, int] = {}
        for t, lines in enumerate(self._terminal.tiers()):
            for line in lines:
                for pid in self._line_ids(line):
                    found.setdefault(pid, t)
        return found

    def _line_ids(self, line: str) -> set[str]:
        """Ids of the playbooks a line signature of which matches ``line`` (no state kept)."""
        low = line.lower()
        cands = set(self._always)
        for needle in self._pre.present(low) if self._pre else ():
            cands.update(self._index[needle])
        out = set()
        for i in cands:
            chk = self._checks[i]
            if self._sigs[chk.sig].is_stack or self._pbs[chk.pb].id in out:
                continue
            if all(any(a in low for a in alts) for alts in chk.needles) and compile_once(
                chk.pattern
            ).search(line):
                out.add(self._pbs[chk.pb].id)
        return out


def match_log(lines: Iterable[str], playbooks: Sequence[Matchable]) -> list[Match]:
    """Signature playbooks whose ``match.log`` signatures hit ``lines``, ranked best first."""
    matcher = LogMatcher(playbooks)
    matcher.run(lines)
    return matcher.matches()


def iter_log_lines(
    path: Path | str, max_chars: int = MAX_LINE_CHARS, chunk_bytes: int = READ_CHUNK_BYTES
) -> Iterator[str]:
    """Stream a log file's lines, without their newline, decoded leniently (UTF-8, replaced).

    Reads ``chunk_bytes`` at a time and splits in C; memory stays one chunk plus one line.
    A line longer than ``max_chars`` characters yields its start and the rest is skipped
    (a line is buffered up to 4 bytes per character, UTF-8's widest). A newline byte never
    occurs inside a UTF-8 sequence, so cutting at newlines never splits a character.
    Raises OSError when the file cannot be opened or read.
    """
    limit = 4 * max_chars
    carry = b""
    skipping = False  # inside an over-long line whose start was yielded: drop to its newline
    with Path(path).open("rb") as fh:
        while chunk := fh.read(chunk_bytes):
            last = chunk.rfind(b"\n")
            if last < 0:
                if not skipping:
                    carry += chunk
                    if len(carry) > limit:
                        yield carry.decode("utf-8", errors="replace")[:max_chars]
                        carry, skipping = b"", True
                continue
            first = 0
            if skipping:
                first, carry, skipping = chunk.find(b"\n") + 1, b"", False
            if first <= last:
                lines = (carry + chunk[first:last]).decode("utf-8", errors="replace").split("\n")
                if max(map(len, lines)) > max_chars:
                    lines = [s[:max_chars] for s in lines]
                yield from lines
            carry = chunk[last + 1 :]
            if len(carry) > limit:
                yield carry.decode("utf-8", errors="replace")[:max_chars]
                carry, skipping = b"", True
    if carry and not skipping:
        yield carry.decode("utf-8", errors="replace")[:max_chars]
