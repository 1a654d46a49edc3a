"""The retryable table of docs/self-healing.md, generated from the playbooks' ``restart:``
(``python -m orchestrator.heal.docs`` prints it, ``--write`` puts it into the page;
tests/heal/test_docs.py fails when the committed page drifts from the playbooks)."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.playbooks.loader import DEFAULT_RESTART_PROCEDURE, Playbook

BEGIN = "<!-- BEGIN retryable table: python -m orchestrator.heal.docs -->"
END = "<!-- END retryable table -->"
POLICY_BEGIN = "<!-- BEGIN policy table: python -m orchestrator.heal.docs -->"
POLICY_END = "<!-- END policy table -->"


def policy_table() -> str:
    """The ``restart:`` keys (the same rows as docs/hosts-yaml.md's section)."""
    from orchestrator.config.restart import RESTART_KEYS

    rows = [POLICY_BEGIN, "| key | type | default | meaning |", "|---|---|---|---|"]
    rows += [
        f"| `{k.key}` | {k.type_doc} | {k.default_doc} | {k.doc.replace('|', chr(92) + '|')} |"
        for k in RESTART_KEYS
    ]
    return "\n".join([*rows, POLICY_END]) + "\n"


def retryable_table(playbooks: Sequence[Playbook]) -> str:
    """One row per signature playbook: retryable or not, the procedure, why (Markdown)."""
    rows = [
        BEGIN,
        "| playbook | retryable | restarted with | why |",
        "|---|---|---|---|",
    ]
    for p in sorted((p for p in playbooks if p.kind == "signature"), key=lambda p: p.id):
        r = p.restart
        if r is None:
            rows.append(f"| `{p.id}` | no (not declared) | - | the playbook says nothing: paged |")
            continue
        proc = f"`{r.procedure or DEFAULT_RESTART_PROCEDURE}`" if r.retryable else "-"
        why = " ".join(r.why.split()).replace("|", "\\|")
        rows.append(f"| `{p.id}` | {'**yes**' if r.retryable else 'no'} | {proc} | {why} |")
    rows.append(END)
    return "\n".join(rows) + "\n"


def spliced(text: str, table: str, begin: str, end: str) -> str:
    """``text`` with the block from ``begin`` to ``end`` (inclusive) replaced by ``table``.

    >>> spliced("a\\n<b>\\nold\\n<e>\\nz\\n", "<b>\\nnew\\n<e>\\n", "<b>", "<e>")
    'a\\n<b>\\nnew\\n<e>\\nz\\n'
    """
    head, found, rest = text.partition(begin)
    if not found or end not in rest:
        raise ValueError(f"no {begin} ... {end} block")
    return head + table + rest.split(end, 1)[1].removeprefix("\n")


if __name__ == "__main__":
    import sys
    from pathlib import Path

    from orchestrator.playbooks.loader import load_playbooks

    policy, retryable = policy_table(), retryable_table(load_playbooks())
    if sys.argv[1:] == ["--write"]:
        page = Path(__file__).resolve().parents[2] / "docs" / "self-healing.md"
        text = spliced(page.read_text(), policy, POLICY_BEGIN, POLICY_END)
        page.write_text(spliced(text, retryable, BEGIN, END))
        print(f"wrote {page}")
    else:
        sys.stdout.write(policy + "\n" + retryable)
