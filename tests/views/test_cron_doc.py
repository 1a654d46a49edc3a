"""docs/cron.md works as written: its crontab line runs a check, its systemd units verify."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "cron.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", DOC, re.S)


def block(lang: str, contains: str) -> str:
    return next(body for kind, body in BLOCKS if kind == lang and contains in body)


@pytest.mark.e2e
def test_crontab_line_runs_a_check_and_alerts(fleet, tmp_path, webhook):
    lines = block("crontab", "check").splitlines()
    env = dict(line.split("=", 1) for line in lines if re.match(r"^[A-Z_]+=", line))
    [entry] = [line for line in lines if re.match(r"^[*\d]", line)]
    fields = entry.split(None, 5)
    assert fields[:5] == ["*/5", "*", "*", "*", "*"]
    home = tmp_path / "home"
    (home / ".local" / "state" / "orch").mkdir(parents=True)
    command = (
        fields[5]
        .replace("/home/ops/orch/.venv/bin/orch", f"{sys.executable} -m orchestrator.cli")
        .replace("/home/ops/.config/orch/hosts.yaml", fleet.config)
        .replace("/home/ops", str(home))
    )
    assert env["ORCH_WEBHOOK"].startswith("https://")
    fleet.scenario("ghost")
    try:
        cron_env = {
            "HOME": str(home),
            "PATH": "/usr/bin:/bin",
            "SHELL": "/bin/sh",
            "ORCH_WEBHOOK": webhook.url,
            "PYTHONPATH": str(ROOT),
        }
        rcs = [
            subprocess.run(
                ["/bin/sh", "-c", command], env=cron_env, cwd=home, timeout=120
            ).returncode
            for _ in range(2)
        ]
    finally:
        fleet.scenario("healthy")
    log = (home / ".local" / "state" / "orch" / "check.log").read_text()
    assert rcs[-1] == 2 and log.count("ORCH ") == 2, log
    assert len(webhook.bodies) == 1  # $ORCH_WEBHOOK was used
    db = home / ".local" / "state" / "orch" / "orch.db"
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_systemd_units_verify(tmp_path):
    """As written, with orch where README.md's ``./dev`` puts it (a clone in ``~/orch``): the
    ExecStart path is not edited, only made to exist under this test's $HOME."""
    service = block("ini", "[Service]")
    timer = block("ini", "[Timer]")
    venv_bin = tmp_path / "orch" / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "orch").symlink_to(shutil.which("orch") or sys.executable)
    (tmp_path / "orch-check.service").write_text(service)
    (tmp_path / "orch-check.timer").write_text(timer)
    (tmp_path / ".config" / "orch").mkdir(parents=True)
    (tmp_path / ".config" / "orch" / "check.env").write_text(block("ini", "ORCH_WEBHOOK="))
    proc = subprocess.run(
        [
            "systemd-analyze",
            "verify",
            "--man=no",
            str(tmp_path / "orch-check.service"),
            str(tmp_path / "orch-check.timer"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert not re.search(r"Failed to parse|Unknown (key|section)|not executable|Invalid", out), out
    assert "OnUnitActiveSec=5min" in timer and "SuccessExitStatus=1 2 3" in service
    # After= alone orders nothing: systemd.special(7) asks for Wants= with network-online.target
    for doc in (DOC, (ROOT / "docs" / "self-healing.md").read_text()):
        assert doc.count("Wants=network-online.target") == doc.count("After=network-online.target")
