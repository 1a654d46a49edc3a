"""Playbooks: failure signatures (log regexes, finding kinds, exit codes -> diagnosis, remedy)
and procedures (ordered steps), loaded from ``playbooks/*.yaml`` and validated.

This module loads and validates; matching a log is :mod:`orchestrator.matching` (its
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
import shlex
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config.reader import NodeReader, compose, join_key, suggest
from orchestrator.errors import ConfigError
from orchestrator.matching import (
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
from orchestrator.model import Severity

__all__ = [
    "CERTAIN", "CONFIDENCES", "MAX_LINE_CHARS", "LogMatcher", "Match", "Playbook", "Signature",
    "Step", "compile_pattern", "for_exit_code", "format_matches", "get_playbook",
    "iter_log_lines", "literal_needles", "load_playbooks", "match_log", "parse_playbook",
]  # fmt: skip

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
MAX_STACK_WINDOW = 200
"""A stack signature spans at most this many lines (its ``within:``): memory stays bounded."""
DEFAULT_STACK_WINDOW = 40

_TOP_KEYS = {
    "id", "title", "kind", "severity", "priority", "confidence", "confirm", "match",
    "diagnosis", "remedy", "references", "steps",
}  # fmt: skip
_MATCH_KEYS = {"log", "findings", "exit_codes"}
_SIGNATURE_KEYS = {"regex", "stack", "within", "confidence", "confirm"}
_STEP_KEYS = {
    "name", "run", "argv", "action", "path", "overwrites", "foreach", "env", "timeout_s", "note",
}  # fmt: skip
_ID_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


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


def _fields(
    r: NodeReader, node: yaml.Node, key: str, allowed: set[str]
) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    """A mapping's (key node, value node) by name; an unknown key names the nearest allowed one."""
    out = {}
    for name, knode, vnode in r.mapping(node, key):
        if name not in allowed:
            raise r.fail(
                knode,
                join_key(key, name),
                f"unknown key{suggest(name, sorted(allowed), 'allowed')}",
            )
        out[name] = (knode, vnode)
    return out


def _text(
    r: NodeReader,
    fields: dict[str, tuple[yaml.Node, yaml.Node]],
    name: str,
    parent: yaml.Node,
    key: str,
    *,
    required: bool = True,
) -> str | None:
    """The non-empty string at ``name`` (``None`` when absent and not required)."""
    at = join_key(key, name)
    if name not in fields or r.is_null(fields[name][1]):
        if required:
            raise r.fail(parent, at, "missing (required)")
        return None
    value = r.text(fields[name][1], at, "a non-empty string")
    if not value.strip():
        raise r.fail(fields[name][1], at, "must be a non-empty string")
    return value


def _items(r: NodeReader, node: yaml.Node | None, key: str, what: str) -> list[yaml.Node]:
    """The item nodes of a list (absent or null: no items)."""
    if node is None or r.is_null(node):
        return []
    if not isinstance(node, yaml.SequenceNode):
        raise r.fail(node, key, f"must be a list of {what}")
    return list(node.value)


def _strings(r: NodeReader, node: yaml.Node | None, key: str) -> list[str]:
    return [r.text(n, f"{key}[{i}]", "a string") for i, n in enumerate(_items(r, node, key, "str"))]


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
        f = _fields(r, node, key, _SIGNATURE_KEYS)
        if ("regex" in f) == ("stack" in f):
            raise r.fail(node, key, "needs exactly one of regex, stack")
        if "regex" in f:
            patterns, within = [r.text(f["regex"][1], f"{key}.regex", "a regular expression")], 1
            if "within" in f:
                raise r.fail(f["within"][0], f"{key}.within", "only a stack takes within:")
        else:
            patterns = _strings(r, f["stack"][1], f"{key}.stack")
            if len(patterns) < 2:
                raise r.fail(f["stack"][1], f"{key}.stack", "a stack needs at least 2 regexes")
            within = DEFAULT_STACK_WINDOW
            if "within" in f:
                within = r.integer(
                    f["within"][1], f"{key}.within", len(patterns), MAX_STACK_WINDOW,
                    f"a number of lines from {len(patterns)} to {MAX_STACK_WINDOW}",
                )  # fmt: skip
        if "confidence" in f:
            confidence = _confidence(r, f["confidence"][1], f"{key}.confidence")
        confirm = _text(r, f, "confirm", node, key, required=False) or ""
    for i, pattern in enumerate(patterns):
        try:
            compile_pattern(pattern)
        except re.error as exc:
            where = key if len(patterns) == 1 else f"{key}.stack[{i}]"
            raise r.fail(node, where, f"bad regex: {exc}") from None
    return Signature.build(patterns, confidence=confidence, confirm=confirm, within=within)


def _check_placeholders(r: NodeReader, node: yaml.Node, key: str, text: str) -> None:
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as exc:
        raise r.fail(node, key, f"bad placeholder: {exc}") from None
    for name in names:
        if name not in PLACEHOLDERS:
            raise r.fail(
                node, key, f"unknown placeholder {{{name}}}; known: {', '.join(PLACEHOLDERS)}"
            )


def _step(r: NodeReader, node: yaml.Node, key: str) -> Step:
    if not isinstance(node, yaml.MappingNode):
        raise r.fail(node, key, "a step must be a mapping")
    f = _fields(r, node, key, _STEP_KEYS)
    name = _text(r, f, "name", node, key)
    forms = [k for k in ("run", "argv", "action") if k in f]
    if len(forms) != 1:
        raise r.fail(node, key, "needs exactly one of run, argv, action")
    argv: tuple[str, ...] | None = None
    action = None
    if "run" in f:
        run = _text(r, f, "run", node, key)
        assert run is not None
        _check_placeholders(r, f["run"][1], f"{key}.run", run)
        try:
            argv = tuple(shlex.split(run))
        except ValueError as exc:
            raise r.fail(f["run"][1], f"{key}.run", f"cannot split into argv: {exc}") from None
    elif "argv" in f:
        items = _items(r, f["argv"][1], f"{key}.argv", "str")
        if not items:
            raise r.fail(f["argv"][1], f"{key}.argv", "must not be empty")
        words = [r.text(n, f"{key}.argv[{i}]", "a string") for i, n in enumerate(items)]
        for i, (n, word) in enumerate(zip(items, words, strict=True)):
            _check_placeholders(r, n, f"{key}.argv[{i}]", word)
        argv = tuple(words)
    else:
        action = r.text(f["action"][1], f"{key}.action", "an action name")
        if action not in ACTIONS:
            raise r.fail(
                f["action"][1], f"{key}.action",
                f"unknown action {action!r}; known: {', '.join(ACTIONS)}",
            )  # fmt: skip
    path = _text(r, f, "path", node, key, required=False)
    if (action == "archive") != (path is not None):
        raise r.fail(
            f["path"][1] if "path" in f else node,
            f"{key}.path",
            "the archive action needs path:, and only it takes one",
        )
    overwrites = _text(r, f, "overwrites", node, key, required=False)
    if overwrites is not None and argv is None:
        raise r.fail(
            f["overwrites"][1], f"{key}.overwrites", "only run/argv steps take overwrites:"
        )
    for k, value in (("path", path), ("overwrites", overwrites)):
        if value is not None:
            _check_placeholders(r, f[k][1], f"{key}.{k}", value)
    foreach = _text(r, f, "foreach", node, key, required=False)
    if foreach is not None and foreach != "gpu":
        raise r.fail(f["foreach"][1], f"{key}.foreach", "only 'gpu' is supported")
    env: dict[str, str] = {}
    if "env" in f:
        env_node = f["env"][1]
        if not isinstance(env_node, yaml.MappingNode) and not r.is_null(env_node):
            raise r.fail(env_node, f"{key}.env", "must be a mapping of NAME: value")
        for name_, _k, vnode in r.mapping(env_node, f"{key}.env"):
            value = r.text(vnode, f"{key}.env.{name_}", "a string or number")
            _check_placeholders(r, vnode, f"{key}.env.{name_}", value)
            env[name_] = value
    timeout = 600.0
    if "timeout_s" in f:
        timeout = r.number(
            f["timeout_s"][1], f"{key}.timeout_s", 0.0, None, "a number of seconds > 0"
        )
        if timeout <= 0:
            raise r.fail(f["timeout_s"][1], f"{key}.timeout_s", "must be a number of seconds > 0")
    return Step(
        name=name or "",
        argv=argv,
        action=action,
        path=path,
        overwrites=overwrites,
        foreach=foreach,
        env=env,
        timeout_s=timeout,
        note=_text(r, f, "note", node, key, required=False),
    )


def parse_playbook(text: str, path: str) -> Playbook:
    """Validate one playbook document; raises ConfigError(file, line, key, problem)."""
    root = compose(path, text)
    r = NodeReader(path, Path(path).parent)
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(path, 1, "", "a playbook must be a YAML mapping")
    f = _fields(r, root, "", _TOP_KEYS)
    pid = _text(r, f, "id", root, "")
    assert pid is not None
    if not _ID_RE.match(pid):
        raise r.fail(f["id"][1], "id", "must be kebab-case (a-z, 0-9, '-')")
    title = _text(r, f, "title", root, "")
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
    confirm = _text(r, f, "confirm", root, "", required=False) or ""
    diagnosis = _text(r, f, "diagnosis", root, "")
    remedy = _strings(r, f["remedy"][1] if "remedy" in f else None, "remedy")
    references = _strings(r, f["references"][1] if "references" in f else None, "references")
    for i, ref in enumerate(references):
        if not ref.startswith(("http://", "https://")):
            raise r.fail(f["references"][1].value[i], f"references[{i}]", "must be a URL")
    mf = _fields(r, f["match"][1], "match", _MATCH_KEYS) if "match" in f else {}
    log_items = _items(r, mf["log"][1] if "log" in mf else None, "match.log", "regexes")
    signatures = tuple(
        _signature(r, n, f"match.log[{i}]", confidence) for i, n in enumerate(log_items)
    )
    findings = _strings(r, mf["findings"][1] if "findings" in mf else None, "match.findings")
    exit_codes = [
        r.integer(n, f"match.exit_codes[{i}]", 0, 255, "an exit status 0-255")
        for i, n in enumerate(
            _items(
                r, mf["exit_codes"][1] if "exit_codes" in mf else None, "match.exit_codes", "int"
            )
        )
    ]
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
        raw = _items(r, f["steps"][1] if "steps" in f else None, "steps", "steps")
        if not raw:
            raise r.fail(
                f["steps"][1] if "steps" in f else root,
                "steps",
                "missing (required): a procedure needs a list of steps",
            )
        steps = [_step(r, n, f"steps[{i}]") for i, n in enumerate(raw)]
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
