"""Normalization-free training (FedWon; Zhuang & Lyu, ICLR 2024), the HBN paper's Table 4 row
"FedWon" (Chen et al., 2025: base, no norm: 78.85; +HBN: 79.93).

FedWon removes the normalization layers and trains with the two pieces of NF-Nets (Brock et al.
2021a, arXiv:2101.08692; 2021b, arXiv:2102.06171):

- **scaled weight standardization**: every convolution uses
  ``Ŵ_o = g_o · γ · (W_o − mean(W_o)) / (sqrt(var(W_o) + ε) · sqrt(N))`` per output channel ``o``,
  with ``N`` the fan-in (``C_in/groups · k_h · k_w``), biased variance, ``γ`` the nonlinearity's
  gain (ReLU: ``sqrt(2 / (1 − 1/π))``, NF-ResNets) and ``g_o`` a learnable gain (initialised to
  1) — :class:`~fednorm.nn.weight_std.ScaledStdConv2d`, in timm's arithmetic (``ε`` added to the
  variance; it lives with plain weight standardization and is importable from here too);
- **adaptive gradient clipping** (AGC): each unit's gradient (a row of a weight: one output
  channel or neuron; a whole bias vector) is rescaled so that
  ``‖G_i‖ ≤ λ · max(‖W_i‖, 1e-3)`` (:func:`adaptive_grad_clip_`); the classifier (``model.head``,
  else the last ``nn.Linear``: :func:`head_parameter_names`) is not clipped, as in NF-Nets. FedWon's and NF-Nets' small-batch setting is λ = 0.01.

Norms: ``--norm fedwon`` (no normalization layers, every ``Conv2d`` a :class:`ScaledStdConv2d`)
and ``--norm hbn_sws`` (FedWon with HBN plugged in: HBN at every norm site, ``--method hbn``).
Both turn AGC on at λ = 0.01 unless the config's ``agc_clip`` says otherwise (0 turns it off);
AGC also applies to any other norm when ``agc_clip`` is set. The stored parameter is the raw ``W``
(what FedAvg averages) plus the gain ``g``; the vectorized executor runs both per client
(:class:`~fednorm.nn.stacked.StackedConv2d`'s scaled variant).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from .norms import create_identity, register_norm
from .weight_std import RELU_GAIN, ScaledStdConv2d, scaled_standardize_weight

__all__ = ["ScaledStdConv2d", "RELU_GAIN", "scaled_standardize_weight", "unitwise_norm", "adaptive_grad_clip_",
           "default_agc_clip", "head_parameter_names", "FEDWON_AGC_CLIP"]

#: FedWon's and NF-Nets' AGC clipping λ at small batch sizes.
FEDWON_AGC_CLIP = 0.01


def unitwise_norm(x: torch.Tensor, lead: int = 0) -> torch.Tensor:
    """Norm of each unit of ``x``, broadcastable against it: a weight ``[out, ...]`` has one unit
    per output row; a tensor of at most one axis is one unit (NF-Nets' convention). ``lead``
    leading axes (a stacked model's client axis) are kept apart."""
    if x.dim() - lead <= 1:
        dims = tuple(range(lead, x.dim()))
    else:
        dims = tuple(range(lead + 1, x.dim()))
    return torch.linalg.vector_norm(x, dim=dims, keepdim=True) if dims else x.abs()


@torch.no_grad()
def adaptive_grad_clip_(
    params: Iterable[torch.Tensor], clip: float, eps: float = 1e-3, lead: int = 0
) -> None:
    """AGC in place on ``p.grad``: each unit's gradient scaled to at most
    ``clip · max(‖W_i‖, eps)`` (NF-Nets, Brock et al. 2021b, Eq. 3). ``lead=1`` for stacked
    parameters ``[K, ...]`` (each client's units apart)."""
    for p in params:
        g = p.grad
        if g is None:
            continue
        max_norm = unitwise_norm(p.detach(), lead).clamp(min=eps) * clip
        g_norm = unitwise_norm(g, lead)
        factor = torch.where(g_norm > max_norm, max_norm / g_norm.clamp(min=1e-6), torch.ones_like(g_norm))
        g.mul_(factor)


def head_parameter_names(model: nn.Module) -> frozenset[str]:
    """Names of the classifier's parameters, which AGC leaves alone: ``model.head``, else the
    model's last ``nn.Linear`` (:func:`~fednorm.nn.state.classifier_head`; a user's model may call
    it ``fc`` or ``classifier[-1]``).

    Raises:
        ConfigError: the model has no ``nn.Linear`` classifier (AGC would clip a classifier it
            cannot find: give the model one, or turn AGC off with ``agc_clip=0``).
    """
    from ..errors import ConfigError
    from .state import classifier_head

    head = getattr(model, "head", None)
    if not isinstance(head, nn.Module):
        try:
            head = classifier_head(model)
        except ValueError:
            raise ConfigError(f"adaptive gradient clipping leaves the classifier unclipped, and {type(model).__name__} has "
                              "no nn.Linear classifier (model.head, or a last nn.Linear): give it one, or turn AGC off "
                              "with agc_clip=0") from None
    ids = {id(p) for p in head.parameters()}
    return frozenset(n for n, p in model.named_parameters() if id(p) in ids)


def default_agc_clip(norm: Any, agc_clip: float | None) -> float | None:
    """The AGC λ of a run: ``agc_clip`` when given (0: off), else the norm's own default
    (:data:`FEDWON_AGC_CLIP` for ``fedwon`` and ``hbn_sws``, none for the others)."""
    if agc_clip is not None:
        return float(agc_clip) or None
    from .norms import NORMS

    try:
        builder = NORMS.get_builder(norm) if isinstance(norm, str) else None
    except ValueError:
        return None
    return getattr(builder, "agc_clip", None)


def _sws_placement(ws_eps: float = 1e-6, ws_gamma: float = RELU_GAIN, **_: Any) -> dict[str, Any]:
    return {"weight_standardization": {"eps": ws_eps, "scaled": True, "gamma": ws_gamma}}


@register_norm("fedwon")
def create_fedwon(num_features: int, *, spatial: bool = True, ws_eps: float = 1e-6, ws_gamma: float = RELU_GAIN) -> nn.Module:
    """FedWon: no normalization layer (``nn.Identity``) and every ``Conv2d`` of the model a
    :class:`ScaledStdConv2d` (applied by :func:`fednorm.models.get_model`); AGC at λ = 0.01.

    Args:
        num_features, spatial: ignored, as for ``none``.
        ws_eps: the standardization's eps (default: 1e-6).
        ws_gamma: γ (default: ReLU's, :data:`RELU_GAIN`).
    """
    del ws_eps, ws_gamma  # used by the placement (the model's convolutions)
    return create_identity(num_features, spatial=spatial)


@register_norm("hbn_sws")
def create_hbn_sws(
    num_features: int,
    *,
    spatial: bool = True,
    eps: float = 1e-5,
    affine: bool = True,
    ws_eps: float = 1e-6,
    ws_gamma: float = RELU_GAIN,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """FedWon with HBN plugged in: HBN at every norm site (needs ``--method hbn``), every
    ``Conv2d`` a :class:`ScaledStdConv2d`, AGC at λ = 0.01 (the HBN paper's Table 4 "FedWon +HBN").

    Args:
        num_features, spatial, eps, affine, device, dtype: as the ``hbn`` norm.
        ws_eps, ws_gamma: as ``fedwon``.
    """
    from .hbn import create_hybrid_batch_norm

    del ws_eps, ws_gamma
    return create_hybrid_batch_norm(num_features, spatial=spatial, eps=eps, affine=affine, device=device, dtype=dtype)


for _builder in (create_fedwon, create_hbn_sws):
    _builder.placement = _sws_placement  # type: ignore[attr-defined]
    _builder.agc_clip = FEDWON_AGC_CLIP  # type: ignore[attr-defined]
