"""Registry of federated methods (``fednorm list methods``)."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..registry import Registry
from .base import Method

__all__ = ["METHODS", "register_method", "list_methods", "get_method"]

METHODS: Registry[type[Method]] = Registry("method")
register_method = METHODS.register


def list_methods(include: Any = None, exclude: Any = None) -> list[str]:
    return METHODS.list(include, exclude)


def get_method(name: str, **config: Any) -> Method:
    """Build a method from its name and its options (``method_args``)."""
    cls = METHODS.get_builder(name)
    try:
        return cls(**{k: v for k, v in config.items() if v is not None})
    except TypeError as exc:
        raise ConfigError(f"method_args for '{name}': {exc}") from None
