"""``views/`` renders only: no view module reaches a transport or a remote handle (not even by a
lazy import inside a function), and none starts a thread, a timer, a pool or a server (the
observer in ``monitor/`` and the loops in ``commands/`` do)."""

from __future__ import annotations

import ast
from pathlib import Path

VIEWS = Path(__file__).resolve().parents[2] / "orchestrator" / "views"
FORBIDDEN_PACKAGES = ("orchestrator.transport", "orchestrator.remote")
STARTERS = {
    "Thread",
    "Timer",
    "ThreadPoolExecutor",
    "ProcessPoolExecutor",
    "start_new_thread",
    "start_http_server",
    "serve_forever",
}
"""Callables that start a thread (or a server's): a view must call none of them."""


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


def _starts(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            )
            if name in STARTERS:
                out.append((node.lineno, name))
        elif isinstance(node, ast.ImportFrom) and node.module:
            out += [(node.lineno, a.name) for a in node.names if a.name in STARTERS]
    return out


def _views() -> list[tuple[str, ast.AST]]:
    return [(p.name, ast.parse(p.read_text())) for p in sorted(VIEWS.rglob("*.py"))]


def test_no_view_imports_a_transport_or_a_remote_handle() -> None:
    wrong = [
        f"views/{name}:{line}: {mod}"
        for name, tree in _views()
        for line, mod in _imports(tree)
        if mod.startswith(FORBIDDEN_PACKAGES)
    ]
    assert not wrong, "\n".join(wrong)


def test_no_view_starts_a_thread() -> None:
    wrong = [
        f"views/{name}:{line}: {what}" for name, tree in _views() for line, what in _starts(tree)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_rule_sees_what_it_forbids() -> None:
    """The checks above find a lazy remote import and a Timer (so a pass means something)."""
    tree = ast.parse(
        "def f():\n    from orchestrator.remote.target import Target\n"
        "    import threading\n    threading.Timer(1, f).start()\n"
    )
    assert [m for _, m in _imports(tree) if m.startswith(FORBIDDEN_PACKAGES)]
    assert _starts(tree) == [(4, "Timer")]
