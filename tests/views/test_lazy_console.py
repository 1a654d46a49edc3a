"""The lazily made consoles of ``orchestrator.commands._app`` stand in for a rich Console in
every use rich makes of one (``orch watch`` once crashed: rich's Live does ``with console:``)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.live import Live
from rich.text import Text

from orchestrator.commands._app import _LazyConsole, real_console


def test_a_lazy_console_works_as_a_context_manager_and_under_live() -> None:
    lazy = _LazyConsole(file=io.StringIO(), force_terminal=True, width=40)
    with lazy:  # type: ignore[attr-defined]
        lazy.print("inside")  # type: ignore[attr-defined]
    with Live(Text("live"), console=lazy, auto_refresh=False):  # type: ignore[arg-type]
        pass
    out = real_console(lazy).file.getvalue()  # type: ignore[arg-type,attr-defined]
    assert "inside" in out and "live" in out


def test_real_console_unwraps_the_proxy_once_and_passes_a_console_through() -> None:
    lazy = _LazyConsole(file=io.StringIO())
    real = real_console(lazy)  # type: ignore[arg-type]
    assert isinstance(real, Console) and real_console(lazy) is real  # type: ignore[arg-type]
    plain = Console(file=io.StringIO())
    assert real_console(plain) is plain
