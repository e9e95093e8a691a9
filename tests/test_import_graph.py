"""The shipped packages' import graph, read from the source: no loop between modules, and the benchmarks apart.

Every import counts, wherever it stands: at the top, inside a function, under ``if TYPE_CHECKING:``. A loop hidden
behind a lazy or a type-only import is still a loop in the design (lint-imports, which skips both, cannot see it).
``from package import name`` counts as an import of the module ``package.name`` when there is one, else of
``package``. Importing a module also runs its packages' ``__init__``; that implicit step is not an edge here.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("config", "tidal_api", "tidal_workers", "tidal_engine")
BENCH = "tidal_workers.bench"


def module_files() -> dict[str, Path]:
    """Dotted name -> file, for every module of the shipped packages (a package is its ``__init__.py``)."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_modules(name: str, source: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` imports anywhere in its ``source``."""
    package = name if is_package else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    resolved = set()
    for target in targets:
        while target and target not in known:  # `import a.b.c` where only a.b is ours: the deepest module
            target = target.rpartition(".")[0]
        if target and target != name:
            resolved.add(target)
    return resolved


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    return {
        name: imported_modules(name, path.read_text(), path.name == "__init__.py", known)
        for name, path in files.items()
    }


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module: each holds at least one loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def a_loop(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One loop through the component's first module, as the chain of imports that closes it."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    following.append(w)
        frontier = following
    raise AssertionError(f"{component} holds no loop")


def test_the_graph_reads_every_kind_of_import():
    graph = import_graph()
    assert "tidal_workers.runtime" in graph["tidal_api.app"]  # at the top
    assert "tidal_api.cli.demo" in graph["tidal_api.cli.up"]  # inside a function
    assert "tidal_workers.store.models" in graph["tidal_workers.store"]  # `from package import module`
    assert "tidal_workers.bench.engine_stats" in graph["tidal_workers.bench.dispatch"]


def test_a_loop_behind_a_function_or_type_checking_import_is_found():
    known = {"pkg", "pkg.a", "pkg.b", "pkg.c"}
    sources = {
        "pkg.a": "import typing as t\nif t.TYPE_CHECKING:\n    from pkg.b import B\n",
        "pkg.b": "def f():\n    from . import c\n",
        "pkg.c": "from .a import A\nimport pkg\n",
    }
    graph = {name: imported_modules(name, source, False, known) for name, source in sources.items()}
    graph["pkg"] = imported_modules("pkg", "from pkg import a\n", True, known)
    assert graph == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a", "pkg"}, "pkg": {"pkg.a"}}
    assert strongly_connected(graph) == [["pkg", "pkg.a", "pkg.b", "pkg.c"]]
    assert a_loop(graph, ["pkg.a", "pkg.b", "pkg.c"]) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]


def test_no_import_loop_between_modules():
    graph = import_graph()
    loops = [" -> ".join(a_loop(graph, component)) for component in strongly_connected(graph)]
    assert not loops, "import loops:\n" + "\n".join(loops)


def inside(name: str) -> bool:
    return name == BENCH or name.startswith(BENCH + ".")


def test_nothing_outside_the_benchmarks_imports_them():
    graph = import_graph()
    assert any(inside(name) for name in graph)
    reaching_in = sorted(
        f"{importer} -> {imported}"
        for importer, imports in graph.items()
        if not inside(importer)
        for imported in imports
        if inside(imported)
    )
    assert not reaching_in, "imports into the benchmarks from outside them:\n" + "\n".join(reaching_in)
