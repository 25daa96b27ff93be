"""The layering the architecture promises, read from the source's import statements.

Methods, layers and client/server optimizers are run by the engine, so they must not import it
(nor the CLI or the runtimes): an import back would close a circle. The API (``fednorm.run``) sits
below the CLI and the engine below the API: neither imports a layer above it. The CLI starts distributed
workers as processes and must not import the worker that imports the CLI.

No module of fednorm imports itself back through others (``test_no_module_is_in_an_import_circle``).
Every import statement counts, wherever it is: at module level, inside a function (an import
deferred to call time still ties the two modules together, and only works by the order of
execution), and under ``if TYPE_CHECKING`` (a type-only circle is still a circle for a reader).
An import names one module: ``from a.b import c`` is an edge to ``a.b.c`` when that is a module,
else to ``a.b``; the parent packages Python runs first are not edges (every ``__init__`` that
imports its own submodules would otherwise be a circle). Code shared by two modules goes in a
third that both import (``fednorm/data/base.py``, ``fednorm/data/partition_base.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fednorm"

# Known circles whose files are being changed elsewhere: (importer, imported) edges left out of the
# circle test, each with the fix; test_each_pending_edge_still_exists fails once one is gone, so the
# entry is removed with it.
_PENDING: dict[tuple[str, str], str] = {}  # (importer, imported) -> how to remove the edge; empty: no circle is tolerated


def _module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _statements(path: Path, root: Path = PACKAGE) -> Iterator[tuple[str, list[str]]]:
    """``(module, names)`` of every import statement in ``path``, anywhere in the file, with
    relative imports resolved; ``names`` is empty for ``import module``."""
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield target, [alias.name for alias in node.names]


def _imports(path: Path) -> set[str]:
    """Every fednorm module ``path`` imports, anywhere in the file (functions included)."""
    found: set[str] = set()
    for target, names in _statements(path):
        found.add(target)
        found.update(f"{target}.{name}" for name in names)
    return {name for name in found if name == "fednorm" or name.startswith("fednorm.")}


def _import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (see the module docstring)."""
    files = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}

    def owner(name: str) -> str | None:
        while name not in files and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in files else None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        edges: set[str] = set()
        for target, names in _statements(path, root):
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in files]
            edges.update(submodules)
            if len(submodules) < len(names) or not names:
                edges.add(owner(target) or "")
        graph[module] = edges & files.keys() - {module}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle ``[a, b, ..., a]`` through each strongly connected component of two or more
    modules (Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(_way_back(graph, component, min(component)) for component in components)


def _way_back(graph: dict[str, set[str]], component: set[str], start: str) -> list[str]:
    """A shortest circle ``[start, ..., start]`` inside ``component`` (breadth first)."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} has no way back in its component")  # not reached: a component is strongly connected


def _sources(subpackage: str) -> list[Path]:
    return sorted(p for p in (PACKAGE / subpackage).rglob("*.py") if not p.name.endswith("_test.py"))


def test_the_import_reader_sees_relative_imports():
    """The reader resolves ``from ..engine.x import y`` (else the layering tests could not fail)."""
    found = _imports(PACKAGE / "distributed" / "worker.py")
    assert "fednorm.cli.main" in found


@pytest.mark.parametrize("layer", ["methods", "nn", "optim"])
def test_what_the_engine_runs_does_not_import_the_engine(layer):
    forbidden = ("fednorm.engine", "fednorm.cli", "fednorm.distributed", "fednorm.flower")
    offenders = {
        _module_name(path): sorted(name for name in _imports(path) if name.startswith(forbidden))
        for path in _sources(layer)
    }
    assert {k: v for k, v in offenders.items() if v} == {}


@pytest.mark.parametrize("layer, above", [
    ("api", ("fednorm.cli",)),  # the CLI parses arguments and calls the API; a rule both need goes below both
    ("engine", ("fednorm.cli", "fednorm.api")),  # (fednorm/engine/rundir.py: where a run or a comparison writes)
])
def test_a_layer_does_not_import_the_layers_above_it(layer, above):
    offenders = {
        _module_name(path): sorted(name for name in _imports(path) if name.startswith(above))
        for path in _sources(layer)
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_cli_does_not_import_the_distributed_worker():
    offenders = {
        _module_name(path): sorted(name for name in _imports(path) if name.startswith("fednorm.distributed.worker"))
        for path in _sources("cli")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_module_is_in_an_import_circle():
    graph = _import_graph()
    for importer, imported in _PENDING:
        graph[importer].discard(imported)
    circles = [" -> ".join(c) for c in _circles(graph)]
    assert circles == [], "import circles (put what both sides need in a module of their own):\n" + "\n".join(circles)


def test_each_pending_edge_still_exists():
    """An exemption outlives its circle only by mistake: once the edge is gone, delete the entry."""
    graph = _import_graph()
    for importer, imported in _PENDING:
        assert imported in graph[importer], f"{importer} no longer imports {imported}: remove it from _PENDING"


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root / "pkg"


def test_the_circle_finder_counts_imports_in_functions_and_under_type_checking(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "from .a import f\n",
        "pkg/a.py": "def f():\n    from . import b\n    return b\n",
        "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import C\n",
        "pkg/c.py": "from .a import f as C\n",
    })
    graph = _import_graph(pkg)
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a"}}
    assert _circles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


def test_a_package_init_importing_its_submodules_is_no_circle(tmp_path):
    """``from pkg import sub`` names the submodule only; the parent ``__init__`` Python runs first is no edge."""
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "from . import a\nfrom .sub import b\n",
        "pkg/a.py": "from pkg.sub import b\nimport pkg.sub.b\n",
        "pkg/sub/__init__.py": "from .b import value\n",
        "pkg/sub/b.py": "value = 1\n",
    })
    graph = _import_graph(pkg)
    assert graph == {"pkg": {"pkg.a", "pkg.sub.b"}, "pkg.a": {"pkg.sub.b"}, "pkg.sub": {"pkg.sub.b"}, "pkg.sub.b": set()}
    assert _circles(graph) == []
    graph["pkg.sub.b"].add("pkg")  # b importing the package's __init__ closes two circles, one component
    assert _circles(graph) == [["pkg", "pkg.sub.b", "pkg"]]
