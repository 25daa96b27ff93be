"""CIFAR-style VGG (HBN Table 5's VGG-11; Chen et al., 2025).

HBN uses torchvision's ImageNet VGG (three-layer 4096-wide classifier on 7×7×512 maps, dropout
replaced by Identity, in the authors' released code). For 32×32 inputs fednorm uses the common CIFAR form
instead: the same convolutional configuration, a norm after every convolution, and a single
``Linear(512 → C)`` classifier on the 1×1×512 map left by the five pools. This choice keeps the
model small enough for federated simulation and gives the penultimate 512-d features FN needs.
"""

from __future__ import annotations

from typing import Sequence, Union

import torch
from torch import nn

from ..nn.norms import NormSpec, get_norm_layer
from .base import ClassifierModel, maybe_max_pool, to_hw, validate_common
from .registry import register_model

__all__ = ["VGG", "VGG11_CFG", "vgg11"]

#: VGG-11 ("A" in Simonyan & Zisserman 2015): widths, with ``"M"`` a 2×2 max-pool.
VGG11_CFG: tuple[Union[int, str], ...] = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class VGG(ClassifierModel):
    """VGG features ``Conv2d(k3, p1) → Norm → ReLU`` per width and ``MaxPool(2)`` per ``"M"``.

    After the features, ``AdaptiveAvgPool2d(1)`` reduces the map to 1×1 (a no-op on 32×32 inputs,
    which already end at 1×1; it keeps ``num_features`` at the last width for larger inputs), then
    the head ``Linear(last width → C)``. Pools that would shrink a map below 1×1 are skipped
    (8×8 and 16×16 inputs). Convolutions keep their bias (torchvision's VGG-BN does too); torch's
    default initialization.

    Args:
        cfg: layer configuration (default: :data:`VGG11_CFG`).
        num_classes: number of logits.
        in_channels: input channels.
        input_size: input ``(H, W)`` or side length.
        norm_layer: norm specification, resolved by ``get_norm_layer``.
    """

    def __init__(
        self,
        cfg: Sequence[Union[int, str]] = VGG11_CFG,
        *,
        num_classes: int = 10,
        in_channels: int = 3,
        input_size: int | Sequence[int] = 32,
        norm_layer: NormSpec = "bn",
    ) -> None:
        super().__init__()
        validate_common(num_classes, in_channels)
        norm_layer = get_norm_layer(norm_layer)
        hw = to_hw(input_size)
        layers: list[nn.Module] = []
        channels = in_channels
        for item in cfg:
            if item == "M":
                pool, hw = maybe_max_pool(hw)
                layers.append(pool)
            elif isinstance(item, int) and item > 0:
                layers += [nn.Conv2d(channels, item, 3, 1, 1), norm_layer(item), nn.ReLU(inplace=True)]
                channels = item
            else:
                raise ValueError(f"VGG cfg entries must be positive ints or 'M', got {item!r}")
        if not any(isinstance(m, nn.Conv2d) for m in layers):
            raise ValueError("VGG cfg must contain at least one convolution")
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.num_features = channels
        self.num_classes = num_classes
        self.head = nn.Linear(channels, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.pool(self.features(x)), 1)


@register_model()
def vgg11(
    *,
    num_classes: int = 10,
    in_channels: int = 3,
    input_size: int | Sequence[int] = 32,
    norm_layer: NormSpec = "bn",
) -> VGG:
    """CIFAR-style VGG-11 with a norm after each conv and a ``Linear(512 → C)`` head; see :class:`VGG`."""
    return VGG(VGG11_CFG, num_classes=num_classes, in_channels=in_channels, input_size=input_size, norm_layer=norm_layer)
