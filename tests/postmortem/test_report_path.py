"""``orch postmortem`` on a terminal ends with the path of the bundle's report.html."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.console import Console

from orchestrator.postmortem.evidence import Evidence
from orchestrator.postmortem.verdict import judge
from orchestrator.views.postmortem import print_verdict


def test_the_verdict_names_the_report_html_of_its_bundle(tmp_path: Path) -> None:
    (tmp_path / "report.html").write_text("<html></html>")
    pm = dataclasses.replace(
        judge(Evidence(target="ct200", collected_at=1_700_000_000.0)), bundle=str(tmp_path)
    )
    console = Console(record=True, width=80, color_system=None)
    print_verdict(console, pm)
    lines = console.export_text().splitlines()
    assert lines[-2:] == [f"bundle: {tmp_path}", f"report: {tmp_path / 'report.html'}"]


def test_no_report_line_when_the_bundle_has_none(tmp_path: Path) -> None:
    pm = dataclasses.replace(
        judge(Evidence(target="ct200", collected_at=1_700_000_000.0)), bundle=str(tmp_path)
    )
    console = Console(record=True, width=80, color_system=None)
    print_verdict(console, pm)
    assert "report:" not in console.export_text()
