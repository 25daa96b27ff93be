"""Validation of optimizer hyper-parameters: one line naming the option, as every config error."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError

__all__ = ["check_number"]


def check_number(
    name: str, value: Any, low: float, high: float | None = None, *, low_open: bool = False, high_open: bool = True
) -> float:
    """``value`` as a float, or ConfigError unless it is a number within the given bounds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ConfigError(f"{name} must be a number, got {value!r}")
    bad_low = value < low or (low_open and value == low)
    bad_high = high is not None and (value > high or (high_open and value == high))
    if bad_low and high is None:
        raise ConfigError(f"{name} must be {'>' if low_open else '>='} {low}, got {value!r}")
    if bad_low or bad_high:
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        raise ConfigError(f"{name} must be in {lo}{low}, {high}{hi}, got {value!r}")
    return float(value)
