"""Your own methods, models, norms and datasets on fednorm's command line: plugins.

A plugin is a Python module that registers things when imported (``@register_method(...)``,
``register_model``, ``register_norm``, ``register_dataset``, ...). The command line imports

- every module named by ``--plugin MODULE`` (repeatable; a dotted module name on ``sys.path`` or
  in the current directory, or the path of a ``.py`` file),
- every module in the ``FEDNORM_PLUGINS`` environment variable (comma-separated, same forms),
- every installed package's entry point in the ``fednorm.plugins`` group (``pyproject.toml``:
  ``[project.entry-points."fednorm.plugins"] mine = "my_package.fednorm_plugin"``),

before it reads any config, so ``fednorm run --method mine``, ``fednorm compare --methods
fedavg,mine``, ``fednorm list methods`` and ``fednorm run --resume`` see them. ``--plugin``
also sets ``FEDNORM_PLUGINS``, so the processes fednorm starts (``fednorm launch`` ranks,
``fednorm reproduce --jobs`` workers) load the same plugins. ``docs/extending.md`` has an example.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Iterable

from .errors import ConfigError

__all__ = ["PLUGINS_ENV", "ENTRY_POINT_GROUP", "load_plugins", "loaded_plugins"]

PLUGINS_ENV = "FEDNORM_PLUGINS"
ENTRY_POINT_GROUP = "fednorm.plugins"

_LOADED: dict[str, str] = {}  # plugin -> where it came from (cli, environment, entry point)


def _split(value: str | None) -> list[str]:
    return [p.strip() for p in (value or "").split(",") if p.strip()]


def _import(name: str) -> None:
    path = Path(name)
    if name.endswith(".py"):
        if not path.is_file():
            raise ConfigError(f"plugin {name}: no such file")
        module_name = f"fednorm_plugin_{path.stem}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        return
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        # `fednorm` is a console script: the current directory is not on sys.path as it is for
        # `python -m`, so a plugin module beside the user is looked for there too.
        cwd = os.getcwd()
        if exc.name != name.split(".")[0] or cwd in sys.path or "" in sys.path:
            raise
        sys.path.insert(0, cwd)
        try:
            importlib.import_module(name)
        finally:
            sys.path.remove(cwd)


def load_plugins(names: Iterable[str] = (), *, environment: bool = True, entry_points: bool = True) -> list[str]:
    """Import ``names``, the modules in ``FEDNORM_PLUGINS`` and the ``fednorm.plugins`` entry
    points (each once per process); the plugins now loaded, in order. A plugin that fails to
    import is a one-line :class:`~fednorm.errors.ConfigError` naming it and the cause."""
    wanted = [(n, "--plugin") for n in names]
    if environment:
        wanted += [(n, PLUGINS_ENV) for n in _split(os.environ.get(PLUGINS_ENV))]
    if entry_points:
        from importlib.metadata import entry_points as _entry_points

        for ep in _entry_points(group=ENTRY_POINT_GROUP):
            wanted.append((ep.value.split(":")[0], f"entry point {ep.name}"))
    for name, source in wanted:
        if name in _LOADED:
            continue
        try:
            _import(name)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - any import failure is the plugin's, said in one line
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise ConfigError(f"cannot load plugin '{name}' (from {source}): {type(exc).__name__}: {first}") from exc
        _LOADED[name] = source
    return list(_LOADED)


def loaded_plugins() -> list[str]:
    """The plugins this process has loaded."""
    return list(_LOADED)


def export_to_environment(names: Iterable[str]) -> None:
    """Add ``names`` to ``FEDNORM_PLUGINS``, so the processes fednorm starts load them too."""
    current = _split(os.environ.get(PLUGINS_ENV))
    merged = current + [n if not n.endswith(".py") else str(Path(n).resolve()) for n in names if n not in current]
    if merged:
        os.environ[PLUGINS_ENV] = ",".join(merged)
