"""Weight standardization (Qiao et al. 2019, arXiv:1903.10520) and the ``gn_ws`` norm.

A weight-standardized convolution convolves with its weight standardized per output channel:

.. math::

    \\hat W_{o} = \\frac{W_{o} - \\mathrm{mean}(W_{o})}{\\sqrt{\\mathrm{var}(W_{o}) + \\epsilon}}

over the ``C_in/g · k_h · k_w`` entries of output channel ``o`` (biased variance), as timm's
``StdConv2d`` computes it (``F.batch_norm`` over the weight, ``eps=1e-6``); the WS paper's code
divides by the unbiased standard deviation plus 1e-5 instead, a difference of order 1/fan-in.
The stored parameter stays the raw ``W`` (what FedAvg averages); only the forward uses ``Ŵ``.

``--norm gn_ws`` is GroupNorm in every norm site plus every ``Conv2d`` of the model converted to
:class:`StdConv2d` (GN+WS, the batch-free combination the later FL literature reports strongest
under label skew; issue 21). The conversion is :func:`convert_weight_standardization`, in the
manner of ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``; :func:`revert_weight_standardization`
undoes it. The vectorized executor runs it as ``StackedStdConv2d`` (each client's own filters
standardized). NF-Nets' scaled variant with a learnable gain, :class:`ScaledStdConv2d`, is FedWon's
(``--norm fedwon``, :mod:`fednorm.nn.nf`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .norms import create_group_norm, register_norm

__all__ = ["StdConv2d", "standardize_weight", "convert_weight_standardization", "revert_weight_standardization",
           "create_group_norm_ws", "ScaledStdConv2d", "scaled_standardize_weight", "RELU_GAIN"]

#: ``γ`` of ReLU for scaled WS (NF-ResNets): ``1 / sqrt(Var[relu(z)])`` for ``z ~ N(0, 1)``.
RELU_GAIN = math.sqrt(2.0 / (1.0 - 1.0 / math.pi))


def standardize_weight(weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``weight`` standardized over its last three axes (``C_in/g, k_h, k_w``) per output channel:
    zero mean, unit (biased) variance up to ``eps``. Leading axes (``C_out``, or ``K, C_out`` for a
    stacked weight) index independent channels."""
    dims = (-3, -2, -1)
    var, mean = torch.var_mean(weight, dim=dims, keepdim=True, correction=0)
    return (weight - mean) / torch.sqrt(var + eps)


class StdConv2d(nn.Conv2d):
    """``nn.Conv2d`` whose forward uses the weight standardized per output channel
    (:func:`standardize_weight`). Subclasses ``nn.Conv2d``, so state-dict keys and every
    ``isinstance(m, nn.Conv2d)`` selection are unchanged.

    Args:
        *args: as ``nn.Conv2d``.
        **kwargs: as ``nn.Conv2d``.
        eps: added to the per-channel variance (default: 1e-6, timm's ``StdConv2d``).
    """

    def __init__(self, *args: Any, eps: float = 1e-6, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, standardize_weight(self.weight, self.eps), self.bias)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", eps={self.eps}"


def scaled_standardize_weight(weight: torch.Tensor, gain: torch.Tensor, gamma: float, eps: float) -> torch.Tensor:
    """``gain · γ · standardize(W) / sqrt(fan_in)`` per output channel (the last three axes are
    one channel's fan-in; leading axes index channels, or clients and channels)."""
    fan_in = weight.shape[-3] * weight.shape[-2] * weight.shape[-1]
    return gain * (gamma / math.sqrt(fan_in)) * standardize_weight(weight, eps)


class ScaledStdConv2d(StdConv2d):
    """``nn.Conv2d`` with NF-Nets' scaled weight standardization and a learnable per-channel gain
    (``gain``, shape ``[C_out, 1, 1, 1]``, initialised to 1).

    Args:
        *args: as ``nn.Conv2d``.
        **kwargs: as ``nn.Conv2d``.
        gamma: the nonlinearity's gain γ (default: ``RELU_GAIN`` = √(2/(1 − 1/π)), ReLU's).
        eps: added to the per-channel variance (default: 1e-6, timm's ``ScaledStdConv2d``).
    """

    def __init__(self, *args: Any, gamma: float = RELU_GAIN, eps: float = 1e-6, **kwargs: Any) -> None:
        super().__init__(*args, eps=eps, **kwargs)
        self.gamma = float(gamma)
        self.gain = nn.Parameter(torch.ones(self.out_channels, 1, 1, 1, device=self.weight.device, dtype=self.weight.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, scaled_standardize_weight(self.weight, self.gain, self.gamma, self.eps), self.bias)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", gamma={self.gamma:.4g}"


def convert_weight_standardization(module: nn.Module, eps: float = 1e-6, scaled: bool = False, gamma: float | None = None) -> nn.Module:
    """Replace every ``nn.Conv2d`` of ``module`` (not already a :class:`StdConv2d`) with a
    :class:`StdConv2d` holding the same parameters; returns the new root if the root is a conv.
    ``scaled=True``: NF-Nets' scaled WS with a learnable gain instead
    (:class:`ScaledStdConv2d`, ``gamma`` its nonlinearity gain; FedWon)."""
    out = module
    if type(module) is nn.Conv2d:
        extra: dict[str, Any] = {}
        cls: type[StdConv2d] = StdConv2d
        if scaled:
            cls, extra = ScaledStdConv2d, {"gamma": RELU_GAIN if gamma is None else gamma}
        out = cls(
            module.in_channels, module.out_channels, module.kernel_size, module.stride, module.padding,
            module.dilation, module.groups, module.bias is not None, module.padding_mode, eps=eps,
            device=module.weight.device, dtype=module.weight.dtype, **extra,
        )
        with torch.no_grad():
            out.weight = module.weight
            if module.bias is not None:
                out.bias = module.bias
        out.train(module.training)
    for name, child in module.named_children():
        out.add_module(name, convert_weight_standardization(child, eps, scaled, gamma))
    return out


def revert_weight_standardization(module: nn.Module) -> nn.Module:
    """Undo :func:`convert_weight_standardization`: every :class:`StdConv2d` back to ``nn.Conv2d``
    with the same (raw) parameters."""
    out = module
    if isinstance(module, StdConv2d) and hasattr(module, "gain"):
        raise ValueError("a ScaledStdConv2d (FedWon) has a learned gain that a plain Conv2d cannot hold; it is not reverted")
    if isinstance(module, StdConv2d):
        out = nn.Conv2d(
            module.in_channels, module.out_channels, module.kernel_size, module.stride, module.padding,
            module.dilation, module.groups, module.bias is not None, module.padding_mode,
            device=module.weight.device, dtype=module.weight.dtype,
        )
        out.weight = module.weight
        if module.bias is not None:
            out.bias = module.bias
        out.train(module.training)
    for name, child in module.named_children():
        out.add_module(name, revert_weight_standardization(child))
    return out


def _ws_placement(ws_eps: float = 1e-6, **_: Any) -> dict[str, Any]:
    return {"weight_standardization": {"eps": ws_eps}}


@register_norm("gn_ws")
def create_group_norm_ws(
    num_features: int,
    *,
    spatial: bool = True,
    num_groups: int = 2,
    eps: float = 1e-5,
    affine: bool = True,
    ws_eps: float = 1e-6,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """GN+WS: ``GroupNorm`` at every norm site (as ``gn``: ``num_groups`` default 2) and every
    ``Conv2d`` of the model weight-standardized (:class:`StdConv2d`, ``ws_eps``), applied by
    :func:`fednorm.models.get_model`.

    Args:
        num_features, spatial, num_groups, eps, affine, device, dtype: as the ``gn`` norm.
        ws_eps: the weight standardization's eps (default: 1e-6, timm's ``StdConv2d``).
    """
    del ws_eps  # used by the placement (the model's convolutions), not the norm layer
    return create_group_norm(num_features, spatial=spatial, num_groups=num_groups, eps=eps, affine=affine,
                             device=device, dtype=dtype)


create_group_norm_ws.placement = _ws_placement  # type: ignore[attr-defined]
