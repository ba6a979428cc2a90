"""Imports point only down (DESIGN.md): no package cycle, the two process roles
(runtime/ and gateway/) never import each other, and the shared leaves import
neither.  Read from the source with ``ast``, lazy imports inside functions
included."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "aotx_trio"

# Lower rank = lower layer; a module may import its own rank or lower, never higher.
RANKS: list[tuple[int, tuple[str, ...]]] = [
    (0, ("errors", "vocab", "_fs")),
    (1, ("native",)),
    (3, ("wire", "config", "grants", "_process", "client")),
    (4, ("runtime", "gateway")),
    (5, ("serve", "cli", "__main__", "engine_cli", "embed_cli")),
]
DEFAULT_RANK = 2   # the faces of the native library: device, journal, engine, embed...


def _name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _rank(module: str) -> int:
    head = module.split(".")[1] if "." in module else ""
    for rank, names in RANKS:
        if head in names:
            return rank
    return DEFAULT_RANK


def _graph() -> dict[str, set[str]]:
    modules = {_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            deps.update(t for t in targets if t in modules and t != mod)
        graph[mod] = deps
    return graph


def test_imports_only_point_down() -> None:
    bad = [(m, d) for m, deps in _graph().items() for d in deps
           if _rank(d) > _rank(m) and not m.startswith(d + ".")]
    assert bad == []


def test_the_process_roles_do_not_import_each_other() -> None:
    graph = _graph()
    for a, b in (("aotx_trio.runtime", "aotx_trio.gateway"),
                 ("aotx_trio.gateway", "aotx_trio.runtime")):
        crossing = [(m, d) for m, deps in graph.items() if m.startswith(a)
                    for d in deps if d.startswith(b)]
        assert crossing == [], crossing


def test_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if d.startswith(m + "."):
                continue   # a package importing its own submodules
            if state.get(d) == 1:
                raise AssertionError(" -> ".join([*stack[stack.index(d):], d]))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_the_leaves_import_nothing_of_the_package() -> None:
    graph = _graph()
    assert graph["aotx_trio.vocab"] == set()
    assert graph["aotx_trio.errors"] == set()
