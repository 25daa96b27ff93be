"""Registry of federated methods (``fednorm list methods``)."""

from __future__ import annotations

from typing import Any

from ..registry import Registry
from .base import Method

__all__ = ["METHODS", "register_method", "list_methods", "get_method"]

METHODS: Registry[type[Method]] = Registry("method")
register_method = METHODS.register


def list_methods(include: Any = None, exclude: Any = None) -> list[str]:
    return METHODS.list(include, exclude)


def get_method(name: str, **config: Any) -> Method:
    """Build a method from its name and its options (``method_args``)."""
    return METHODS.build_from_config(name, "method_args", config)
