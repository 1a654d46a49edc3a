"""Text from a container reaches no terminal as a control: escapes in run ids, process names,
log lines, tee.err and commands go through every renderer (check, watch and --plain, status,
runs, the postmortem on the terminal, report.md, report.html, --json) and no ESC byte, C1
control or bidi override comes out; rich markup in remote text is text."""

from __future__ import annotations

import dataclasses
import io
import json
import re

import pytest
from rich.console import Console

from orchestrator.monitor.judge import Judgement
from orchestrator.monitor.sweep import CRITICAL, CheckReport
from orchestrator.postmortem.verdict import judge
from orchestrator.views import check, watch, watch_model
from orchestrator.views import launch as launch_view
from orchestrator.views import postmortem as pm_view
from orchestrator.wire.answers import RunsAnswer, RunStatus
from orchestrator.wire.model import Finding, ProcessInfo, Severity
from orchestrator.wire.text import fence, visible
from tests.postmortem.test_verdict import T0, _evidence
from tests.views.snapshots import running

EVIL = "\x1b]0;pwned\x07\x1b]52;c;ZXZpbA==\x07\x1b[2J\x9b31m\u202eevil[/]\x1b[0m"
"""A title change, OSC 52 to the clipboard, a cleared screen, a C1 CSI, a bidi override,
and rich's closing tag."""
BAD = ("\x1b", "\x07", "\x9b", "\u202e")


def _clean(text: str) -> None:
    for c in BAD:
        assert c not in text, f"{c!r} reached the output: {text!r:.300}"


def _console() -> Console:
    return Console(file=io.StringIO(), width=200, color_system=None, force_terminal=False)


def _out(console: Console) -> str:
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_visible_shows_every_control_and_keeps_plain_text() -> None:
    shown = visible(EVIL)
    _clean(shown)
    assert "␛]0;pwned␇" in shown and "\\x9b31m" in shown and "\\u202e" in shown
    assert visible("step=1 [a,b] ünïcode") == "step=1 [a,b] ünïcode"
    assert len(visible(EVIL, same_length=True)) == len(EVIL)


def test_check_lines_show_escapes_in_names_and_summaries() -> None:
    f = Finding("ghost-utilization", Severity.CRITICAL, "ct200", f"held by {EVIL}", gpus=(3,))
    r = Judgement("ct200", running(), "running", (f,))
    out = "\n".join(check.lines(CheckReport(CRITICAL, (r,))))
    _clean(out)
    assert "held by ␛]0;pwned" in out


def _evil_snapshot():  # type: ignore[no-untyped-def]
    snap = running()
    run = dataclasses.replace(snap.run, run_id=f"r1{EVIL}", new_log_lines=(f"log {EVIL}",))
    procs = (ProcessInfo(pid=7, ppid=1, name=f"py{EVIL}", state="R"),)
    session = dataclasses.replace(snap.session, pane_tail=(f"pane {EVIL}",))
    return dataclasses.replace(snap, run=run, processes=procs, session=session)


def test_watch_dashboard_detail_and_plain_put_no_escape_on_the_terminal() -> None:
    def judge_fn(name, cfg, history):  # type: ignore[no-untyped-def]
        f = Finding("stall", Severity.WARNING, name, f"stalled {EVIL}", evidence=(EVIL,))
        return Judgement(name, history[-1], "stalled", (f,))

    view = watch_model.TargetView("ct200")
    model = watch_model.WatchModel([view], judge_fn)
    model.apply("ct200", _evil_snapshot())
    for renderable in (
        watch.render_dashboard(model, now=T0),
        watch.render_detail(model.views["ct200"], now=T0, height=60),
    ):
        console = Console(
            file=io.StringIO(), width=200, height=60, color_system="truecolor", force_terminal=True
        )
        console.print(renderable)
        text = _out(console)
        # rich's own styling is CSI; nothing else may be: remove the SGR sequences it writes
        rest = re.sub(r"\x1b\[[0-9;]*m", "", text)
        _clean(rest)
        assert "␛" in rest
    plain = watch.plain_line(model.views["ct200"], now=T0)
    _clean(plain)


def test_status_and_runs_tables_take_markup_and_escapes_as_text() -> None:
    console = _console()
    doc = RunsAnswer(
        workdir="/w",
        runs=(
            RunStatus(
                run_id=f"r{EVIL}",
                run_dir="/w/r",
                state="running",
                command="train.py model=[a,b] x=[/]",
            ),
        ),
    )
    console.print(launch_view.runs_table(doc))
    row = {
        "target": "ct200",
        "reachable": True,
        "run_id": f"r{EVIL}",
        "session": "[bold]x",
        "error": "[/red] boom",
    }
    console.print(launch_view.status_table([row]))
    out = _out(console)
    _clean(out)
    assert "model=[a,b]" in out and "[/red] boom" in out and "[bold]x" in out


@pytest.fixture
def evil_postmortem():  # type: ignore[no-untyped-def]
    return judge(
        _evidence(
            exit_status=1,
            exit_status_at=T0 + 30,
            run_state="exited",
            log_tail=("```", f"line {EVIL}", "````"),
            tee_error=f"tee: {EVIL}: No space left on device",
        )
    )


def test_the_postmortem_on_the_terminal_shows_tee_err_escaped(evil_postmortem) -> None:  # type: ignore[no-untyped-def]
    console = _console()
    pm_view.print_verdict(console, evil_postmortem)
    out = _out(console)
    _clean(out)
    assert "tee failed: tee: ␛]0;pwned" in out


def test_report_md_fences_cannot_be_closed_and_html_holds_no_control(evil_postmortem) -> None:  # type: ignore[no-untyped-def]
    md, page = pm_view.markdown(evil_postmortem), pm_view.html(evil_postmortem)
    _clean(md)
    _clean(page)
    tail = md.split("## Log tail\n", 1)[1]
    opening = tail.split("\n", 1)[0]
    assert opening == "`````"  # longer than the log's own ```` line
    assert tail.count(opening + "\n") == 2  # opened and closed by the fence, not by the log
    assert fence("````") == "`````"


def test_json_output_is_valid_json_without_nan_or_raw_controls(capsys) -> None:  # type: ignore[no-untyped-def]
    from orchestrator.commands._app import print_json

    print_json({"loss": float("nan"), "tps": float("inf"), "name": EVIL})
    out = capsys.readouterr().out
    _clean(out)
    doc = json.loads(out)  # strict: NaN is not JSON
    assert doc["loss"] is None and doc["tps"] is None and doc["name"] == EVIL
    assert "NaN" not in out and "Infinity" not in out
