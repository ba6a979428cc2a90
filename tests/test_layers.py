"""Imports point only down (docs/decisions.md, "The layers"): every package and
top-level module has a rank, a module imports only its own rank or lower, there is
no import cycle, the two process roles (runtime/ and gateway/) never import each
other, and neither do router/ and webhooks/.  Read from the source with ``ast``,
lazy imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "aotx_trio"

# Lower rank = lower layer; a module may import its own rank or lower, never higher.
# Each entry names a package or module under aotx_trio; the longest matching name wins.
RANKS: dict[str, int] = {
    # 0: leaves: they import nothing of the package but each other
    "errors": 0, "vocab": 0, "identity": 0, "_fs": 0, "_latency": 0,
    # 1: the native library's loader and code translation (the one place)
    "native.lib": 1,
    # 2: the faces of the native library, and plain settings and files
    "native": 2, "config": 2, "default_models": 2,
    # 3: what both process roles share
    "grants": 3, "_process": 3, "service": 3, "outbound": 3,
    # 4: the model registry's storage, below the router and the webhooks
    "registry": 4,
    # 5: the serving router's and the webhooks' logic (siblings)
    "router": 5, "webhooks": 5,
    # 6: the two process roles (siblings)
    "runtime": 6, "gateway": 6,
    # 7: entry points
    "serve": 7, "cli": 7, "__main__": 7, "engine_cli": 7, "embed_cli": 7, "": 7,
}
SIBLINGS = [("runtime", "gateway"), ("router", "webhooks")]


def _name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _rank(module: str) -> int:
    """The rank of ``aotx_trio.<rest>``: the longest entry of RANKS that is <rest> or a
    package above it; KeyError for a module no entry covers."""
    rest = module.split(".", 1)[1] if "." in module else ""
    parts = rest.split(".") if rest else []
    for n in range(len(parts), -1, -1):
        key = ".".join(parts[:n])
        if key in RANKS and (n or not parts):
            return RANKS[key]
    raise KeyError(module)


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


def test_every_module_has_a_rank() -> None:
    unranked = []
    for m in _graph():
        try:
            _rank(m)
        except KeyError:
            unranked.append(m)
    assert unranked == []


def test_siblings_do_not_import_each_other() -> None:
    graph = _graph()
    for x, y in SIBLINGS:
        for a, b in ((x, y), (y, x)):
            crossing = [(m, d) for m, deps in graph.items()
                        if m.startswith(f"aotx_trio.{a}")
                        for d in deps if d.startswith(f"aotx_trio.{b}")]
            assert crossing == [], crossing


def test_the_runtime_never_loads_the_router_or_the_gateway() -> None:
    """Everything the runtime process imports, followed transitively: no router, no
    spec DSL, no webhooks, no gateway, no outbound HTTP."""
    graph = _graph()
    seen: set[str] = set()
    todo = [m for m in graph if m.startswith("aotx_trio.runtime")]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    banned = ("aotx_trio.router", "aotx_trio.gateway", "aotx_trio.webhooks",
              "aotx_trio.outbound", "aotx_trio.registry")
    assert sorted(m for m in seen if m.startswith(banned)) == []


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
    for leaf in ("vocab", "errors", "identity", "_latency"):
        assert graph[f"aotx_trio.{leaf}"] == set(), leaf
