"""Playbooks: failure signatures (log regexes, finding kinds, exit codes -> diagnosis, remedy)
and procedures (ordered steps), loaded from ``playbooks/*.yaml`` and validated.

This module loads and validates; matching a log is :mod:`orchestrator.playbooks.matching` (its
names are re-exported here). Carrying out a procedure (``orch playbook run``: planning,
dry run, ``--yes``) lives in :mod:`orchestrator.lifecycle.procedures`.

A file is read as YAML nodes through :class:`orchestrator.config.reader.NodeReader`, the
same reader as hosts.yaml, so a bad file is one :class:`~orchestrator.errors.ConfigError`
naming ``file:line: key``. :func:`match_log` streams any iterable of lines (a 10 GB log is
fine) and ranks the matching signature playbooks best first. The schema is in
docs/playbooks.md.

>>> pbs = load_playbooks()
>>> [m.id for m in match_log(["RuntimeError: CUDA error: an illegal memory access was encountered"], pbs)]
['illegal-memory-access']
>>> match_log(["step=120 loss=2.3104 acc_len=3.21 tok/s=21500 lr=3.0e-04"], pbs)
[]
>>> [(m.id, m.confidence) for m in match_log(["Killed"], pbs)]
[('sigkill', 'probable')]
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config.reader import NodeReader, compose
from orchestrator.errors import ConfigError
from orchestrator.playbooks.matching import (
    CERTAIN,
    CONFIDENCES,
    MAX_LINE_CHARS,
    LogMatcher,
    Match,
    Signature,
    iter_log_lines,
    literal_needles,
    match_log,
)
from orchestrator.playbooks.prefilter import remember, tries
from orchestrator.playbooks.steps import (
    ACTIONS,
    PLACEHOLDERS,
    Step,
    fields_of,
    items_of,
    parse_step,
    strings_of,
    text_of,
)
from orchestrator.wire.model import Severity

__all__ = [
    "ACTIONS",
    "CERTAIN",
    "CONFIDENCES",
    "DEFAULT_RESTART_PROCEDURE",
    "MAX_LINE_CHARS",
    "PLACEHOLDERS",
    "LogMatcher",
    "Match",
    "Playbook",
    "Signature",
    "Step",
    "compile_pattern",
    "for_exit_code",
    "format_matches",
    "get_playbook",
    "iter_log_lines",
    "literal_needles",
    "load_playbooks",
    "match_log",
    "parse_playbook",
]

log = logging.getLogger(__name__)

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "playbooks"
"""The bundled playbooks (repository root ``playbooks/``)."""

KINDS = ("signature", "procedure")
SKIP_SUFFIX = "-rules.yaml"
"""Files in the playbook directory named ``*-rules.yaml`` are not playbooks (Prometheus
alerting rules live beside them, ``playbooks/prometheus-rules.yaml``); every other
``*.yaml`` must be a valid playbook."""
MAX_STACK_WINDOW = 200
"""A stack signature spans at most this many lines (its ``within:``): memory stays bounded."""
DEFAULT_STACK_WINDOW = 40

_TOP_KEYS = {
    "id",
    "title",
    "kind",
    "severity",
    "priority",
    "confidence",
    "confirm",
    "match",
    "diagnosis",
    "remedy",
    "references",
    "steps",
    "restart",
}
_RESTART_KEYS = {"retryable", "procedure", "why"}
DEFAULT_RESTART_PROCEDURE = "relaunch"
"""The procedure that restarts a retryable failure whose playbook names none: the same command
again, resuming from its newest checkpoint (``playbooks/relaunch.yaml``)."""
_MATCH_KEYS = {"log", "findings", "exit_codes"}
_SIGNATURE_KEYS = {"regex", "stack", "within", "confidence", "confirm"}
_ID_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


@dataclass(frozen=True, slots=True)
class RestartRule:
    """A signature playbook's ``restart:``: whether a restart can cure its failure, and how.

    ``retryable`` false: a relaunch would fail the same way (a code bug, a full disk): page.
    ``procedure``: the procedure playbook that restarts it (default :data:`DEFAULT_RESTART_PROCEDURE`).
    ``why``: the reason, in words (docs/self-healing.md's table, the journal's evidence).
    ``line``: where ``procedure`` is written (for the cross-file check), else ``None``.
    """

    retryable: bool
    why: str
    procedure: str | None = None
    line: int | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"retryable": self.retryable, "procedure": self.procedure, "why": self.why}


@dataclass(frozen=True, slots=True)
class Playbook:
    """A validated playbook file. ``signatures`` are its compiled ``match.log`` entries.

    ``confidence`` and ``confirm`` are the defaults of its signatures: how sure a match
    is, and the next check that would confirm it.
    """

    id: str
    title: str
    kind: str
    severity: Severity
    diagnosis: str
    path: str
    priority: int = 50
    confidence: str = CERTAIN
    confirm: str = ""
    signatures: tuple[Signature, ...] = ()
    findings: tuple[str, ...] = ()
    exit_codes: tuple[int, ...] = ()
    remedy: tuple[str, ...] = ()
    references: tuple[str, ...] = ()
    steps: tuple[Step, ...] = ()
    restart: RestartRule | None = None
    """``None``: the file says nothing, so the failure is not retried."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form (``orch playbook show --json``), ``match.log`` as written."""
        out: dict[str, Any] = {
            "id": self.id,
            "title": self.title,
            "kind": self.kind,
            "severity": str(self.severity),
            "priority": self.priority,
            "confidence": self.confidence,
            "confirm": self.confirm,
            "match": {
                "log": [self._signature_dict(s) for s in self.signatures],
                "findings": list(self.findings),
                "exit_codes": list(self.exit_codes),
            },
            "diagnosis": self.diagnosis,
            "remedy": list(self.remedy),
            "references": list(self.references),
            "path": self.path,
        }
        if self.kind == "signature":
            out["restart"] = self.restart.to_dict() if self.restart else None
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
                        ("resume", s.resume),
                        ("trainer_args", list(s.trainer_args) or None),
                    )
                    if v is not None
                }
                for s in self.steps
            ]
        return out

    def _signature_dict(self, s: Signature) -> str | dict[str, Any]:
        if not s.is_stack and s.confidence == self.confidence and not s.confirm:
            return s.patterns[0]
        out: dict[str, Any] = (
            {"stack": list(s.patterns), "within": s.within}
            if s.is_stack
            else {"regex": s.patterns[0]}
        )
        if s.confidence != self.confidence:
            out["confidence"] = s.confidence
        if s.confirm:
            out["confirm"] = s.confirm
        return out


# --- reading (YAML nodes through the config reader: every value keeps its line) -------------


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """Compile a playbook regex; a leading ``(?i)`` applies to that pattern only.

    >>> compile_pattern("(?i)loss is nan").search("Loss is NaN") is not None
    True
    """
    return re.compile(pattern)


def _confidence(r: NodeReader, node: yaml.Node, key: str) -> str:
    value = r.text(node, key, "certain or probable")
    if value not in CONFIDENCES:
        raise r.fail(node, key, f"must be one of {', '.join(CONFIDENCES)} (got {value!r})")
    return value


def _signature(r: NodeReader, node: yaml.Node, key: str, confidence: str) -> Signature:
    """One ``match.log`` entry: a regex string, or a mapping with ``regex`` or ``stack``."""
    if isinstance(node, yaml.ScalarNode):
        patterns, within, confirm = [r.text(node, key, "a regular expression")], 1, ""
    else:
        f = fields_of(r, node, key, _SIGNATURE_KEYS)
        if ("regex" in f) == ("stack" in f):
            raise r.fail(node, key, "needs exactly one of regex, stack")
        if "regex" in f:
            patterns, within = [r.text(f["regex"][1], f"{key}.regex", "a regular expression")], 1
            if "within" in f:
                raise r.fail(f["within"][0], f"{key}.within", "only a stack takes within:")
        else:
            patterns = strings_of(r, f["stack"][1], f"{key}.stack")
            if len(patterns) < 2:
                raise r.fail(f["stack"][1], f"{key}.stack", "a stack needs at least 2 regexes")
            within = DEFAULT_STACK_WINDOW
            if "within" in f:
                within = r.integer(
                    f["within"][1],
                    f"{key}.within",
                    len(patterns),
                    MAX_STACK_WINDOW,
                    f"a number of lines from {len(patterns)} to {MAX_STACK_WINDOW}",
                )
        if "confidence" in f:
            confidence = _confidence(r, f["confidence"][1], f"{key}.confidence")
        confirm = text_of(r, f, "confirm", node, key, required=False) or ""
    for i, pattern in enumerate(patterns):
        try:
            compile_pattern(pattern)
        except re.error as exc:
            where = key if len(patterns) == 1 else f"{key}.stack[{i}]"
            raise r.fail(node, where, f"bad regex: {exc}") from None
    return Signature.build(patterns, confidence=confidence, confirm=confirm, within=within)


def parse_playbook(text: str, path: str) -> Playbook:
    """Validate one playbook document; raises ConfigError(file, line, key, problem)."""
    root = compose(path, text)
    r = NodeReader(path, Path(path).parent)
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(path, 1, "", "a playbook must be a YAML mapping")
    f = fields_of(r, root, "", _TOP_KEYS)
    pid = text_of(r, f, "id", root, "")
    assert pid is not None
    if not _ID_RE.match(pid):
        raise r.fail(f["id"][1], "id", "must be kebab-case (a-z, 0-9, '-')")
    title = text_of(r, f, "title", root, "")
    kind = r.text(f["kind"][1], "kind", "a kind") if "kind" in f else None
    if kind not in KINDS:
        raise r.fail(
            f["kind"][1] if "kind" in f else root, "kind", f"must be one of {', '.join(KINDS)}"
        )
    if "severity" in f:
        sev_node = f["severity"][1]
        try:
            severity = Severity[r.text(sev_node, "severity", "a severity").upper()]
        except KeyError:
            raise r.fail(sev_node, "severity", "must be info, warning or critical") from None
    elif kind == "signature":
        raise r.fail(root, "severity", "missing (required)")
    else:
        severity = Severity.INFO
    priority = 50
    if "priority" in f:
        priority = r.integer(f["priority"][1], "priority", 0, 100, "an integer 0-100")
    confidence = _confidence(r, f["confidence"][1], "confidence") if "confidence" in f else CERTAIN
    confirm = text_of(r, f, "confirm", root, "", required=False) or ""
    diagnosis = text_of(r, f, "diagnosis", root, "")
    remedy = strings_of(r, f["remedy"][1] if "remedy" in f else None, "remedy")
    references = strings_of(r, f["references"][1] if "references" in f else None, "references")
    for i, ref in enumerate(references):
        if not ref.startswith(("http://", "https://")):
            raise r.fail(f["references"][1].value[i], f"references[{i}]", "must be a URL")
    mf = fields_of(r, f["match"][1], "match", _MATCH_KEYS) if "match" in f else {}
    log_items = items_of(r, mf["log"][1] if "log" in mf else None, "match.log", "regexes")
    signatures = tuple(
        _signature(r, n, f"match.log[{i}]", confidence) for i, n in enumerate(log_items)
    )
    findings = strings_of(r, mf["findings"][1] if "findings" in mf else None, "match.findings")
    exit_codes = [
        r.integer(n, f"match.exit_codes[{i}]", 0, 255, "an exit status 0-255")
        for i, n in enumerate(
            items_of(
                r, mf["exit_codes"][1] if "exit_codes" in mf else None, "match.exit_codes", "int"
            )
        )
    ]
    restart = _restart(r, f["restart"][1]) if "restart" in f else None
    if restart is not None and kind != "signature":
        raise r.fail(f["restart"][0], "restart", "only signatures have restart: (a failure's cure)")
    steps: list[Step] = []
    if kind == "signature":
        if not (signatures or findings or exit_codes):
            raise r.fail(
                f["match"][1] if "match" in f else root,
                "match",
                "a signature needs at least one of log, findings, exit_codes",
            )
        if not remedy:
            raise r.fail(
                f["remedy"][1] if "remedy" in f else root,
                "remedy",
                "missing (required): the steps to take, in words",
            )
        if "steps" in f:
            raise r.fail(f["steps"][0], "steps", "only procedures have steps")
    else:
        raw = items_of(r, f["steps"][1] if "steps" in f else None, "steps", "steps")
        if not raw:
            raise r.fail(
                f["steps"][1] if "steps" in f else root,
                "steps",
                "missing (required): a procedure needs a list of steps",
            )
        steps = [parse_step(r, n, f"steps[{i}]") for i, n in enumerate(raw)]
    return Playbook(
        id=pid,
        title=title or "",
        kind=kind,
        severity=severity,
        diagnosis=diagnosis or "",
        path=path,
        priority=priority,
        confidence=confidence,
        confirm=confirm,
        signatures=signatures,
        findings=tuple(findings),
        exit_codes=tuple(exit_codes),
        remedy=tuple(remedy),
        references=tuple(references),
        steps=tuple(steps),
        restart=restart,
    )


def _restart(r: NodeReader, node: yaml.Node) -> RestartRule:
    """``restart: {retryable, procedure, why}`` of a signature playbook."""
    f = fields_of(r, node, "restart", _RESTART_KEYS)
    if "retryable" not in f:
        raise r.fail(node, "restart.retryable", "missing (required): true or false")
    retryable = r.scalar(f["retryable"][1], "restart.retryable", "true or false")
    if not isinstance(retryable, bool):
        raise r.fail(f["retryable"][1], "restart.retryable", "must be true or false")
    why = text_of(r, f, "why", node, "restart")
    procedure = text_of(r, f, "procedure", node, "restart", required=False)
    line = None
    if procedure is not None:
        line = f["procedure"][1].start_mark.line + 1
        if not retryable:
            raise r.fail(
                f["procedure"][1],
                "restart.procedure",
                "a failure that is not retryable names no procedure",
            )
    return RestartRule(retryable, why or "", procedure, line)


# ``dir`` shadows the builtin: the agreed API
def load_playbooks(dir: Path | str | None = None, vocab: bool = True) -> list[Playbook]:
    """Every ``*.yaml`` in ``dir`` (default: the bundled ``playbooks/``), sorted by id.

    With ``vocab`` (the default) each playbook also gets the signatures of the vocabulary
    tables in ``dir/vocab/`` that name it (:mod:`orchestrator.playbooks.vocab`).

    Files named ``*-rules.yaml`` (:data:`SKIP_SUFFIX`, Prometheus rules) are skipped;
    any other YAML file that is not a valid playbook is an error, never silently ignored.

    The result is kept in :mod:`orchestrator.playbooks.cache`, keyed by the bytes of every
    file read: a later process with the same files reads it back instead of parsing
    (~5 ms instead of ~220 ms for the bundled set); an invalid set is never cached, so
    its error is raised every time.

    Raises:
        ConfigError: a file is malformed, or two files share an id (exit code 2).
    """
    from orchestrator.playbooks import cache

    root = Path(dir) if dir is not None else DEFAULT_DIR
    if not root.is_dir():
        raise ConfigError(str(root), None, "", "no such playbook directory")
    try:
        files = [(p, p.read_bytes()) for p in cache.playbook_files(root)]
    except OSError as exc:
        raise ConfigError(str(root), None, "", f"cannot read: {exc}") from None
    key = cache.key_of(root, files, variant=f"vocab={vocab}")
    hit = cache.load(root, key)
    if (
        isinstance(hit, tuple)
        and len(hit) == 2
        and isinstance(hit[0], list)
        and all(isinstance(p, Playbook) for p in hit[0])
        and isinstance(hit[1], dict)
    ):
        remember(hit[1])
        return hit[0]
    books = _parse_all(root, files, vocab)
    LogMatcher(books)  # builds the prefilter's trie, kept with the playbooks
    cache.store(root, key, (books, tries()))
    return books


def _parse_all(root: Path, files: list[tuple[Path, bytes]], vocab: bool) -> list[Playbook]:
    """:func:`load_playbooks` without the cache: parse and cross-check ``files`` of ``root``."""
    out: dict[str, Playbook] = {}
    tables: dict[Path, str] = {}
    for path, data in files:
        text = _text(path, data)
        if path.suffix == ".tsv":
            tables[path] = text
            continue
        if path.name.endswith(SKIP_SUFFIX):
            log.debug("%s: *%s is not a playbook; skipped", path, SKIP_SUFFIX)
            continue
        pb = parse_playbook(text, str(path))
        if pb.id in out:
            raise ConfigError(
                str(path), 1, "id", f"duplicate id {pb.id!r} (also in {out[pb.id].path})"
            )
        out[pb.id] = pb
    for pb in out.values():
        wanted = pb.restart.procedure if pb.restart else None
        if wanted is not None and getattr(out.get(wanted), "kind", None) != "procedure":
            raise ConfigError(
                pb.path,
                pb.restart.line if pb.restart else None,
                "restart.procedure",
                f"no procedure playbook {wanted!r} in {root}",
            )
    from orchestrator.playbooks.vocab import attach, parse_table

    books = sorted(out.values(), key=lambda p: p.id)
    if not vocab:
        return books
    return attach(books, [parse_table(text, str(p)) for p, text in tables.items()])


def _text(path: Path, data: bytes) -> str:
    """``data`` read from ``path`` as UTF-8 text (ConfigError naming the file when it is not)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), None, "", f"not UTF-8 text: {exc}") from None


def get_playbook(playbooks: Sequence[Playbook], pid: str) -> Playbook:
    """The playbook called ``pid``; UsageError naming the near ones when unknown."""
    from orchestrator.errors import UsageError

    for pb in playbooks:
        if pb.id == pid:
            return pb
    near = difflib.get_close_matches(pid, [p.id for p in playbooks], n=3)
    hint = f"; did you mean {', '.join(near)}?" if near else "; see: orch playbook list"
    raise UsageError(f"no playbook {pid!r}{hint}")


def for_exit_code(code: int, playbooks: Sequence[Playbook]) -> Playbook | None:
    """The highest-priority signature playbook listing ``code`` in ``match.exit_codes``."""
    found = [p for p in playbooks if p.kind == "signature" and code in p.exit_codes]
    return max(found, key=lambda p: p.priority) if found else None


# --- text output ---------------------------------------------------------------------------------


def format_matches(matches: Sequence[Match], playbooks: Sequence[Playbook], path: str) -> str:
    """Human text for ``orch diagnose``: each match with its confidence, evidence, next check
    and remedy.

    >>> pbs = load_playbooks()
    >>> print(format_matches(match_log(["x", "Killed"], pbs), pbs, "t.log").splitlines()[0])
    1. sigkill [critical, probable]: Killed by SIGKILL (signal 9), cause unknown
    """
    if not matches:
        return f"{path}: no known failure signature matched"
    by_id = {p.id: p for p in playbooks}
    parts = []
    for rank, m in enumerate(matches, 1):
        pb = by_id.get(m.id)
        more = f" ({m.count} lines)" if m.count > 1 else ""
        lines = [
            f"{rank}. {m.id} [{m.severity}, {m.confidence}]: {m.title}",
            f"   {path}:{m.lineno}{more}: {m.line.strip()[:300]}",
        ]
        if pb is not None:
            lines.append("   " + " ".join(pb.diagnosis.split())[:400])
        if m.confirm:
            lines.append(f"   confirm: {' '.join(m.confirm.split())}")
        lines += [f"   - {r}" for r in m.remedy]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)
