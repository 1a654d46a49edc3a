"""Vocabularies: published error names and texts, as data tables, turned into signatures.

A table is ``playbooks/vocab/*.tsv``: ``# key: value`` header lines, then one entry a line,
tab-separated ``code name playbook confidence alone text``. The header says where the table
was read from (``# source:``, required) and how an entry shows in a log (``# form:`` lines,
regexes where ``{text}``, ``{name}``, ``{code}``, ``{neg}`` (-code) and ``{status}``
(128 + code) stand for the entry's fields, escaped; ``# form-alone:`` applies only to rows
whose ``alone`` is ``yes``: texts distinctive enough to name the failure by themselves).
Each entry adds one signature per form to its playbook, with the entry's confidence.

:func:`parse_table` is pure; :func:`attach` returns playbooks with the signatures added.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.playbooks.matching import CONFIDENCES, Signature

VOCAB_DIR = "vocab"
"""The vocabularies' folder inside a playbook directory (playbooks/vocab/ bundled)."""
COLUMNS = ("code", "name", "playbook", "confidence", "alone", "text")
_FIELD = re.compile(r"\{(text|name|code|neg|status)\}")
_HEADER = re.compile(r"^# ([\w-]+): (.*)$")


@dataclass(frozen=True, slots=True)
class Entry:
    """One row: ``code`` (``None`` when the vocabulary has none), its ``lineno`` in the table."""

    code: int | None
    name: str
    playbook: str
    confidence: str
    alone: bool
    text: str
    lineno: int


@dataclass(frozen=True, slots=True)
class Table:
    """A parsed vocabulary: its ``source`` text, forms, entries and file."""

    path: str
    source: str
    forms: tuple[str, ...]
    alone_forms: tuple[str, ...]
    entries: tuple[Entry, ...]

    def patterns(self, e: Entry) -> list[str]:
        r"""The regexes that find ``e`` in a log, one per applicable form.

        >>> t = parse_table("# source: x\n# form: \\(exitcode: {neg}\\)\n# form-alone: ^{text}$\n"
        ...                 "11\tSIGSEGV\tsegfault\tcertain\tyes\tSegmentation fault\n", "s.tsv")
        >>> t.patterns(t.entries[0])
        ['\\(exitcode: \\-11\\)', '^Segmentation\\ fault$']
        """
        values = {"text": e.text, "name": e.name}
        if e.code is not None:
            values |= {"code": str(e.code), "neg": str(-e.code), "status": str(128 + e.code)}
        out = []
        for form in self.forms + (self.alone_forms if e.alone else ()):
            names = set(_FIELD.findall(form))
            if any(n not in values or values[n] == "-" for n in names):
                continue  # the form needs a field this entry has not (a code, a text)
            out.append(_FIELD.sub(lambda m: re.escape(values[m.group(1)]), form))
        return out


def parse_table(text: str, path: str) -> Table:
    """Parse one table; raises ConfigError(path, line, field, problem) on a malformed row."""
    source = ""
    forms: list[str] = []
    alone: list[str] = []
    entries: list[Entry] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            m = _HEADER.match(line)
            if m and m.group(1) == "source":
                source = m.group(2)
            elif m and m.group(1) in ("form", "form-alone"):
                try:
                    re.compile(_FIELD.sub("x", m.group(2)))
                except re.error as exc:
                    raise ConfigError(path, n, m.group(1), f"bad regex: {exc}") from None
                (forms if m.group(1) == "form" else alone).append(m.group(2))
            continue
        cells = line.split("\t")
        if len(cells) != len(COLUMNS):
            raise ConfigError(
                path,
                n,
                "",
                f"{len(cells)} tab-separated fields, want {len(COLUMNS)}: {' '.join(COLUMNS)}",
            )
        code, name, playbook, confidence, is_alone, entry_text = cells
        if code != "-" and not code.isdigit():
            raise ConfigError(path, n, "code", f"{code!r} is not a number or '-'")
        if confidence not in CONFIDENCES:
            raise ConfigError(path, n, "confidence", f"must be one of {', '.join(CONFIDENCES)}")
        if is_alone not in ("yes", "no"):
            raise ConfigError(path, n, "alone", "must be yes or no")
        entries.append(
            Entry(
                None if code == "-" else int(code),
                name,
                playbook,
                confidence,
                is_alone == "yes",
                entry_text,
                n,
            )
        )
    if not source:
        raise ConfigError(path, 1, "source", "missing (a table says where it was read from)")
    if not forms and not alone:
        raise ConfigError(path, 1, "form", "missing (how an entry shows in a log)")
    return Table(path, source, tuple(forms), tuple(alone), tuple(entries))


def load_tables(root: Path) -> list[Table]:
    """Every ``*.tsv`` under ``root`` (none when the folder is absent), sorted by name."""
    if not root.is_dir():
        return []
    return [parse_table(p.read_text(encoding="utf-8"), str(p)) for p in sorted(root.glob("*.tsv"))]


def attach(playbooks: Sequence[Any], tables: Sequence[Table]) -> list[Any]:
    """``playbooks`` (loader.Playbook: a frozen dataclass with ``id`` and ``signatures``) with each table entry's signatures appended to the playbook it names.

    Raises ConfigError naming the table's line when an entry names no playbook there.
    """
    by_id = {p.id: p for p in playbooks}
    extra: dict[str, list[Signature]] = {}
    for t in tables:
        for e in t.entries:
            if e.playbook not in by_id:
                raise ConfigError(t.path, e.lineno, "playbook", f"no playbook {e.playbook!r}")
            extra.setdefault(e.playbook, []).extend(
                Signature.build([p], confidence=e.confidence) for p in t.patterns(e)
            )
    out = []
    for p in playbooks:
        sigs = extra.get(p.id)
        out.append(replace(p, signatures=(*p.signatures, *sigs)) if sigs else p)
    return out
