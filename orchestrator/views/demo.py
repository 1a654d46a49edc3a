"""Rendering for ``orch demo``: one line per step with its duration, the live view, the findings,
the verdict, and what to do next. Implements :class:`orchestrator.firstrun.demo.DemoUI`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from orchestrator.config.inventory import Inventory
from orchestrator.views.launch import PhaseProgress
from orchestrator.wire.model import Finding, Snapshot

_MARK = {"ok": ("✓", "green"), "fail": ("✗", "bold red")}
_SEVERITY = {"CRITICAL": "bold red", "WARNING": "yellow", "INFO": "blue"}
SHOW_AFTER_FOUND_S = 1.5
"""The live view stays this long after the awaited finding, so it is seen there too."""


def yes_no(answer: str, default: bool) -> bool:
    """A typed answer to a yes/no question; empty (Enter) is ``default``.

    >>> yes_no("", True), yes_no("n", True), yes_no(" YES ", False), yes_no("", False)
    (True, False, True, False)
    """
    word = answer.strip().lower()
    if not word:
        return default
    return word in ("y", "yes")


class RichDemoUI:
    """Prints the demo's progress on ``console``; asks questions only when ``interactive``."""

    def __init__(
        self,
        console: Console,
        *,
        interactive: bool = False,
        interval_s: float = 1.0,
        watcher: Callable[..., None] | None = None,
    ):
        self.console = console
        self.watcher = watcher
        self.interactive = interactive
        self.interval_s = interval_s
        self._phases: PhaseProgress | None = None

    def step(self, name: str, status: str, detail: str, elapsed_s: float | None) -> None:
        if status == "start":
            self.console.print(
                Text.assemble(("▶ ", "bold cyan"), (f"{name:<11}", "bold"), detail),
                highlight=False,
                soft_wrap=True,
            )
            return
        if self._phases is not None:
            self._phases.close()
            self._phases = None
        mark, style = _MARK.get(status, ("?", ""))
        line = Text.assemble((f"{mark} ", style), (f"{name:<11}", "bold"), detail)
        if elapsed_s is not None:
            line.append(f"  [{elapsed_s:.1f} s]", style="dim")
        self.console.print(line, highlight=False, soft_wrap=True)

    def phase(self, name: str, status: str, detail: str) -> None:
        """The launch's own phases (preflight, deploy, start, verify), indented under its step."""
        if self._phases is None:
            self._phases = PhaseProgress(self.console)
        if status != "start":
            self.console.print("   ", end="")
        self._phases(name, status, detail)

    def watch(
        self,
        inventory: Inventory,
        name: str,
        *,
        seconds: float,
        on_snapshot: Callable[[Snapshot], bool],
    ) -> None:
        """``orch watch NAME`` for ``seconds`` (plain lines when not a terminal), through the
        ``watcher`` given (the commands layer's: the observer's threads are not a view's).

        Every snapshot goes to ``on_snapshot`` first; once it answers True the view
        stays :data:`SHOW_AFTER_FOUND_S` longer and ends.
        """
        if self.watcher is None:
            raise RuntimeError("RichDemoUI.watch needs a watcher")
        self.watcher(
            inventory,
            name,
            seconds=seconds,
            on_snapshot=on_snapshot,
            console=self.console,
            interval_s=self.interval_s,
            show_after_s=SHOW_AFTER_FOUND_S,
        )

    def findings(self, findings: Sequence[Finding]) -> None:
        if not findings:
            self.console.print("   no findings")
        for f in findings:
            sev = f.severity.name
            gpus = f" [GPU {','.join(map(str, f.gpus))}]" if f.gpus else ""
            line = Text.assemble(
                "   finding: ", (f"{sev} {f.kind}", _SEVERITY.get(sev, "")), gpus, f": {f.summary}"
            )
            self.console.print(line, highlight=False, soft_wrap=True)

    def report(self, pm: Any) -> tuple[str, str]:
        from orchestrator.views.postmortem import html, markdown

        return markdown(pm), html(pm)

    def verdict(self, pm: Any) -> None:
        from orchestrator.views.postmortem import print_verdict

        self.console.rule("postmortem")
        print_verdict(self.console, pm)
        self.console.rule()

    def ask(self, question: str, default: bool = False) -> bool:
        """``question [Y/n]`` (or ``[y/N]``): Enter answers ``default``; not interactive: False.

        The choices are escaped: rich reads a bare ``[y/N]`` as markup and prints nothing.
        """
        if not self.interactive:
            return False
        choices = "[Y/n]" if default else "[y/N]"
        answer = self.console.input(f"{question} {escape(choices)} ").strip().lower()
        return yes_no(answer, default)

    def done(self, result: Any) -> None:
        c = self.console
        verdict = result.verdict.kind if result.verdict is not None else "none"
        c.print(
            Text.assemble(
                ("demo done", "bold green"), f" in {result.elapsed_s:.1f} s: verdict {verdict}"
            ),
            highlight=False,
        )
        if result.report_html:
            c.print(Text(f"HTML report: {result.report_html}"), highlight=False, soft_wrap=True)
        if result.kept:
            c.print("The sandbox is still up. Explore it with:")
            for cmd in result.explore_commands():
                c.print(Text(f"  {cmd}"), highlight=False, soft_wrap=True)
        else:
            c.print(
                Text(
                    f"Sandbox stopped; its files stay in {result.state_dir} "
                    f"(orch demo --keep leaves it running)."
                ),
                highlight=False,
                soft_wrap=True,
            )
            c.print("Next, try:")
            for cmd in result.next_commands():
                c.print(Text(f"  {cmd}"), highlight=False, soft_wrap=True)
