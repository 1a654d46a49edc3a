"""The tree is the architecture: imports only go down the layers of docs/ARCHITECTURE.md, the
views are imported by ``commands/`` and ``cli.py`` only, there is no import circle (lazy
imports inside functions count), and no module is over 600 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "orchestrator"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("wire", "errors", "__init__"),
    ("agent",),
    ("config", "detect", "playbooks"),
    ("transport",),
    ("remote",),
    ("monitor", "lifecycle", "postmortem", "sandbox", "firstrun"),
    ("heal",),
    ("views",),
    ("commands", "cli"),
)
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
LONG_ALLOWED = {
    "orchestrator/sandbox/manager.py",  # the sandbox's rewrite is pending
}


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _graph() -> dict[str, set[str]]:
    mods = {_module(p): p for p in PKG.rglob("*.py") if "bin" not in p.parts}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            for name in names:
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if name and name != mod and name.startswith("orchestrator."):
                    graph[mod].add(name)
    return graph


def _top(mod: str) -> str:
    return mod.split(".")[1] if "." in mod else "__init__"


def test_imports_only_go_down() -> None:
    wrong = [
        f"{a} -> {b}"
        for a, targets in _graph().items()
        for b in targets
        if RANK[_top(b)] > RANK[_top(a)]
        or (_top(b) == "views" and _top(a) not in ("views", "commands", "cli"))
    ]
    assert not wrong, "\n".join(sorted(wrong))


def test_the_agent_imports_only_what_ships_with_it() -> None:
    wrong = [
        f"{a} -> {b}"
        for a, targets in _graph().items()
        if _top(a) == "agent"
        for b in targets
        if _top(b) not in ("agent", "wire") and b != "orchestrator"
    ]
    assert not wrong, wrong


def test_no_import_circle() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_no_module_over_600_lines() -> None:
    long = [
        f"{p.relative_to(ROOT)}: {n}"
        for p in PKG.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 600
        and str(p.relative_to(ROOT)) not in LONG_ALLOWED
    ]
    assert not long, long
