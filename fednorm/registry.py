"""A small name -> builder registry, shared by models, norms, methods, datasets and partitions.

Modelled on torchvision's ``_api.py`` and Opacus's accountant registry: builders register
under a lowercase name with a decorator, lookups ignore case and treat ``-`` and ``_``
alike, and an unknown name raises :class:`~fednorm.errors.UnknownNameError` listing the
valid names and suggesting the closest one. ``name.tag`` selects a named variant (for
example ``hbn.reference`` for a paper's released code) when it was registered as such.
"""

from __future__ import annotations

import difflib
import fnmatch
import inspect
from typing import Any, Callable, Generic, Iterable, TypeVar

from .errors import ConfigError, UnknownNameError

__all__ = ["Registry", "normalize_name"]

T = TypeVar("T")


def normalize_name(name: str) -> str:
    """Canonical spelling of a registry key: lowercase, ``-`` and spaces become ``_``."""
    if not isinstance(name, str):
        raise TypeError(f"registry names must be strings, got {type(name).__name__}")
    return name.strip().lower().replace("-", "_").replace(" ", "_")


class Registry(Generic[T]):
    """Maps names to builders (classes or functions).

    Args:
        kind: what is registered (``"model"``, ``"method"``, ...), used in messages.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._prefixes: dict[str, Callable[[str], T]] = {}

    def add_prefix(self, prefix: str, resolver: Callable[[str], T]) -> None:
        """Resolve names ``prefix:rest`` to ``resolver(rest)``, ``rest`` verbatim (a path or a class
        name: ``hf:data/my_set``, ``flwr:DirichletPartitioner``). The resolver raises ValueError
        for a ``rest`` it cannot serve."""
        self._prefixes[normalize_name(prefix)] = resolver

    def _prefixed(self, name: str) -> tuple[Callable[[str], T], str] | None:
        head, sep, rest = name.partition(":")
        resolver = self._prefixes.get(normalize_name(head)) if sep else None
        return (resolver, rest) if resolver is not None else None

    def register(self, name: str | None = None, *, force: bool = False) -> Callable[[T], T]:
        """Decorator registering a builder under ``name`` (default: its ``__name__``)."""

        def decorator(obj: T) -> T:
            self.add(name if name is not None else obj.__name__, obj, force=force)  # type: ignore[attr-defined]
            return obj

        return decorator

    def add(self, name: str, obj: T, *, force: bool = False) -> None:
        key = normalize_name(name)
        if key in self._entries and not force:
            raise ValueError(f"An entry is already registered under the name '{key}' in the {self.kind} registry")
        self._entries[key] = obj

    def remove(self, name: str) -> None:
        """Unregister ``name`` (a plugin's or a test's entry); KeyError when it is not registered."""
        key = normalize_name(name)
        if key not in self._entries:
            raise KeyError(f"nothing is registered under the name '{key}' in the {self.kind} registry")
        del self._entries[key]

    def list(self, include: str | Iterable[str] | None = None, exclude: str | Iterable[str] | None = None) -> list[str]:
        """Sorted names, optionally filtered by fnmatch patterns."""
        names = sorted(self._entries)
        if include is not None:
            pats = [include] if isinstance(include, str) else list(include)
            names = [n for n in names if any(fnmatch.fnmatch(n, normalize_name(p)) for p in pats)]
        if exclude is not None:
            pats = [exclude] if isinstance(exclude, str) else list(exclude)
            names = [n for n in names if not any(fnmatch.fnmatch(n, normalize_name(p)) for p in pats)]
        return names

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (normalize_name(name) in self._entries or self._prefixed(name) is not None)

    def __len__(self) -> int:
        return len(self._entries)

    def get_builder(self, name: str) -> T:
        """The registered builder for ``name``; raises UnknownNameError with a suggestion."""
        prefixed = self._prefixed(name) if isinstance(name, str) else None
        if prefixed is not None:
            resolver, rest = prefixed
            return resolver(rest)
        key = normalize_name(name)
        try:
            return self._entries[key]
        except KeyError:
            valid = self.list()
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            listed = ", ".join(valid)
            # one line: a long registry is named by `fednorm list` rather than spelled out
            names = (f"Valid {self.kind}s are: {listed}" if len(listed) <= 160
                     else f"There are {len(valid)} {self.kind}s: `fednorm list` names them")
            raise UnknownNameError(f"Unknown {self.kind} '{name}'.{hint} {names} (your own: fednorm --plugin MODULE)") from None

    def build(self, name: str, **config: Any) -> Any:
        """Call the builder with ``config``, dropping ``None`` values so builder defaults survive."""
        builder = self.get_builder(name)
        return builder(**{k: v for k, v in config.items() if v is not None})  # type: ignore[operator]

    def build_from_config(self, name: str, field: str, config: dict[str, Any]) -> Any:
        """:meth:`build` for user options: a rejected option raises ConfigError naming ``field``
        (e.g. ``method_args``) and the builder's valid options."""
        builder = self.get_builder(name)
        try:
            return builder(**{k: v for k, v in config.items() if v is not None})  # type: ignore[operator]
        except TypeError as exc:
            params = inspect.signature(builder).parameters  # type: ignore[arg-type]
            valid = ", ".join(p for p in params if p != "self") or "none"
            raise ConfigError(f"{field} for '{name}': {exc} (valid options: {valid})") from None
