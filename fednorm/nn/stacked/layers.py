"""Stacked weighted layers: K clients' ``Conv2d`` (plain and weight-standardized), ``Linear`` and
ResNet's option-A shortcut, each computing every client's own output in the client layout."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layout import NotStackableError, repeat_clients

__all__ = ["StackedConv2d", "StackedStdConv2d", "StackedScaledStdConv2d", "StackedLinear", "ClientPadShortcut"]


class StackedConv2d(nn.Module):
    """K clients' ``Conv2d`` as one grouped convolution; ``weight`` is ``[K, C_out, C_in/g, kh, kw]``."""

    def __init__(self, conv: nn.Conv2d, num_clients: int) -> None:
        super().__init__()
        if conv.padding_mode != "zeros":
            raise NotStackableError(f"Conv2d with padding_mode='{conv.padding_mode}' is not supported")
        self.out_channels = conv.out_channels
        self.stride, self.padding, self.dilation, self.groups = conv.stride, conv.padding, conv.dilation, conv.groups
        self.weight = nn.Parameter(repeat_clients(conv.weight, num_clients), requires_grad=conv.weight.requires_grad)
        self.bias = None if conv.bias is None else nn.Parameter(repeat_clients(conv.bias, num_clients), requires_grad=conv.bias.requires_grad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.weight.shape[0]
        w = self.weight.reshape(k * self.out_channels, *self.weight.shape[2:])
        b = None if self.bias is None else self.bias.reshape(-1)
        return F.conv2d(x, w, b, self.stride, self.padding, self.dilation, k * self.groups)

    def extra_repr(self) -> str:
        return f"clients={self.weight.shape[0]}, weight={tuple(self.weight.shape[1:])}, stride={self.stride}, padding={self.padding}"


class StackedStdConv2d(StackedConv2d):
    """K clients' weight-standardized ``Conv2d`` (:class:`~fednorm.nn.weight_std.StdConv2d`): each
    client's filters standardized per output channel, then one grouped convolution."""

    def __init__(self, conv: nn.Conv2d, num_clients: int) -> None:
        super().__init__(conv, num_clients)
        self.eps = conv.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from ..weight_std import standardize_weight

        k = self.weight.shape[0]
        w = standardize_weight(self.weight, self.eps).reshape(k * self.out_channels, *self.weight.shape[2:])
        b = None if self.bias is None else self.bias.reshape(-1)
        return F.conv2d(x, w, b, self.stride, self.padding, self.dilation, k * self.groups)


class StackedScaledStdConv2d(StackedConv2d):
    """K clients' :class:`~fednorm.nn.weight_std.ScaledStdConv2d` (FedWon): each client's filters
    standardized, scaled by ``γ/sqrt(fan_in)`` and its own gain ``[K, C_out, 1, 1, 1]``."""

    def __init__(self, conv: nn.Conv2d, num_clients: int) -> None:
        super().__init__(conv, num_clients)
        self.eps, self.gamma = conv.eps, conv.gamma
        self.gain = nn.Parameter(repeat_clients(conv.gain, num_clients), requires_grad=conv.gain.requires_grad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from ..weight_std import scaled_standardize_weight

        k = self.weight.shape[0]
        w = scaled_standardize_weight(self.weight, self.gain, self.gamma, self.eps)
        w = w.reshape(k * self.out_channels, *self.weight.shape[2:])
        b = None if self.bias is None else self.bias.reshape(-1)
        return F.conv2d(x, w, b, self.stride, self.padding, self.dilation, k * self.groups)


class StackedLinear(nn.Module):
    """K clients' ``Linear`` as a batched product; input ``[B, K·in]``, ``weight`` ``[K, out, in]``."""

    def __init__(self, linear: nn.Linear, num_clients: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(repeat_clients(linear.weight, num_clients), requires_grad=linear.weight.requires_grad)
        self.bias = None if linear.bias is None else nn.Parameter(repeat_clients(linear.bias, num_clients), requires_grad=linear.bias.requires_grad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.weight.shape[0]
        b = x.shape[0]
        # Computed transposed, Y^T = W X^T ([K, out, B]): the weight is then the product's left
        # operand as stored, so its gradient comes out contiguous and autograd does not copy it
        # (with X W^T the gradient is a transposed view, copied every step: 2x slower for the
        # FedBN CNN's 6272x2048 layer, and never faster for small layers; benchmarks/stacked_linear.py).
        xt = x.reshape(b, k, self.in_features).permute(1, 2, 0)  # [K, in, B], a view
        if self.bias is None:
            yt = torch.bmm(self.weight, xt)
        else:
            yt = torch.baddbmm(self.bias.unsqueeze(2), self.weight, xt)
        return yt.permute(2, 0, 1).reshape(b, k * self.out_features)

    def extra_repr(self) -> str:
        return f"clients={self.weight.shape[0]}, in={self.in_features}, out={self.out_features}"


class ClientPadShortcut(nn.Module):
    """Option-A ResNet shortcut (stride + zero channel padding) applied per client."""

    def __init__(self, shortcut: nn.Module) -> None:
        super().__init__()
        self.in_planes = shortcut.in_planes
        self.stride = shortcut.stride
        self.pad_front, self.pad_back = shortcut.pad_front, shortcut.pad_back

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        b, kc, h, w = x.shape
        k = kc // self.in_planes
        y = F.pad(x.reshape(b, k, self.in_planes, h, w), (0, 0, 0, 0, self.pad_front, self.pad_back))
        return y.reshape(b, -1, h, w)
