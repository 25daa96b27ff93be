"""YAML parsing for configs, tables and run records: PyYAML's safe loader, in its C form (libyaml)
when PyYAML was built with it. The C loader gives the same objects 10-15x faster; the suite and
``fednorm reproduce`` parse every table config (70-odd files) more than once per process."""

from __future__ import annotations

from typing import IO, Any

import yaml

__all__ = ["safe_load"]

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(stream: str | bytes | IO[str] | IO[bytes]) -> Any:
    """As :func:`yaml.safe_load`."""
    return yaml.load(stream, Loader=_LOADER)  # noqa: S506 - a safe loader
