"""VGG-11 and VGG-19 (HBN Table 5; Chen et al., 2025), in a CIFAR form and in torchvision's.

HBN uses torchvision's ImageNet VGG-BN (``vgg11_bn``, ``vgg19_bn``: a three-layer 4096-wide
classifier on the 7×7×512 map of ``AdaptiveAvgPool2d(7)``, dropout replaced by Identity, in the
authors' released code), on 32×32 CIFAR-100, where the five pools leave a 1×1 map that the pool
copies to 7×7. ``classifier="imagenet"`` builds exactly that (its keys are torchvision's, so its
ImageNet checkpoints load: ``pretrained=PATH``, :mod:`fednorm.models.pretrained`).
``classifier="cifar"`` (the default) is the common CIFAR form instead: the same convolutional
configuration, a norm after every convolution, and a single ``Linear(512 → C)`` classifier on the
1×1×512 map. It keeps the model small enough for federated simulation (9.2M parameters for VGG-11 with
10 classes against 128.8M) and gives the penultimate 512-d features FN needs.
"""

from __future__ import annotations

from typing import Literal, Sequence, Union

import torch
from torch import nn

from ..nn.norms import NormSpec, get_norm_layer
from .base import ClassifierModel, maybe_max_pool, to_hw, validate_common
from .pretrained import PretrainedNorm, load_torchvision_weights
from .registry import register_model

__all__ = ["VGG", "VGG11_CFG", "VGG19_CFG", "vgg11", "vgg19", "from_torchvision_key", "to_torchvision_key"]

Classifier = Literal["cifar", "imagenet"]

#: VGG-11 ("A" in Simonyan & Zisserman 2015): widths, with ``"M"`` a 2×2 max-pool.
VGG11_CFG: tuple[Union[int, str], ...] = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
#: VGG-19 ("E"): 16 convolutions.
VGG19_CFG: tuple[Union[int, str], ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"
)


class VGG(ClassifierModel):
    """VGG features ``Conv2d(k3, p1) → Norm → ReLU`` per width and ``MaxPool(2)`` per ``"M"``.

    ``classifier="cifar"``: after the features, ``AdaptiveAvgPool2d(1)`` reduces the map to 1×1 (a
    no-op on 32×32 inputs, which already end at 1×1; it keeps ``num_features`` at the last width for
    larger inputs), then the head ``Linear(last width → C)``; torch's default initialization.
    ``classifier="imagenet"``: torchvision's ``AdaptiveAvgPool2d(7)``, then
    ``classifier = [Linear(512·7·7 → 4096), ReLU, Dropout, Linear(4096 → 4096), ReLU, Dropout]`` (no
    norm, as torchvision's) and the head ``Linear(4096 → C)``; torchvision's initialization (convs
    ``kaiming_normal_(mode="fan_out")`` with zero bias, linears ``N(0, 0.01)`` with zero bias).
    Pools that would shrink a map below 1×1 are skipped (8×8 and 16×16 inputs). Convolutions keep
    their bias (torchvision's VGG-BN does too).

    Args:
        cfg: layer configuration (default: :data:`VGG11_CFG`).
        num_classes: number of logits.
        in_channels: input channels.
        input_size: input ``(H, W)`` or side length.
        norm_layer: norm specification, resolved by ``get_norm_layer``.
        classifier: ``"cifar"`` (default) or ``"imagenet"`` (torchvision's).
        dropout: dropout probability in the ImageNet classifier (default: 0.0, HBN's code, which replaces
            torchvision's ``Dropout(0.5)`` by Identity; 0 builds ``nn.Identity``).
    """

    def __init__(
        self,
        cfg: Sequence[Union[int, str]] = VGG11_CFG,
        *,
        num_classes: int = 10,
        in_channels: int = 3,
        input_size: int | Sequence[int] = 32,
        norm_layer: NormSpec = "bn",
        classifier: Classifier = "cifar",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        validate_common(num_classes, in_channels)
        if classifier not in ("cifar", "imagenet"):
            raise ValueError(f"Unknown value '{classifier}' for argument classifier. Valid values are ('cifar', 'imagenet')")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
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
        self.classifier: nn.Module
        if classifier == "cifar":
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Identity()
            self.num_features = channels
        else:
            self.pool = nn.AdaptiveAvgPool2d(7)

            def drop() -> nn.Module:
                return nn.Dropout(dropout) if dropout > 0 else nn.Identity()

            # torchvision's indices (classifier.0, .3), so its checkpoints' keys fit; its .6 is our head
            self.classifier = nn.Sequential(
                nn.Linear(channels * 49, 4096), nn.ReLU(inplace=True), drop(),
                nn.Linear(4096, 4096), nn.ReLU(inplace=True), drop(),
            )
            self.num_features = 4096
        self.num_classes = num_classes
        self.head = nn.Linear(self.num_features, num_classes)
        if classifier == "imagenet":  # torchvision's VGG initialisation
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                    nn.init.zeros_(m.bias)
                elif isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, 0, 0.01)
                    nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


@register_model()
def vgg11(
    *,
    num_classes: int = 10,
    in_channels: int = 3,
    input_size: int | Sequence[int] = 32,
    norm_layer: NormSpec = "bn",
    classifier: Classifier = "cifar",
    dropout: float = 0.0,
    pretrained: str | None = None,
    pretrained_norm: PretrainedNorm = "fresh",
) -> VGG:
    """VGG-11 with a norm after each conv: CIFAR-style with a ``Linear(512 → C)`` head, or
    ``classifier="imagenet"``, torchvision's ``vgg11_bn`` (128,771,840 + 4097·C parameters with BN;
    HBN Table 5); see :class:`VGG`. ``pretrained=PATH`` loads torchvision's ImageNet checkpoint
    (``vgg11_bn-6002323d.pth``) into the ImageNet form (:mod:`fednorm.models.pretrained`)."""
    model = VGG(VGG11_CFG, num_classes=num_classes, in_channels=in_channels, input_size=input_size, norm_layer=norm_layer,
                classifier=classifier, dropout=dropout)
    if pretrained is not None:
        load_torchvision_weights(model, pretrained, from_torchvision_key, norm=pretrained_norm, arch="vgg11")
    return model


@register_model()
def vgg19(
    *,
    num_classes: int = 10,
    in_channels: int = 3,
    input_size: int | Sequence[int] = 32,
    norm_layer: NormSpec = "bn",
    classifier: Classifier = "cifar",
    dropout: float = 0.0,
    pretrained: str | None = None,
    pretrained_norm: PretrainedNorm = "fresh",
) -> VGG:
    """VGG-19 (HBN Table 5) with a norm after each of its 16 convs: CIFAR-style with a
    ``Linear(512 → C)`` head, or ``classifier="imagenet"``, torchvision's ``vgg19_bn`` (139,581,248 +
    4097·C parameters with BN); see :class:`VGG`. ``pretrained=PATH`` loads torchvision's ImageNet
    checkpoint (``vgg19_bn-c79401a0.pth``) into the ImageNet form (:mod:`fednorm.models.pretrained`)."""
    model = VGG(VGG19_CFG, num_classes=num_classes, in_channels=in_channels, input_size=input_size, norm_layer=norm_layer,
                classifier=classifier, dropout=dropout)
    if pretrained is not None:
        load_torchvision_weights(model, pretrained, from_torchvision_key, norm=pretrained_norm, arch="vgg19")
    return model


def from_torchvision_key(key: str) -> str:
    """A torchvision VGG state-dict key as :class:`VGG`'s: the same but ``classifier.6`` -> ``head``."""
    return "head." + key[len("classifier.6."):] if key.startswith("classifier.6.") else key


def to_torchvision_key(key: str) -> str:
    """The inverse of :func:`from_torchvision_key`."""
    return "classifier.6." + key[len("head."):] if key.startswith("head.") else key
