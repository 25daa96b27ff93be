"""MobileNetV2 (Sandler et al., 2018; HBN Table 5, Chen et al., 2025), torchvision's layers.

HBN trains torchvision's ``mobilenet_v2`` on 32×32 CIFAR-100 with every BatchNorm replaced and
its dropout replaced by Identity (the authors' released ``Nets.py``). fednorm builds the same
layers with the norm from ``norm_layer``, under torchvision's module names (``features.N.conv.M``),
so torchvision's ImageNet checkpoints load (``pretrained=PATH``; :mod:`fednorm.models.pretrained`);
only the classifier's ``Linear`` is fednorm's ``head``.
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch
from torch import nn

from ..nn.norms import NormLayer, NormSpec, get_norm_layer
from .base import ClassifierModel, to_hw, validate_common
from .pretrained import PretrainedNorm, load_torchvision_weights
from .registry import register_model

__all__ = ["InvertedResidual", "MobileNetV2", "mobilenet_v2", "from_torchvision_key", "to_torchvision_key"]

Stem = Literal["cifar", "imagenet"]

#: torchvision's inverted-residual setting: expansion t, output channels c, blocks n, first stride s.
MOBILENET_V2_CFG: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1),
)


def _conv_norm_act(in_ch: int, out_ch: int, kernel: int, stride: int, norm_layer: NormLayer, groups: int = 1) -> nn.Sequential:
    """torchvision's ``Conv2dNormActivation`` with ReLU6: ``[Conv2d (no bias), Norm, ReLU6]``, same padding."""
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        norm_layer(out_ch),
        nn.ReLU6(inplace=True),
    )


class InvertedResidual(nn.Module):
    """torchvision's MobileNetV2 block: 1×1 expansion (when ``expand_ratio > 1``), 3×3 depthwise
    conv with ``stride``, 1×1 linear projection and its norm; a residual connection when the stride
    is 1 and the channel count does not change."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, expand_ratio: int, norm_layer: NormLayer) -> None:
        super().__init__()
        hidden = int(round(in_ch * expand_ratio))
        self.use_res_connect = stride == 1 and in_ch == out_ch
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(_conv_norm_act(in_ch, hidden, 1, 1, norm_layer))
        layers += [
            _conv_norm_act(hidden, hidden, 3, stride, norm_layer, groups=hidden),
            nn.Conv2d(hidden, out_ch, 1, 1, 0, bias=False),
            norm_layer(out_ch),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(ClassifierModel):
    """MobileNetV2 (width 1.0): a 3×3 stem conv to 32 channels, 17 inverted-residual blocks
    (:data:`MOBILENET_V2_CFG`), a 1×1 conv to 1280 channels, global average pooling, an optional
    dropout and the head ``Linear(1280 → C)``. Every conv is followed by ``norm_layer`` and has no
    bias; activations are ReLU6; torchvision's initialisation (convs ``kaiming_normal_(mode=
    "fan_out")``, the head ``N(0, 0.01)`` with zero bias, norms 1 and 0).

    Args:
        num_classes: number of logits.
        in_channels: input channels.
        input_size: validated only; the network is size-agnostic thanks to global pooling.
        norm_layer: norm specification, resolved by ``get_norm_layer``.
        stem: ``"imagenet"``: torchvision's strides (stem stride 2, then 2 at the 24-, 32-, 64- and
            160-channel stages: a 32×32 input ends at 1×1, as in HBN's runs); ``"cifar"`` (default):
            stem stride 1 and stride 1 at the 24-channel stage, the usual CIFAR adaptation (a 32×32
            input ends at 4×4). Both have the same parameters, so a checkpoint loads into either.
        dropout: dropout before the head (default: 0.0, HBN's code, which replaces torchvision's
            ``Dropout(0.2)`` by Identity).
    """

    def __init__(
        self,
        *,
        num_classes: int = 10,
        in_channels: int = 3,
        input_size: int | Sequence[int] = 32,
        norm_layer: NormSpec = "bn",
        stem: Stem = "cifar",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        validate_common(num_classes, in_channels)
        to_hw(input_size)
        if stem not in ("cifar", "imagenet"):
            raise ValueError(f"Unknown value '{stem}' for argument stem. Valid values are ('cifar', 'imagenet')")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        norm_layer = get_norm_layer(norm_layer)
        channels = 32
        features: list[nn.Module] = [_conv_norm_act(in_channels, channels, 3, 2 if stem == "imagenet" else 1, norm_layer)]
        for stage, (t, c, n, s) in enumerate(MOBILENET_V2_CFG):
            if stem == "cifar" and stage == 1:
                s = 1
            for i in range(n):
                features.append(InvertedResidual(channels, c, s if i == 0 else 1, t, norm_layer))
                channels = c
        features.append(_conv_norm_act(channels, 1280, 1, 1, norm_layer))
        self.features = nn.Sequential(*features)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.num_features = 1280
        self.num_classes = num_classes
        self.head = nn.Linear(1280, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(torch.flatten(self.pool(self.features(x)), 1))


@register_model()
def mobilenet_v2(
    *,
    num_classes: int = 10,
    in_channels: int = 3,
    input_size: int | Sequence[int] = 32,
    norm_layer: NormSpec = "bn",
    stem: Stem = "cifar",
    dropout: float = 0.0,
    pretrained: str | None = None,
    pretrained_norm: PretrainedNorm = "fresh",
) -> MobileNetV2:
    """MobileNetV2 (HBN Table 5): 52 convolutions each followed by a norm; 2,223,872 + 1281·C
    parameters with BN (3,504,872 with 1000 classes, torchvision's count). ``stem="imagenet"`` is
    torchvision's (HBN's) stride schedule; ``pretrained=PATH`` loads torchvision's ImageNet checkpoint
    (``mobilenet_v2-b0353104.pth``; :mod:`fednorm.models.pretrained`). See :class:`MobileNetV2`."""
    model = MobileNetV2(num_classes=num_classes, in_channels=in_channels, input_size=input_size, norm_layer=norm_layer,
                        stem=stem, dropout=dropout)
    if pretrained is not None:
        load_torchvision_weights(model, pretrained, from_torchvision_key, norm=pretrained_norm, arch="mobilenet_v2")
    return model


def from_torchvision_key(key: str) -> str:
    """A torchvision MobileNetV2 key as :class:`MobileNetV2`'s: the same but ``classifier.1`` -> ``head``."""
    return "head." + key[len("classifier.1."):] if key.startswith("classifier.1.") else key


def to_torchvision_key(key: str) -> str:
    """The inverse of :func:`from_torchvision_key`."""
    return "classifier.1." + key[len("head."):] if key.startswith("head.") else key
