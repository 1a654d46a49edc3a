"""``orch doctor`` on a host whose journal is volatile (the sandbox's journalctl in its
systemd 252 mode): a warning saying the previous boot's kernel log is not kept, naming the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.mark.e2e
def test_a_volatile_journal_is_a_warning_naming_the_fix(sandbox: Any) -> None:
    from orchestrator.firstrun.doctor import run_doctor
    from orchestrator.sandbox import kernel

    def journal(checks: list[Any]) -> Any:
        return next((c for c in checks if c.name == "journal on sandbox"), None)

    assert journal(run_doctor(Path(sandbox.config_path), "ct200")) is None  # persistent: silent
    kernel.set_volatile_journal(sandbox.state_dir)
    try:
        check = journal(run_doctor(Path(sandbox.config_path), "ct200"))
    finally:
        kernel.set_volatile_journal(sandbox.state_dir, on=False)
    assert check is not None and check.status == "warn", check
    assert "previous boot's kernel log is not kept on this host" in check.detail
    assert "Storage=persistent" in (check.fix or "") and "/etc/systemd/journald.conf" in check.fix
