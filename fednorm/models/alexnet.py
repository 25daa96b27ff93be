"""FedBN's AlexNet with a norm after every layer but the last (Li et al., 2021, App. D, Table 9).

FedBN's Office-Caltech10 and DomainNet model, also FedTAN's for its Figs. 8 and 13 ("AlexNet [15]",
following FedBN: Wang et al., FedTAN, Figs. 8 and 13). Layer for layer the authors' released
``nets/models.py AlexNet`` (FedBN App. D, Table 9 repeats a conv row by typo):

```
conv1 Conv2d(3, 64, k11, s4, p2)  → Norm(64)  → ReLU → MaxPool(3, 2)
conv2 Conv2d(64, 192, k5, p2)     → Norm(192) → ReLU → MaxPool(3, 2)
conv3 Conv2d(192, 384, k3, p1)    → Norm(384) → ReLU
conv4 Conv2d(384, 256, k3, p1)    → Norm(256) → ReLU
conv5 Conv2d(256, 256, k3, p1)    → Norm(256) → ReLU → MaxPool(3, 2)
AdaptiveAvgPool(6, 6) → flatten 9216
fc1 Linear(9216, 4096) → Norm1d(4096) → ReLU
fc2 Linear(4096, 4096) → Norm1d(4096) → ReLU
fc3 Linear(4096, C)                                  # the head
```
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import torch
from torch import nn

from ..nn.norms import NormSpec, get_norm_layer
from .base import ClassifierModel, conv_out_size, to_hw, validate_common
from .registry import register_model

__all__ = ["AlexNetBN", "alexnet_bn"]


def _pool3(hw: tuple[int, int]) -> tuple[nn.Module, tuple[int, int]]:
    """``MaxPool2d(3, 2)`` and the pooled size, or ``nn.Identity`` on a map under 3×3 (small inputs)."""
    if min(hw) < 3:
        return nn.Identity(), hw
    return nn.MaxPool2d(3, 2), (conv_out_size(hw[0], 3, 2), conv_out_size(hw[1], 3, 2))


class AlexNetBN(ClassifierModel):
    """FedBN's AlexNet-BN (module docstring), with ``norm_layer`` in every norm's place.

    Convolutions and linears keep their bias, as in FedBN's code; the FC norms are built with
    ``spatial=False`` (``BatchNorm1d`` for ``"bn"``); torch's default initialisation, as FedBN's.
    The module names are FedBN's (``features.conv1``, ``features.bn1``, ..., ``classifier.fc1``,
    ``classifier.bn6``; ``fc3`` is ``head``). With ``"bn"`` and 10 classes: 57,063,498 parameters
    (torchvision's AlexNet's layers with a 10-way head, plus 18,688 norm parameters) and 18,688
    running statistics. On FedBN's 256×256 input the last pool leaves 256×7×7, averaged to 6×6;
    a max-pool that would meet a map under 3×3 is skipped (small inputs: at 32×32 the last one), so
    it also runs on 8×8 test digits (at least 7×7).

    Args:
        num_classes: number of logits.
        in_channels: input channels.
        input_size: input ``(H, W)`` or side length (FedBN: 256).
        norm_layer: norm specification, resolved by ``get_norm_layer``.
    """

    def __init__(
        self,
        *,
        num_classes: int = 10,
        in_channels: int = 3,
        input_size: int | Sequence[int] = 256,
        norm_layer: NormSpec = "bn",
    ) -> None:
        super().__init__()
        validate_common(num_classes, in_channels)
        norm_layer = get_norm_layer(norm_layer)
        hw = to_hw(input_size)
        if min(hw) < 7:
            raise ValueError(f"alexnet_bn needs inputs of at least 7×7 (its first conv is 11×11 with stride 4), got {hw}")
        hw = (conv_out_size(hw[0], 11, 4, 2), conv_out_size(hw[1], 11, 4, 2))
        pool1, hw = _pool3(hw)
        pool2, hw = _pool3(hw)
        pool5, hw = _pool3(hw)
        layers: list[tuple[str, nn.Module]] = []
        widths = ((in_channels, 64, 11, 4, 2, pool1), (64, 192, 5, 1, 2, pool2), (192, 384, 3, 1, 1, None),
                  (384, 256, 3, 1, 1, None), (256, 256, 3, 1, 1, pool5))
        for i, (c_in, c_out, k, s, p, pool) in enumerate(widths, 1):
            layers += [(f"conv{i}", nn.Conv2d(c_in, c_out, k, s, p)), (f"bn{i}", norm_layer(c_out)),
                       (f"relu{i}", nn.ReLU(inplace=True))]
            if pool is not None:
                layers.append((f"maxpool{i}", pool))
        self.features = nn.Sequential(OrderedDict(layers))
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(OrderedDict([
            ("fc1", nn.Linear(256 * 6 * 6, 4096)), ("bn6", norm_layer(4096, spatial=False)), ("relu6", nn.ReLU(inplace=True)),
            ("fc2", nn.Linear(4096, 4096)), ("bn7", norm_layer(4096, spatial=False)), ("relu7", nn.ReLU(inplace=True)),
        ]))
        self.num_features = 4096
        self.num_classes = num_classes
        self.head = nn.Linear(4096, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


@register_model()
def alexnet_bn(
    *,
    num_classes: int = 10,
    in_channels: int = 3,
    input_size: int | Sequence[int] = 256,
    norm_layer: NormSpec = "bn",
) -> AlexNetBN:
    """FedBN's AlexNet-BN (Office-Caltech10, DomainNet; FedTAN Figs. 8 and 13); see :class:`AlexNetBN`."""
    return AlexNetBN(num_classes=num_classes, in_channels=in_channels, input_size=input_size, norm_layer=norm_layer)
