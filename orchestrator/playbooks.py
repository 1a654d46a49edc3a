"""Playbooks: failure signatures (log regexes, finding kinds, exit codes -> diagnosis, remedy)
and procedures (ordered steps), loaded from ``playbooks/*.yaml`` and validated.

This module loads, validates and matches. Carrying a procedure out (``orch playbook
run``: planning, dry run, ``--yes``) lives in :mod:`orchestrator.lifecycle.procedures`.

A bad file is one :class:`~orchestrator.errors.ConfigError` naming ``file:line: key``.
:func:`match_log` streams any iterable of lines (a 10 GB log is fine) and ranks the
matching signature playbooks best first. The schema is in docs/playbooks.md.

>>> pbs = load_playbooks()
>>> [m.id for m in match_log(["RuntimeError: CUDA error: an illegal memory access was encountered"], pbs)]
['illegal-memory-access']
>>> match_log(["step=120 loss=2.3104 acc_len=3.21 tok/s=21500 lr=3.0e-04"], pbs)
[]
"""

from __future__ import annotations

import difflib
import logging
import re
import string
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.errors import ConfigError
from orchestrator.model import Severity

log = logging.getLogger(__name__)

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "playbooks"
"""The bundled playbooks (repository root ``playbooks/``)."""

KINDS = ("signature", "procedure")
ACTIONS = ("stop", "launch", "verify", "archive")
"""Built-in procedure actions (orchestrator.lifecycle.procedures; see docs/playbooks.md)."""
SKIP_SUFFIX = "-rules.yaml"
"""Files in the playbook directory named ``*-rules.yaml`` are not playbooks (Prometheus
alerting rules live beside them, ``playbooks/prometheus-rules.yaml``); every other
``*.yaml`` must be a valid playbook."""
PLACEHOLDERS = ("python", "workdir", "session", "target", "gpu", "gpus", "venv", "cache_dir")
"""Names a step's ``run``/``argv``/``env`` may use as ``{name}``."""

_TOP_KEYS = {
    "id", "title", "kind", "severity", "priority", "match", "diagnosis", "remedy",
    "references", "steps",
}  # fmt: skip
_MATCH_KEYS = {"log", "findings", "exit_codes"}
_STEP_KEYS = {
    "name", "run", "argv", "action", "path", "overwrites", "foreach", "env", "timeout_s", "note",
}  # fmt: skip
_ID_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_LEADING_FLAGS = re.compile(r"^\(\?([aiLmsux]+)\)")
MAX_LINE_CHARS = 65536
"""Longer log lines are matched on their first this-many characters."""


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a procedure: an argv to run in the container, or a built-in ``action``.

    ``foreach: gpu`` repeats the step once per GPU of the target, in order (sequential
    warm-up is the point of ``prewarm-relaunch``). ``path`` is the ``archive`` action's
    target; ``overwrites`` names a path an argv step would replace (refused unless
    ``--force``, which archives it first).
    """

    name: str
    argv: tuple[str, ...] | None = None
    action: str | None = None
    path: str | None = None
    overwrites: str | None = None
    foreach: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0
    note: str | None = None


@dataclass(frozen=True, slots=True)
class Playbook:
    """A validated playbook file. ``patterns`` are the compiled ``match.log`` regexes."""

    id: str
    title: str
    kind: str
    severity: Severity
    diagnosis: str
    path: str
    priority: int = 50
    log: tuple[str, ...] = ()
    findings: tuple[str, ...] = ()
    exit_codes: tuple[int, ...] = ()
    remedy: tuple[str, ...] = ()
    references: tuple[str, ...] = ()
    steps: tuple[Step, ...] = ()
    patterns: tuple[re.Pattern[str], ...] = field(default=(), repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form (``orch playbook show --json``)."""
        out: dict[str, Any] = {
            "id": self.id,
            "title": self.title,
            "kind": self.kind,
            "severity": str(self.severity),
            "priority": self.priority,
            "match": {
                "log": list(self.log),
                "findings": list(self.findings),
                "exit_codes": list(self.exit_codes),
            },
            "diagnosis": self.diagnosis,
            "remedy": list(self.remedy),
            "references": list(self.references),
            "path": self.path,
        }
        if self.kind == "procedure":
            out["steps"] = [
                {
                    k: v
                    for k, v in (
                        ("name", s.name),
                        ("argv", list(s.argv) if s.argv else None),
                        ("action", s.action),
                        ("path", s.path),
                        ("overwrites", s.overwrites),
                        ("foreach", s.foreach),
                        ("env", s.env or None),
                        ("timeout_s", s.timeout_s),
                        ("note", s.note),
                    )
                    if v is not None
                }  # fmt: skip
                for s in self.steps
            ]
        return out


@dataclass(frozen=True, slots=True)
class Match:
    """A signature playbook that matched a log: its first evidence line (1-based ``lineno``)."""

    id: str
    title: str
    severity: Severity
    priority: int
    line: str
    lineno: int
    count: int
    remedy: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "severity": str(self.severity),
            "line": self.line,
            "lineno": self.lineno,
            "count": self.count,
            "remedy": list(self.remedy),
        }


# --- YAML with line numbers ------------------------------------------------------------------


class _Doc:
    """Plain data from a YAML file plus the line of every key path (for file:line errors)."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.lines: dict[tuple[Any, ...], int] = {}
        try:
            node = yaml.compose(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark is not None else None
            raise ConfigError(
                path, line, "", f"not valid YAML: {getattr(exc, 'problem', exc)}"
            ) from None
        self.data = self._build(node, ()) if node is not None else None

    def _build(self, node: yaml.Node, at: tuple[Any, ...]) -> Any:
        self.lines[at] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for k, v in node.value:
                key = str(k.value)
                if key in out:
                    raise ConfigError(
                        self.path, k.start_mark.line + 1, self.key(*at, key), "duplicate key"
                    )
                out[key] = self._build(v, at + (key,))
                self.lines[at + (key,)] = k.start_mark.line + 1
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self._build(v, (*at, i)) for i, v in enumerate(node.value)]
        return yaml.safe_load(yaml.serialize(node))

    @staticmethod
    def key(*at: Any) -> str:
        return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in at).replace(".[", "[")

    def error(self, at: tuple[Any, ...], problem: str) -> ConfigError:
        line = None
        for n in range(len(at), -1, -1):
            if at[:n] in self.lines:
                line = self.lines[at[:n]]
                break
        return ConfigError(self.path, line, self.key(*at), problem)


def _unknown(doc: _Doc, at: tuple[Any, ...], data: dict[str, Any], allowed: set[str]) -> None:
    for key in data:
        if key not in allowed:
            near = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = (
                f"; did you mean {near[0]!r}?"
                if near
                else f"; allowed: {', '.join(sorted(allowed))}"
            )
            raise doc.error((*at, key), f"unknown key{hint}")


def _str(doc: _Doc, at: tuple[Any, ...], value: Any, *, required: bool = True) -> str | None:
    if value is None:
        if required:
            raise doc.error(at, "missing (required)")
        return None
    if not isinstance(value, str) or not value.strip():
        raise doc.error(at, "must be a non-empty string")
    return value


def _list(doc: _Doc, at: tuple[Any, ...], value: Any, item: type) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise doc.error(at, f"must be a list of {item.__name__}")
    for i, v in enumerate(value):
        if not isinstance(v, item) or isinstance(v, bool):
            raise doc.error((*at, i), f"must be a {item.__name__}, got {v!r:.40}")
    return value


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """Compile a playbook regex; a leading ``(?i)`` applies to that pattern only.

    >>> compile_pattern("(?i)loss is nan").search("Loss is NaN") is not None
    True
    """
    return re.compile(pattern)


def _scoped(pattern: str) -> str:
    """The pattern as a group usable inside one big alternation (global flags made local).

    >>> _scoped("(?i)nan")
    '(?i:nan)'
    >>> _scoped("a|b")
    '(?:a|b)'
    """
    m = _LEADING_FLAGS.match(pattern)
    if m:
        return f"(?{m.group(1)}:{pattern[m.end() :]})"
    return f"(?:{pattern})"


def _check_placeholders(doc: _Doc, at: tuple[Any, ...], text: str) -> None:
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as exc:
        raise doc.error(at, f"bad placeholder: {exc}") from None
    for name in names:
        if name not in PLACEHOLDERS:
            raise doc.error(at, f"unknown placeholder {{{name}}}; known: {', '.join(PLACEHOLDERS)}")


def _step(doc: _Doc, at: tuple[Any, ...], data: Any) -> Step:
    import shlex

    if not isinstance(data, dict):
        raise doc.error(at, "a step must be a mapping")
    _unknown(doc, at, data, _STEP_KEYS)
    name = _str(doc, (*at, "name"), data.get("name"))
    forms = [k for k in ("run", "argv", "action") if k in data]
    if len(forms) != 1:
        raise doc.error(at, "needs exactly one of run, argv, action")
    argv: tuple[str, ...] | None = None
    action = None
    if "run" in data:
        run = _str(doc, (*at, "run"), data["run"])
        assert run is not None
        _check_placeholders(doc, (*at, "run"), run)
        try:
            argv = tuple(shlex.split(run))
        except ValueError as exc:
            raise doc.error((*at, "run"), f"cannot split into argv: {exc}") from None
    elif "argv" in data:
        items = _list(doc, (*at, "argv"), data["argv"], str)
        if not items:
            raise doc.error((*at, "argv"), "must not be empty")
        for i, a in enumerate(items):
            _check_placeholders(doc, (*at, "argv", i), a)
        argv = tuple(items)
    else:
        action = data["action"]
        if action not in ACTIONS:
            raise doc.error(
                (*at, "action"), f"unknown action {action!r}; known: {', '.join(ACTIONS)}"
            )
    path = _str(doc, (*at, "path"), data.get("path"), required=False)
    if (action == "archive") != (path is not None):
        raise doc.error((*at, "path"), "the archive action needs path:, and only it takes one")
    overwrites = _str(doc, (*at, "overwrites"), data.get("overwrites"), required=False)
    if overwrites is not None and argv is None:
        raise doc.error((*at, "overwrites"), "only run/argv steps take overwrites:")
    for key, value in (("path", path), ("overwrites", overwrites)):
        if value is not None:
            _check_placeholders(doc, (*at, key), value)
    foreach = data.get("foreach")
    if foreach is not None and foreach != "gpu":
        raise doc.error((*at, "foreach"), "only 'gpu' is supported")
    env = data.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(v, (str, int, float)) for v in env.values()):
        raise doc.error((*at, "env"), "must be a mapping of NAME: value")
    for k, v in env.items():
        _check_placeholders(doc, (*at, "env", k), str(v))
    timeout = data.get("timeout_s", 600.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise doc.error((*at, "timeout_s"), "must be a number of seconds > 0")
    return Step(
        name=name or "",
        argv=argv,
        action=action,
        path=path,
        overwrites=overwrites,
        foreach=foreach,
        env={str(k): str(v) for k, v in env.items()},
        timeout_s=float(timeout),
        note=_str(doc, (*at, "note"), data.get("note"), required=False),
    )


def parse_playbook(text: str, path: str) -> Playbook:
    """Validate one playbook document; raises ConfigError(file, line, key, problem)."""
    doc = _Doc(path, text)
    data = doc.data
    if not isinstance(data, dict):
        raise ConfigError(path, 1, "", "a playbook must be a YAML mapping")
    _unknown(doc, (), data, _TOP_KEYS)
    pid = _str(doc, ("id",), data.get("id"))
    assert pid is not None
    if not _ID_RE.match(pid):
        raise doc.error(("id",), "must be kebab-case (a-z, 0-9, '-')")
    title = _str(doc, ("title",), data.get("title"))
    kind = data.get("kind")
    if kind not in KINDS:
        raise doc.error(("kind",), f"must be one of {', '.join(KINDS)}")
    sev_text = data.get("severity", None if kind == "signature" else "info")
    if sev_text is None:
        raise doc.error(("severity",), "missing (required)")
    try:
        severity = Severity[str(sev_text).upper()]
    except KeyError:
        raise doc.error(("severity",), "must be info, warning or critical") from None
    priority = data.get("priority", 50)
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 100:
        raise doc.error(("priority",), "must be an integer 0-100")
    diagnosis = _str(doc, ("diagnosis",), data.get("diagnosis"))
    remedy = _list(doc, ("remedy",), data.get("remedy"), str)
    references = _list(doc, ("references",), data.get("references"), str)
    for i, ref in enumerate(references):
        if not ref.startswith(("http://", "https://")):
            raise doc.error(("references", i), "must be a URL")
    match = data.get("match") or {}
    if not isinstance(match, dict):
        raise doc.error(("match",), "must be a mapping with log, findings, exit_codes")
    _unknown(doc, ("match",), match, _MATCH_KEYS)
    log = _list(doc, ("match", "log"), match.get("log"), str)
    patterns = []
    for i, pattern in enumerate(log):
        try:
            patterns.append(compile_pattern(pattern))
            re.compile(_scoped(pattern))
        except re.error as exc:
            raise doc.error(("match", "log", i), f"bad regex: {exc}") from None
    findings = _list(doc, ("match", "findings"), match.get("findings"), str)
    exit_codes = _list(doc, ("match", "exit_codes"), match.get("exit_codes"), int)
    steps: list[Step] = []
    if kind == "signature":
        if not (log or findings or exit_codes):
            raise doc.error(
                ("match",), "a signature needs at least one of log, findings, exit_codes"
            )
        if not remedy:
            raise doc.error(("remedy",), "missing (required): the steps to take, in words")
        if "steps" in data:
            raise doc.error(("steps",), "only procedures have steps")
    else:
        raw = data.get("steps")
        if not isinstance(raw, list) or not raw:
            raise doc.error(("steps",), "missing (required): a procedure needs a list of steps")
        steps = [_step(doc, ("steps", i), s) for i, s in enumerate(raw)]
    return Playbook(
        id=pid,
        title=title or "",
        kind=kind,
        severity=severity,
        diagnosis=diagnosis or "",
        path=path,
        priority=priority,
        log=tuple(log),
        findings=tuple(findings),
        exit_codes=tuple(exit_codes),
        remedy=tuple(remedy),
        references=tuple(references),
        steps=tuple(steps),
        patterns=tuple(patterns),
    )


def load_playbooks(dir: Path | str | None = None) -> list[Playbook]:  # noqa: A002 - the agreed API
    """Every ``*.yaml`` in ``dir`` (default: the bundled ``playbooks/``), sorted by id.

    Files named ``*-rules.yaml`` (:data:`SKIP_SUFFIX`, Prometheus rules) are skipped;
    any other YAML file that is not a valid playbook is an error, never silently ignored.

    Raises:
        ConfigError: a file is malformed, or two files share an id (exit code 2).
    """
    root = Path(dir) if dir is not None else DEFAULT_DIR
    if not root.is_dir():
        raise ConfigError(str(root), None, "", "no such playbook directory")
    out: dict[str, Playbook] = {}
    for path in sorted(root.glob("*.yaml")):
        if path.name.endswith(SKIP_SUFFIX):
            log.debug("%s: *%s is not a playbook; skipped", path, SKIP_SUFFIX)
            continue
        text = path.read_text(encoding="utf-8")
        pb = parse_playbook(text, str(path))
        if pb.id in out:
            raise ConfigError(
                str(path), 1, "id", f"duplicate id {pb.id!r} (also in {out[pb.id].path})"
            )
        out[pb.id] = pb
    return sorted(out.values(), key=lambda p: p.id)


def get_playbook(playbooks: Sequence[Playbook], pid: str) -> Playbook:
    """The playbook called ``pid``; UsageError naming the near ones when unknown."""
    from orchestrator.errors import UsageError

    for pb in playbooks:
        if pb.id == pid:
            return pb
    near = difflib.get_close_matches(pid, [p.id for p in playbooks], n=3)
    hint = f"; did you mean {', '.join(near)}?" if near else "; see: orch playbook list"
    raise UsageError(f"no playbook {pid!r}{hint}")


# --- matching ----------------------------------------------------------------------------------


def literal_needles(pattern: str) -> list[frozenset[str]]:
    r"""Lower-cased literals a line must contain for ``pattern`` to match (a cheap pre-check).

    Each entry is a set of alternatives (any one must be present); all entries are
    required. An empty list means no pre-check is possible: always run the regex.

    >>> literal_needles(r"No space left on device")
    [frozenset({'no space left on device'})]
    >>> sorted(map(sorted, literal_needles(r"(?i)\bloss is (nan|inf)")))
    [['inf', 'nan'], ['loss is ']]
    >>> literal_needles(r"a|b")
    []
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
    run: list[str] = []

    def flush() -> None:
        if len(run) >= 3:
            out.append(frozenset({"".join(run).lower()}))
        run.clear()

    for op, av in sre.parse(pattern):
        if op is c.LITERAL:
            run.append(chr(av))
            continue
        flush()
        if op is c.SUBPATTERN:
            body = list(av[-1])
            if len(body) == 1 and body[0][0] is c.BRANCH:
                alts = [literal_seq(b) for b in body[0][1][1]]
                if all(a for a in alts):
                    out.append(frozenset(a.lower() for a in alts if a))
            else:
                lit = literal_seq(body)
                if lit and len(lit) >= 3:
                    out.append(frozenset({lit.lower()}))
        elif op is c.BRANCH:
            return []
    flush()
    return out


class LogMatcher:
    """Feed lines one at a time; keeps the first matching line and a count per playbook.

    Each regex carries literal needles (:func:`literal_needles`); a line runs a regex
    only when it holds that regex's needles, so a line matching nothing costs a
    lower-casing and a few substring tests.
    """

    def __init__(self, playbooks: Sequence[Playbook]) -> None:
        self._pbs = [p for p in playbooks if p.kind == "signature" and p.patterns]
        self._checks = [
            (pb, pat, literal_needles(src))
            for pb in self._pbs
            for pat, src in zip(pb.patterns, pb.log, strict=True)
        ]
        index: dict[str, list[int]] = {}
        self._always: list[int] = []
        for i, (_pb, _pat, needles) in enumerate(self._checks):
            if not needles:
                self._always.append(i)
                continue
            # index on one requirement: an alternation (nan|inf) is usually the telling part
            key = max(needles, key=lambda alts: (len(alts) > 1, min(map(len, alts))))
            for alt in key:
                index.setdefault(alt, []).append(i)
        self._index = list(index.items())
        self._first: dict[str, tuple[int, str]] = {}
        self._count: dict[str, int] = {}

    def feed(self, line: str, lineno: int) -> list[str]:
        """Match one line (1-based ``lineno``); returns the ids it matched."""
        text = line[:MAX_LINE_CHARS].rstrip("\r\n")
        low = text.lower()
        cands = set(self._always)
        for needle, ids in self._index:
            if needle in low:
                cands.update(ids)
        if not cands:
            return []
        hit: list[str] = []
        for i in sorted(cands):
            pb, pat, needles = self._checks[i]
            if pb.id in hit or not all(any(a in low for a in alts) for alts in needles):
                continue
            if pat.search(text):
                hit.append(pb.id)
                self._first.setdefault(pb.id, (lineno, text))
                self._count[pb.id] = self._count.get(pb.id, 0) + 1
        return hit

    def matches(self) -> list[Match]:
        """Matching playbooks, best first: priority, then severity, then earliest line."""
        out = []
        for pb in self._pbs:
            if pb.id not in self._first:
                continue
            lineno, line = self._first[pb.id]
            out.append(
                Match(
                    id=pb.id,
                    title=pb.title,
                    severity=pb.severity,
                    priority=pb.priority,
                    line=line,
                    lineno=lineno,
                    count=self._count[pb.id],
                    remedy=pb.remedy,
                )
            )
        out.sort(key=lambda m: (-m.priority, -int(m.severity), m.lineno))
        return out


def match_log(lines: Iterable[str], playbooks: Sequence[Playbook]) -> list[Match]:
    """Signature playbooks whose ``match.log`` regexes hit ``lines``, ranked best first."""
    matcher = LogMatcher(playbooks)
    for n, line in enumerate(lines, 1):
        matcher.feed(line, n)
    return matcher.matches()


def for_exit_code(code: int, playbooks: Sequence[Playbook]) -> Playbook | None:
    """The highest-priority signature playbook listing ``code`` in ``match.exit_codes``."""
    found = [p for p in playbooks if p.kind == "signature" and code in p.exit_codes]
    return max(found, key=lambda p: p.priority) if found else None


def iter_log_lines(path: Path | str, max_line_bytes: int = MAX_LINE_CHARS) -> Iterator[str]:
    """Stream a log file's lines (decoded leniently), never holding more than one line.

    A line longer than ``max_line_bytes`` yields its start; the rest is skipped.
    Raises OSError when the file cannot be opened.
    """
    with open(path, "rb") as fh:
        while True:
            chunk = fh.readline(max_line_bytes)
            if not chunk:
                return
            if not chunk.endswith(b"\n"):
                while True:  # skip the rest of an over-long line
                    rest = fh.readline(max_line_bytes)
                    if not rest or rest.endswith(b"\n"):
                        break
            yield chunk.decode("utf-8", errors="replace")


# --- text output ---------------------------------------------------------------------------------


def format_matches(matches: Sequence[Match], playbooks: Sequence[Playbook], path: str) -> str:
    """Human text for ``orch diagnose``: each match with its evidence line and remedy."""
    if not matches:
        return f"{path}: no known failure signature matched"
    by_id = {p.id: p for p in playbooks}
    parts = []
    for rank, m in enumerate(matches, 1):
        pb = by_id.get(m.id)
        more = f" ({m.count} lines)" if m.count > 1 else ""
        lines = [
            f"{rank}. {m.id} [{m.severity}]: {m.title}",
            f"   {path}:{m.lineno}{more}: {m.line.strip()[:300]}",
        ]
        if pb is not None:
            lines.append("   " + " ".join(pb.diagnosis.split())[:400])
        lines += [f"   - {r}" for r in m.remedy]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)
