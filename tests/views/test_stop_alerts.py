"""A deliberate ``orch stop`` is no failure anywhere: check's state, export's series, the
shipped alerting rules (judged by promtool on what ``orch export`` really exports) and the
postmortem's verdict agree; a crash next to it pages.

The recorded histories are detector cases (``tests/detect/<kind>/<case>.json``); the
exporter polls them one snapshot at a time, and its final samples become promtool's input
series, held for a quarter of an hour, so every alert's ``for:`` has passed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.config.inventory import LOCAL, ContainerConfig, Inventory
from orchestrator.monitor.poller import Poller
from orchestrator.postmortem.evidence import Evidence
from orchestrator.postmortem.verdict import STOPPED, judge
from orchestrator.views import export
from orchestrator.wire.model import Severity, Snapshot

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "playbooks" / "prometheus-rules.yaml"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
STOPPED_CASE = ROOT / "tests" / "detect" / "finished" / "stopped_by_orch_stop.json"
CRASHED_CASE = ROOT / "tests" / "detect" / "crashed" / "sigkill_137.json"
ALERTS = [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def _polled(path: Path, name: str) -> tuple[Poller, list[Snapshot]]:
    """The exporter's poller after every snapshot of ``path``'s case, as target ``name``."""
    case = json.loads(path.read_text())
    snaps = [Snapshot.from_dict({**s, "target": name}) for s in case["snapshots"]]
    cfg = ContainerConfig(name=name, host=LOCAL)
    inventory = Inventory(path=None, hosts={}, containers={name: cfg})
    feed = iter(snaps)
    poller = Poller(inventory, [name], fetch=lambda n: next(feed))
    for _ in snaps:
        poller.poll_once()
    return poller, snaps


def _series(poller: Poller) -> list[dict[str, str]]:
    """Every exported sample as a promtool input series, held 15 minutes at 30 s steps."""
    out = []
    for fam in export.families(poller.latest()):
        for s in fam.samples:
            labels = ", ".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out.append({"series": f"{s.name}{{{labels}}}", "values": f"{s.value:g}x30"})
    return out


def _promtool(tmp_path: Path, series: list[dict[str, str]], expected: dict[str, list]) -> str:
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": "30s",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "15m", "alertname": a, "exp_alerts": expected.get(a, [])}
                    for a in ALERTS
                ],
            }
        ],
    }
    path = tmp_path / "exported_test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    proc = subprocess.run(
        [PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


needs_promtool = pytest.mark.skipif(
    not Path(PROMTOOL).exists(), reason="promtool not installed (apt: prometheus)"
)


def test_export_says_the_stop_was_requested() -> None:
    stopped, _ = _polled(STOPPED_CASE, "lxc200")
    crashed, _ = _polled(CRASHED_CASE, "lxc201")
    fams = {f.name: f for f in export.families([*stopped.latest(), *crashed.latest()])}
    got = {s.labels["target"]: s.value for s in fams["orch_run_stop_requested"].samples}
    assert got == {"lxc200": 1.0, "lxc201": 0.0}
    status = {s.labels["target"]: s.value for s in fams["orch_run_exit_status"].samples}
    assert status == {"lxc200": 130.0, "lxc201": 137.0}  # the exit status is still told


def test_check_and_postmortem_agree_the_stop_is_no_failure() -> None:
    stopped, snaps = _polled(STOPPED_CASE, "lxc200")
    (j,) = stopped.latest()
    assert j.state == "stopped"
    assert all(f.severity < Severity.WARNING for f in j.findings), j.findings
    run = snaps[-1].run
    assert run is not None
    ev = Evidence(
        "lxc200",
        snaps[-1].taken_at,
        run_id=run.run_id,
        exit_status=run.exit_status,
        exit_status_at=run.exit_status_at,
        stop_requested_at=run.stop_requested_at,
        stop_requested_by=run.stop_requested_by,
        final=snaps[-1],
    )
    verdict = judge(ev).verdict
    assert (verdict.kind, verdict.severity) == (STOPPED, Severity.INFO), verdict


@needs_promtool
def test_no_alert_fires_on_what_export_says_of_a_requested_stop(tmp_path: Path) -> None:
    stopped, _ = _polled(STOPPED_CASE, "lxc200")
    out = _promtool(tmp_path, _series(stopped), {})
    assert "SUCCESS" in out


@needs_promtool
def test_a_crash_pages_from_what_export_says(tmp_path: Path) -> None:
    crashed, _ = _polled(CRASHED_CASE, "lxc201")
    who = {"target": "lxc201", "host": "local", "Hostname": "local", "container": "lxc201"}
    expected = {
        "OrchRunFailed": [
            {
                "exp_labels": {"severity": "critical", "kind": "crashed", **who},
                "exp_annotations": {"summary": "the run on lxc201 exited with status 137"},
            }
        ],
        "OrchRunDown": [
            {
                "exp_labels": {"severity": "critical", "kind": "run-down", **who},
                "exp_annotations": {
                    "summary": "the run on lxc201 is down",
                    "description": "Explain it with: orch postmortem lxc201",
                },
            }
        ],
    }
    assert "SUCCESS" in _promtool(tmp_path, _series(crashed), expected)


@needs_promtool
def test_the_oracle_can_fail(tmp_path: Path) -> None:
    """The same stopped run with the stop series left out (an older exporter) pages."""
    stopped, _ = _polled(STOPPED_CASE, "lxc200")
    series = [s for s in _series(stopped) if not s["series"].startswith("orch_run_stop_")]
    with pytest.raises(AssertionError, match="OrchRunFailed"):
        _promtool(tmp_path, series, {})
