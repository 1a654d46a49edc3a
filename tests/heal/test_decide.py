"""The restart decision as table cases: every ``tests/heal/cases/<action>/<case>.json`` is one.

A case holds the policy (as hosts.yaml spells it, read by the real config reader), each node's
judgement (state word, newest snapshot, findings), the postmortem's diagnosis (or null), the
unit's journal, ``now`` and whether another process holds the unit's restart lock; ``expect``
names the action (the folder) and any of ``note``, ``procedure``, ``attempt``, ``cause``,
``trigger``, ``due_at``, ``reason_contains``, ``remedy`` (non-empty) and ``record`` (whether
it is journaled, with :func:`should_record`). The rules are the bundled playbooks'.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.config.inventory import parse_inventory
from orchestrator.heal.decide import (
    Diagnosis,
    NodeView,
    close_orphan_claim,
    decide,
    interrupted,
    should_record,
)
from orchestrator.heal.healer import restart_rules
from orchestrator.monitor.journal import JournalEntry
from orchestrator.playbooks.loader import load_playbooks
from orchestrator.wire.model import Finding, Snapshot

HERE = Path(__file__).parent / "cases"
CASES = sorted(HERE.glob("*/*.json"))
RULES = restart_rules(load_playbooks())


def _policy(spec: dict):  # type: ignore[no-untyped-def]
    doc = {"containers": {"u": {"host": "local", "restart": spec}}}
    return parse_inventory(yaml.safe_dump(doc), "case.yaml").containers["u"].restart


def _decide(case: dict):  # type: ignore[no-untyped-def]
    nodes = [
        NodeView(
            n["name"],
            n["state"],
            Snapshot.from_dict(n["snapshot"]),
            tuple(Finding.from_dict(f) for f in n.get("findings", [])),
            gpus=tuple(n.get("gpus", (0, 1))),
        )
        for n in case["nodes"]
    ]
    diag = case.get("diagnosis")
    journal = [JournalEntry.from_dict(e) for e in case.get("journal", [])]
    d = decide(
        "ct200",
        nodes,
        Diagnosis(**{**diag, "remedy": tuple(diag.get("remedy", ()))}) if diag else None,
        _policy(case["policy"]),
        journal,
        case["now"],
        rules=RULES,
        claim_alive=case.get("claim_alive", False),
    )
    return d, journal


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_case(path: Path) -> None:
    case = json.loads(path.read_text())
    d, journal = _decide(case)
    want = case["expect"]
    assert want["action"] == path.parent.name, "a case lives in its action's folder"
    assert d.action == want["action"], (
        f"{case['description']}\n  got {d.action} ({d.note}): {d.reason}"
    )
    for key in ("note", "procedure", "attempt", "cause", "trigger", "due_at"):
        if key in want:
            assert getattr(d, key) == want[key], f"{key}: {getattr(d, key)!r} ({d.reason})"
    if "reason_contains" in want:
        assert want["reason_contains"] in d.reason, d.reason
    if want.get("remedy"):
        assert d.remedy, "a page carries the remedy"
    if "record" in want:
        assert should_record(d, journal) is want["record"], d
    if d.action in ("give-up", "restart", "wait"):
        assert d.evidence, "a decision about a death carries its evidence"


def test_every_action_has_cases() -> None:
    assert {p.parent.name for p in CASES} == {"none", "wait", "restart", "give-up"}


def test_a_claim_whose_claimer_died_counts_and_the_next_waits_its_backoff() -> None:
    """Killed mid-restart: the next supervisor records ``interrupted`` (the claim still counts:
    no extra restart is granted) and the second attempt waits backoff[1] from then."""
    case = json.loads((HERE / "restart" / "unknown_cause_retry_unknown.json").read_text())
    claim = JournalEntry(
        "ct200",
        case["now"],
        "restart",
        "r",
        run_id=case["nodes"][0]["snapshot"]["run"]["run_id"],
        note="restart",
        attempt=1,
        procedure="relaunch",
        by="orch supervise pid 1 on a",
    )
    later = case["now"] + 5
    closing = close_orphan_claim(
        "ct200", [claim], claim.run_id, claim_alive=False, now=later, by="b"
    )
    assert closing is None, "the dead run is still current: nothing was started"
    gone = interrupted("ct200", claim, later, "b")
    case["journal"] += [claim.to_dict(), gone.to_dict()]
    case["now"] = later + 1
    d, _ = _decide(case)
    assert (d.action, d.attempt, d.due_at) == ("wait", 2, later + 300), d
    case["now"] = later + 301
    d, _ = _decide(case)
    assert (d.action, d.attempt) == ("restart", 2)
    case["policy"]["max"] = 1
    assert _decide(case)[0].note == "budget"
