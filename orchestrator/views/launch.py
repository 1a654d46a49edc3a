"""Rendering for the launch lifecycle: phase progress, the launch summary, status and runs tables."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.status import Status
from rich.table import Table
from rich.text import Text

from orchestrator.views.progress import format_rate
from orchestrator.wire.answers import RunsAnswer
from orchestrator.wire.text import visible

_MARK = {"ok": "[green]✓[/]", "fail": "[bold red]✗[/]", "skip": "[dim]–[/]"}


class PhaseProgress:
    """``on_phase`` callback: a spinner while a phase runs, one line per phase when it ends."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._status: Status | None = None
        self._t0 = time.monotonic()

    def __call__(self, phase: str, status: str, detail: str) -> None:
        at = time.monotonic() - self._t0
        if status == "start":
            self._stop()
            if self.console.is_terminal:
                self._status = self.console.status(f"{phase}: {detail}", spinner="dots")
                self._status.start()
            return
        self._stop()
        line = Text.from_markup(f"{_MARK.get(status, '?')} [bold]{phase:<9}[/] ")
        line.append(visible(detail))
        line.append(f"  ({at:.1f} s)", style="dim")
        self.console.print(line, highlight=False, soft_wrap=True)

    def _stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def close(self) -> None:
        self._stop()


def launch_summary(console: Console, result: dict[str, Any]) -> None:
    """What to do next after a successful launch."""
    target = result["target"]
    head = "verified" if result.get("verified") else "started (not verified)"
    console.print(
        f"[bold green]{head}[/] run [bold]{result['run_id']}[/] on {target} "
        f"in {result['elapsed_s']:.1f} s",
        highlight=False,
    )
    console.print(remote_text(f"  log:    {result['log_path']}"), highlight=False, soft_wrap=True)
    console.print(
        f"  follow: orch logs -f {target}   |   orch watch {target}   |   orch attach {target}",
        highlight=False,
    )


def job_summary(console: Console, result: dict[str, Any]) -> None:
    """What to do next after a job launch: every node, its rank, host and log."""
    job = result["job"]
    head = "verified" if result.get("verified") else "started (not verified)"
    console.print(
        f"[bold green]{head}[/] job [bold]{job}[/] run [bold]{result['run_id']}[/] on "
        f"{len(result['nodes'])} nodes in {result['elapsed_s']:.1f} s "
        f"(rendezvous {result['rendezvous']})",
        highlight=False,
    )
    for n in result["nodes"]:
        console.print(
            remote_text(
                f"  rank {n['rank']}: {n['node']} on {n['host']} ({n['address']})  "
                f"log {n['log_path']}"
            ),
            highlight=False,
            soft_wrap=True,
        )
    first = result["nodes"][0]["node"] if result["nodes"] else job
    console.print(
        f"  follow: orch watch {job}   |   orch logs -f {job} --node {first}   |   "
        f"orch check {job}",
        highlight=False,
    )


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def status_table(rows: Sequence[dict[str, Any]], width: int | None = None) -> Table:
    """One row per target: reachable, container, session, run, age, step, tok/s, GPU memory.

    ``width``: the terminal's columns; under 100 (80 without a terminal) the columns are one
    space apart, not two, so every word fits whole.
    """
    heal = any(r.get("restarts") for r in rows)
    cols = (
        "target",
        "reach",
        "container",
        "session",
        "run",
        "state",
        "age",
        "step",
        "tok/s",
        "GPU mem",
        *(("restarts",) if heal else ()),
    )
    cells = _status_cells(rows, heal)
    narrow = width is not None and width < 100
    table = Table(
        box=None, pad_edge=False, header_style="bold", padding=(0, 1, 0, 0) if narrow else (0, 1)
    )
    for i, col in enumerate(cols):
        # a narrow terminal wraps between words (the run id, one long word, folds): no column
        # is ever narrower than its longest word, so "container" never reads "contai/ner"
        words = [
            w
            for c in (col, *(row[i] for row in cells))
            for w in (c.plain if isinstance(c, Text) else Text.from_markup(c).plain).split()
        ]
        longest = max(map(len, words), default=1)
        if col == "run":
            table.add_column(col, overflow="fold", min_width=min(longest, 8))
        else:
            table.add_column(col, overflow="fold", min_width=longest)
    for row in cells:
        table.add_row(*row)
    return table


def _status_cells(rows: Sequence[dict[str, Any]], heal: bool) -> list[tuple[str | Text, ...]]:
    """:func:`status_table`'s cells (orch's own rich markup, or remote text as :class:`Text`),
    one tuple per row."""
    out: list[tuple[str | Text, ...]] = []
    for r in rows:
        if r.get("kind") == "job":
            tps = r.get("tokens_per_s")
            out.append(
                (
                    f"[bold]{r['target']}[/] (job)",
                    "",
                    "",
                    "",
                    f"rendezvous {r.get('rendezvous', '-')}",
                    r.get("state") or "-",
                    "",
                    "",
                    f"{tps:,.0f}" if tps is not None else "-",
                    "",
                    *(("",) if heal else ()),
                )
            )
            continue
        reach = "[green]yes[/]" if r.get("reachable") else "[red]no[/]"
        mem = (
            f"{r['gpu_mem_used_gib']:.0f}/{r['gpu_mem_total_gib']:.0f} GiB ({r['gpus']} GPUs, "
            f"{r['gpus_busy']} busy)"
            if r.get("gpus")
            else "-"
        )
        tps = r.get("tokens_per_s")
        state = r.get("state") or r.get("run_state") or "-"
        if r.get("run_state") and r["run_state"] != state:
            state = f"{state} ({r['run_state']})"  # e.g. "stopped (exited 130)"
        shown: Text = remote_text(state)
        if r.get("error"):
            shown = remote_text(r["error"], "red")
        name = f"  {r['target']} (rank {r['rank']})" if "rank" in r else r["target"]
        container = r.get("container") or "-"
        if r.get("lock"):
            container = f"{container}, locked ({r['lock']})"  # pct list's Lock column
        out.append(
            (
                remote_text(name),
                reach,
                remote_text(container),
                remote_text(r.get("session") or "-"),
                remote_text(r.get("run_id") or "-"),
                shown,
                _age(r.get("age_s")),
                _step(r),
                _rate(r, tps),
                mem,
                *(((r.get("restarts") or {}).get("short", "-"),) if heal else ()),
            )
        )
    return out


def _step(row: dict[str, Any]) -> str:
    """The status table's step: ``300/500000`` when the log prints a total."""
    if row.get("step") is None:
        return "-"
    total = (row.get("progress") or {}).get("total_steps")
    return f"{row['step']}/{total}" if total is not None else str(row["step"])


def _rate(row: dict[str, Any], tps: float | None) -> str:
    """The tok/s column: tokens/s as a number; any other unit spelt out (never relabelled)."""
    if tps is not None:
        return f"{tps:,.0f}"
    rate = (row.get("progress") or {}).get("throughput")
    return format_rate(rate["value"], rate["unit"]) if rate else "-"


def runs_table(doc: RunsAnswer) -> Table:
    """The runs of one workdir, oldest first; the current one marked."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("", "run", "state", "started", "log", "command"):
        table.add_column(col, overflow="fold")
    for r in doc.runs:
        st = r.state
        shown = f"exited {r.exit_status}" if st == "exited" else st
        style = {"running": "green", "vanished": "red"}.get(st, "yellow" if r.exit_status else "")
        started = r.started_at
        table.add_row(
            "*" if r.run_id == doc.current else "",
            remote_text(r.run_id),
            remote_text(shown, style),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else "-",
            _size(r.log_size_bytes),
            remote_text((r.command or "")[:80]),
        )
    return table


def remote_text(text: object, style: str = "") -> Text:
    """A cell of text from a container: controls shown, never parsed as rich markup (a
    Hydra-style ``[a,b]`` in a command is text, not a tag)."""
    return Text(visible(str(text)), style=style)


def _size(n: int | None) -> str:
    if n is None:
        return "none"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)
