"""The shipped Prometheus alerting rules pass promtool's checker and their unit tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

pytestmark = pytest.mark.skipif(
    not Path(PROMTOOL).exists(), reason="promtool not installed (apt: prometheus)"
)


def test_promtool_check_rules():
    proc = subprocess.run(
        [PROMTOOL, "check", "rules", str(ROOT / "playbooks" / "prometheus-rules.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 7 rules found" in proc.stdout


def test_promtool_test_rules():
    proc = subprocess.run(
        [PROMTOOL, "test", "rules", "rules_test.yaml"],
        cwd=ROOT / "tests" / "views",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_catches_a_wrong_expectation(tmp_path):
    """The unit tests can fail: the same file with one expected label changed must not pass."""
    text = (ROOT / "tests" / "views" / "rules_test.yaml").read_text()
    bad = tmp_path / "bad_test.yaml"
    bad.write_text(
        text.replace(
            "../../playbooks/prometheus-rules.yaml",
            str(ROOT / "playbooks" / "prometheus-rules.yaml"),
        ).replace('summary: "lxc200: xid"', 'summary: "lxc200: something else"')
    )
    proc = subprocess.run(
        [PROMTOOL, "test", "rules", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0
