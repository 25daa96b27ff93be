"""The normalization policy: what aggregation does with the tensors of every BatchNorm-type
layer, as two named settings instead of a choice buried in each method.

``buffers`` (``running_mean``, ``running_var``, ``num_batches_tracked``) and ``affine``
(``weight``, ``bias``) each take one of

* ``global``: sent by the clients and combined by the server (FedAvg averages the statistics
  like weights; ``num_batches_tracked``, an integer counter, takes the maximum and is never
  averaged as a float);
* ``local``: never leave the client, each client keeps its own (FedBN keeps both, SiloBN the
  buffers), so every client is evaluated with its own model;
* ``drop``: not sent; the server recomputes them by the method's own protocol (FBN aggregates
  the clients' per-step statistics, HBN pools a statistics pass) and broadcasts the result.

Each method states its default and the settings it supports (``fednorm list methods --verbose``);
asking for another is a :class:`~fednorm.errors.ConfigError`, never a silent override. The
policy covers every ``_BatchNorm`` subclass (BN, FBN, HBN layers); GroupNorm and LayerNorm
hold no statistics and their affine parameters are averaged like any weight. Method-specific
tensors (HBN's mixing logit ``alpha``) stay the method's own choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import nn

from ..errors import ConfigError
from ..nn.state import state_keys

__all__ = ["Placement", "PLACEMENTS", "NormPolicy", "norm_buffer_keys", "norm_affine_keys", "resolve_policy"]

Placement = Literal["global", "local", "drop"]
PLACEMENTS: tuple[str, ...] = ("global", "local", "drop")

_MEANING = {"global": "sent and combined by the server", "local": "kept on each client",
            "drop": "not sent, recomputed by the method's protocol"}


def _is_bn(module: nn.Module) -> bool:
    return isinstance(module, nn.modules.batchnorm._BatchNorm)


def norm_buffer_keys(model: nn.Module) -> set[str]:
    """Persistent buffers of BatchNorm-type layers (statistics and counter)."""
    return state_keys(model, _is_bn, which="buffers")


def norm_affine_keys(model: nn.Module) -> set[str]:
    """``weight`` and ``bias`` of BatchNorm-type layers."""
    return state_keys(model, _is_bn, which="parameters", names=("weight", "bias"))


@dataclass(frozen=True)
class NormPolicy:
    """Where the buffers and the affine parameters of BatchNorm-type layers go."""

    buffers: Placement = "global"
    affine: Placement = "global"

    def keys(self, model: nn.Module, where: Placement) -> set[str]:
        """The model's keys this policy places ``where``."""
        out: set[str] = set()
        if self.buffers == where:
            out |= norm_buffer_keys(model)
        if self.affine == where:
            out |= norm_affine_keys(model)
        return out

    def describe(self) -> str:
        return f"buffers {self.buffers} ({_MEANING[self.buffers]}), affine {self.affine} ({_MEANING[self.affine]})"


def resolve_policy(method: str, default: NormPolicy, allowed_buffers: tuple[str, ...], allowed_affine: tuple[str, ...],
                   buffers: str | None = None, affine: str | None = None) -> NormPolicy:
    """``default`` with the requested settings, or a :class:`ConfigError` naming the conflict."""
    for kind, value, allowed, dflt in (("buffers", buffers, allowed_buffers, default.buffers),
                                       ("affine", affine, allowed_affine, default.affine)):
        if value is None:
            continue
        if value not in PLACEMENTS:
            raise ConfigError(f"{kind} must be one of {', '.join(PLACEMENTS)}, got {value!r}")
        if value not in allowed:
            other = f"; it supports {kind} {' or '.join(allowed)}" if len(allowed) > 1 else ""
            raise ConfigError(
                f"method '{method}' keeps the BatchNorm {kind} {dflt} ({_MEANING[dflt]}) and cannot run with "
                f"--{kind} {value}{other} (see `fednorm list methods --verbose`)"
            )
    return NormPolicy(buffers or default.buffers, affine or default.affine)  # type: ignore[arg-type]
