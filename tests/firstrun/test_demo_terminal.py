"""What ``orch demo`` says on a terminal: its prompt, and how it ends (no sandbox needed).

The console is rich's own, forced to be a terminal; only the keyboard is a stand-in
(``input()``, which ``rich.console.Console.input`` calls to read the answer line).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.firstrun.demo import DemoResult
from orchestrator.views.demo import RichDemoUI


def _ui() -> tuple[RichDemoUI, io.StringIO]:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, color_system=None, width=100)
    return RichDemoUI(console, interactive=True), buf


@pytest.mark.parametrize(
    ("typed", "default", "want"),
    [
        ("", True, True),
        ("n", True, False),
        ("y", False, True),
        ("", False, False),
    ],
)
def test_the_prompt_shows_its_choices_and_enter_takes_the_default(
    monkeypatch: pytest.MonkeyPatch, typed: str, default: bool, want: bool
) -> None:
    """rich reads a bare ``[y/N]`` as markup and prints nothing of it: the choices are shown,
    the default one in capitals, and Enter answers it (the fault question defaults to yes)."""
    ui, buf = _ui()
    monkeypatch.setattr("builtins.input", lambda *a: typed)
    assert ui.ask("Inject the fault now?", default=default) is want
    shown = "[Y/n]" if default else "[y/N]"
    assert buf.getvalue() == f"Inject the fault now? {shown} "


def test_the_demo_ends_with_the_report_path_and_three_next_commands(tmp_path: Path) -> None:
    ui, buf = _ui()
    report = tmp_path / "postmortem" / "report.html"
    ui.done(
        DemoResult(
            state_dir=tmp_path,
            config_path=tmp_path / "hosts.yaml",
            report_html=report,
            elapsed_s=31.0,
        )
    )
    lines = buf.getvalue().rstrip("\n").splitlines()
    assert f"HTML report: {report}" in lines
    assert lines[-4] == "Next, try:"
    assert [line.split()[:2] for line in lines[-3:]] == [
        ["orch", "demo"],
        ["orch", "init"],
        ["orch", "doctor"],
    ]
