"""Tracking: callbacks on the round loop, and the loggers ``--log tensorboard,mlflow,wandb``.

A :class:`Callback` sees every round of :func:`fednorm.api.run` (see :mod:`.callback`). The
loggers are callbacks chosen with the config's ``log`` list and set up with ``log_args``
(per logger, e.g. ``{mlflow: {tracking_uri: http://host:5000}}``). Each logger's package is an
optional extra imported only when chosen; a missing one is a :class:`~fednorm.errors.ConfigError`
that says what to install.
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import ConfigError
from .callback import Callback, FunctionCallback, as_callback, as_callbacks, call_all

__all__ = ["Callback", "FunctionCallback", "as_callback", "as_callbacks", "call_all", "LOGGERS", "build_loggers"]


def _tensorboard(**kw: Any) -> Callback:
    from .tensorboard import TensorBoardLogger

    return TensorBoardLogger(**kw)


def _mlflow(**kw: Any) -> Callback:
    from .mlflow_logger import MlflowLogger

    return MlflowLogger(**kw)


def _wandb(**kw: Any) -> Callback:
    from .wandb_logger import WandbLogger

    return WandbLogger(**kw)


#: ``--log`` names and their builders (each imports its package only when called).
LOGGERS: dict[str, Callable[..., Callback]] = {"tensorboard": _tensorboard, "mlflow": _mlflow, "wandb": _wandb}


def build_loggers(names: list[str], log_args: dict[str, Any] | None = None) -> list[Callback]:
    """The loggers named in ``names`` (a config's ``log``), each with its ``log_args[name]`` options.

    Raises:
        ConfigError: an unknown logger, options for a logger that is not chosen or that it does
            not take, or a logger whose package is not installed.
    """
    log_args = dict(log_args or {})
    unknown = [n for n in [*names, *log_args] if n not in LOGGERS]
    if unknown:
        raise ConfigError(f"unknown logger '{unknown[0]}' in log/log_args; choose from {', '.join(LOGGERS)}")
    unused = [n for n in log_args if n not in names]
    if unused:
        raise ConfigError(f"log_args has options for '{unused[0]}', which is not in log ({', '.join(names) or 'empty'}): "
                          f"add --log {unused[0]}")
    out = []
    for name in dict.fromkeys(names):
        options = log_args.get(name) or {}
        if not isinstance(options, dict):
            raise ConfigError(f"log_args.{name} must be a mapping of options, got {options!r}")
        try:
            out.append(LOGGERS[name](**options))
        except TypeError as exc:
            raise ConfigError(f"log_args.{name}: {exc}") from None
    return out
