"""Registry of federated methods (``fednorm list methods``)."""

from __future__ import annotations

from typing import Any

from ..registry import Registry
from .base import Method
from .policy import NormPolicy

__all__ = ["METHODS", "register_method", "list_methods", "get_method", "describe_methods"]

METHODS: Registry[type[Method]] = Registry("method")
register_method = METHODS.register


def list_methods(include: Any = None, exclude: Any = None) -> list[str]:
    """The registered method names, sorted; ``include``/``exclude`` filter them by fnmatch patterns."""
    return METHODS.list(include, exclude)


def get_method(name: str, **config: Any) -> Method:
    """Build a method from its name and its options (``method_args``)."""
    return METHODS.build_from_config(name, "method_args", config)


_ABBREVIATIONS = ("Eq", "Eqs", "Sec", "Fig", "Alg", "App", "al", "e.g", "i.e", "cf", "vs", "resp", "No")


def first_sentence(text: str) -> str:
    """The first sentence of ``text``: up to the first ". " not after an abbreviation ("Eq. 9",
    "et al. 2021") and not before a digit or lowercase letter."""
    start = 0
    while True:
        end = text.find(". ", start)
        if end < 0:
            return text.rstrip(".") + "."
        word = text[:end].rsplit(" ", 1)[-1].lstrip("(")
        following = text[end + 2:end + 3]
        if word not in _ABBREVIATIONS and not (following.isdigit() or following.islower()):
            return text[:end] + "."
        start = end + 2


def describe_methods() -> list[str]:
    """One block per registered method: its first docstring line and its normalization policy
    (default and supported settings), for ``fednorm list methods --verbose``."""
    lines = []
    for name in METHODS.list():
        cls = METHODS.get_builder(name)
        para = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        doc = first_sentence(para)
        p: NormPolicy = cls.default_policy
        lines.append(f"{name}: {doc}")
        lines.append(f"    buffers: {p.buffers} (default; supports {', '.join(cls.allowed_buffers)})  "
                     f"affine: {p.affine} (default; supports {', '.join(cls.allowed_affine)})"
                     + ("  evaluated per client" if cls.personalized else ""))
    return lines
