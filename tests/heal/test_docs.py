"""docs/self-healing.md carries the policy and retryable tables generated from the code: they
cannot drift from RESTART_KEYS and the playbooks' ``restart:``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.heal.docs import policy_table, retryable_table
from orchestrator.heal.healer import notification
from orchestrator.monitor.alerts import payload
from orchestrator.monitor.journal import JournalEntry
from orchestrator.playbooks.loader import load_playbooks

DOC = Path(__file__).resolve().parents[2] / "docs" / "self-healing.md"


def test_committed_tables_match_the_code() -> None:
    text = DOC.read_text()
    for table in (policy_table(), retryable_table(load_playbooks())):
        assert table in text, "regenerate the tables: python -m orchestrator.heal.docs --write"


def test_a_page_carries_the_verdict_and_the_remedy_a_notice_does_not() -> None:
    page = JournalEntry(
        "ct201",
        10.0,
        "give-up",
        "module-not-found: not retryable",
        run_id="r1",
        cause="module-not-found",
        evidence=("verdict: log-signature: run r1 died", "exit_status: 1"),
        remedy=("Install the module.",),
    )
    notice = JournalEntry(
        "ct200",
        10.0,
        "restarted",
        "relaunch: run r3 started",
        run_id="r2",
        new_run_id="r3",
        attempt=1,
        trigger="crashed",
    )
    body = payload(
        [notification(page), notification(notice)], status="CRITICAL", source="orch supervise"
    )
    assert body["text"].splitlines() == [
        "orch supervise: CRITICAL",
        "CRITICAL ct201 give-up (module-not-found): run r1 not restarted: module-not-found: not "
        "retryable (playbook: module-not-found)",
        "  verdict: log-signature: run r1 died",
        "  remedy: Install the module.",
        "WARNING ct200 restarted (crashed): run r2 restarted as r3 (attempt 1): relaunch: run r3 "
        "started",
    ]
    assert body["notifications"][0]["remedy"] == ["Install the module."]
    assert "remedy" not in body["notifications"][1]


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_the_supervise_unit_verifies(tmp_path: Path) -> None:
    """The systemd unit of docs/self-healing.md parses, and its stop timeout outlasts --drain."""
    blocks = re.findall(r"```(\w+)\n(.*?)```", DOC.read_text(), re.S)
    unit = next(b for kind, b in blocks if kind == "ini" and "supervise" in b)
    exe = shutil.which("orch") or sys.executable
    (tmp_path / "orch-supervise.service").write_text(unit.replace("%h/orch/.venv/bin/orch", exe))
    (tmp_path / ".config" / "orch").mkdir(parents=True)
    (tmp_path / ".config" / "orch" / "check.env").write_text("ORCH_WEBHOOK=https://x.invalid/\n")
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(tmp_path / "orch-supervise.service")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert not re.search(r"Failed to parse|Unknown (key|section)|not executable|Invalid", out), out
    stop_s = int(re.search(r"TimeoutStopSec=(\d+)", unit).group(1))  # type: ignore[union-attr]
    assert stop_s > 120, "systemd must wait longer than supervise's default --drain (120 s)"
