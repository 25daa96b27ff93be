"""Comparison helper shared by the runtime tests (distributed, Flower): nested metrics equal to rounding."""

from __future__ import annotations

import math
from typing import Any


def assert_close_tree(a: Any, b: Any, where: str = "", rel: float = 1e-9, abs_: float = 1e-12) -> None:
    """``a`` and ``b`` (dicts, lists, numbers, strings) are equal, floats to ``rel``/``abs_``."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_close_tree(a[k], b[k], f"{where}.{k}", rel, abs_)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close_tree(x, y, f"{where}[{i}]", rel, abs_)
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=rel, abs_tol=abs_) or (math.isnan(a) and math.isnan(b)), f"{where}: {a} vs {b}"
    else:
        assert a == b, f"{where}: {a} vs {b}"
