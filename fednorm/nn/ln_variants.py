"""The LN paper's normalisation variants, selectable by name (``--norm fn``, ``--norm ln_static``, ...).

Zhang et al., "Understanding the Role of Layer Normalization in Label-Skewed Federated Learning"
(TMLR 2024; Sec. 2, Sec. 4.1, Tables 3, 6, 13) compare LN and FN in several forms.
Some differ only in the layer (static vs learnable LN); others also differ in *where* the
layers sit (before the activation, only on the residual-block outputs, FN before the head).
A norm name therefore carries, besides its layer builder, a **placement**: model options that
:func:`fednorm.models.get_model` passes to the model builder (``norm_position``,
``last_norm``, ``norm_sites``) and whether FN goes before the head. :func:`norm_placement`
reads it; a model without the needed option is refused with a clear message.

=================  =================================================================  ==================
name               what                                                               paper
=================  =================================================================  ==================
``ln``             GroupNorm(1, C), learnable per-channel affine, after every ReLU    FedLN – learnable
``ln_static``      GroupNorm(1, C) without affine (plain ψ)                           FedLN – static
``ln_before``      ``ln`` placed before each activation (``norm_position=before``)    FedLN – before
``ln_reduced``     shift S at every hidden site, static ψ at the last one (Prop. 2)   FedLN reduced
``fn``             no norm in the body, FN φ on the penultimate features              FedFN
``fn_every``       φ (scale norm over C×H×W) after every activation (Prop. 1)        FedFN – every layer
``fn_inside_ln``   FN + static ψ on every residual block's output (ResNet only)       FedFN – inside ψ
``fn_inside_sn``   FN + φ on every residual block's output (ResNet only)              FedFN – inside φ
``shift``          the shift operator S alone (building block of ``ln_reduced``)      –
=================  =================================================================  ==================

``ln`` and ``gn`` are registered in :mod:`fednorm.nn.norms`. FN composes with any body norm
through ``model_args: {feature_norm: true}`` (e.g. LN in the body and FN before the head).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch import nn

from .feature_norm import feature_norm
from .norms import register_norm

__all__ = [
    "ScaleNorm",
    "Shift",
    "norm_placement",
    "create_static_layer_norm",
    "create_layer_norm_before",
    "create_reduced_layer_norm",
    "create_feature_norm_head",
    "create_scale_norm",
    "create_shift",
    "create_fn_inside_ln",
    "create_fn_inside_sn",
]


class ScaleNorm(nn.Module):
    """φ on every sample over all its non-batch dimensions: ``sqrt(d) x / max(||x||, eps)``, d = C·H·W.

    The LN paper's scale normalisation used as a layer (``'v'`` at every site in the code;
    FedFN – every layer, Zhang et al., 2024, Table 3). Parameter-free, the same in training and
    evaluation. On ``(N, d)`` features it is :class:`~fednorm.nn.FeatureNorm`.

    Args:
        num_features: channel count C (accepted so that it is ``norm_layer(C)``; not checked).
        eps: lower bound on the norm (default: 1e-12, as ``F.normalize``).
    """

    def __init__(self, num_features: int | None = None, eps: float = 1e-12) -> None:
        super().__init__()
        self.num_features = num_features
        self.eps = float(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2:
            raise ValueError(f"expected input (N, C, ...) (got {x.dim()}D input)")
        return feature_norm(x.flatten(1), self.eps).view_as(x)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}"


class Shift(nn.Module):
    """The shift operator S: subtract each sample's mean over all its non-batch dimensions.

    ``S(x) = x − μ(x)·1`` (Zhang et al., 2024, Sec. 4.1). ψ = φ ∘ S, and Prop. 2 says LN at every
    layer of a bias-free ReLU net equals S at the hidden layers plus ψ at the last one.
    Parameter-free.
    """

    def __init__(self, num_features: int | None = None) -> None:
        super().__init__()
        self.num_features = num_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2:
            raise ValueError(f"expected input (N, C, ...) (got {x.dim()}D input)")
        mean = x.flatten(1).mean(dim=1)
        return x - mean.view(-1, *([1] * (x.dim() - 1)))

    def extra_repr(self) -> str:
        return f"{self.num_features}"


# --------------------------------------------------------------------------------------------
# Placement: model options a norm name implies.


def _with_placement(fn: Callable[..., dict[str, Any]]) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Attach ``placement(**norm_kwargs) -> dict`` to a norm builder."""

    def decorate(builder: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        builder.placement = fn  # type: ignore[attr-defined]
        return builder

    return decorate


def norm_placement(norm_layer: Any) -> dict[str, Any]:
    """The model options implied by a resolved norm builder (``{}`` for ordinary norms).

    Keys: ``norm_position`` (``"before"``/``"after"`` the activation), ``last_norm`` (a norm
    builder for the last hidden site), ``norm_sites`` (``"block_output"``: only on residual-block
    outputs) and ``feature_norm`` (a dict of FN options: FN before the head).
    """
    func, kwargs = norm_layer, {}
    if isinstance(norm_layer, functools.partial) and not norm_layer.args:
        func, kwargs = norm_layer.func, dict(norm_layer.keywords)
    placement = getattr(func, "placement", None)
    return dict(placement(**kwargs)) if placement is not None else {}


# --------------------------------------------------------------------------------------------
# Builders.


@register_norm("ln_static")
def create_static_layer_norm(num_features: int, *, spatial: bool = True, eps: float = 1e-5) -> nn.Module:
    """FedLN – static: ``GroupNorm(1, C, affine=False)``, plain MV normalisation ψ (Table 6)."""
    del spatial
    return nn.GroupNorm(1, num_features, eps=eps, affine=False)


@register_norm("ln_before")
@_with_placement(lambda **kw: {"norm_position": "before"})
def create_layer_norm_before(num_features: int, *, spatial: bool = True, eps: float = 1e-5, affine: bool = True) -> nn.Module:
    """FedLN – before activation: ``ln`` placed between each conv/linear and its ReLU (Table 6)."""
    del spatial
    return nn.GroupNorm(1, num_features, eps=eps, affine=affine)


@register_norm("ln_reduced")
@_with_placement(lambda eps=1e-5, **kw: {"last_norm": functools.partial(create_static_layer_norm, eps=eps)})
def create_reduced_layer_norm(num_features: int, *, spatial: bool = True, eps: float = 1e-5) -> nn.Module:
    """FedLN reduced (Prop. 2; code ``[s,s,s,sv]``): S at hidden sites, static ψ at the last one.

    ``eps`` is the last site's ψ guard (default: 1e-5, GroupNorm's).
    """
    del spatial, eps
    return Shift(num_features)


@register_norm("fn")
@_with_placement(lambda eps=1e-12, scale=None: {"feature_norm": {"eps": eps, "scale": scale}})
def create_feature_norm_head(num_features: int, *, spatial: bool = True, eps: float = 1e-12, scale: float | None = None) -> nn.Module:
    """FedFN: no normalisation in the body (``nn.Identity``) and FN before the head.

    ``eps``/``scale`` go to :class:`~fednorm.nn.FeatureNorm` (defaults: 1e-12, sqrt(d)).
    """
    del num_features, spatial, eps, scale
    return nn.Identity()


@register_norm("fn_every")
def create_scale_norm(num_features: int, *, spatial: bool = True, eps: float = 1e-12) -> nn.Module:
    """FedFN – every layer (Table 3; code ``[v,v,v,v]``): :class:`ScaleNorm` at every site."""
    del spatial
    return ScaleNorm(num_features, eps)


@register_norm("shift")
def create_shift(num_features: int, *, spatial: bool = True) -> nn.Module:
    """The shift operator S at every site (:class:`Shift`); ``ln_reduced`` without its last ψ."""
    del spatial
    return Shift(num_features)


_INSIDE = {"norm_position": "after", "norm_sites": "block_output"}


@register_norm("fn_inside_ln")
@_with_placement(lambda eps=1e-5: {**_INSIDE, "feature_norm": {}})
def create_fn_inside_ln(num_features: int, *, spatial: bool = True, eps: float = 1e-5) -> nn.Module:
    """FedFN – inside ψ (Zhang et al., 2024, Table 13, ResNet; experimental: the paper elides the
    block formulas): FN before the head plus a
    static ψ on the post-ReLU output of every residual block."""
    del spatial
    return nn.GroupNorm(1, num_features, eps=eps, affine=False)


@register_norm("fn_inside_sn")
@_with_placement(lambda eps=1e-12: {**_INSIDE, "feature_norm": {}})
def create_fn_inside_sn(num_features: int, *, spatial: bool = True, eps: float = 1e-12) -> nn.Module:
    """FedFN – inside φ (Table 13, ResNet; experimental): FN before the head plus φ
    (:class:`ScaleNorm`) on the post-ReLU output of every residual block."""
    del spatial
    return ScaleNorm(num_features, eps)
