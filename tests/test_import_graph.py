"""The layering the architecture promises, read from the source's import statements.

Methods, layers and client/server optimizers are run by the engine, so they must not import it
(nor the CLI or the runtimes): an import back would close a circle. The CLI starts distributed
workers as processes and must not import the worker that imports the CLI. Imports under
``if TYPE_CHECKING`` count too: a type-only circle is still a circle for a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fednorm"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every fednorm module ``path`` imports, anywhere in the file (functions included)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "fednorm" or name.startswith("fednorm.")}


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


def test_the_cli_does_not_import_the_distributed_worker():
    offenders = {
        _module_name(path): sorted(name for name in _imports(path) if name.startswith("fednorm.distributed.worker"))
        for path in _sources("cli")
    }
    assert {k: v for k, v in offenders.items() if v} == {}
