"""FedTAN's MNIST DNN, generalized: ``flatten → (Linear → Norm1d → ReLU) × L → Linear``.

The FedTAN paper (Wang et al., 2023, Sec. 6.1.1): a 784 × 30 × 10 DNN whose hidden layer is
followed by BN, the activation unstated (ReLU here); 23,920 parameters at 784-30-10 with BN.
FedBN's ABIDE classifier (Li et al., 2021, Sec. 5.2) is the same block twice: "a three-layer fully
connected neural network ... with the hidden layers of 16 with two BN layers after the first two
fully connected layers" (``hidden=[16, 16]``).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..nn.norms import NormSpec, get_norm_layer
from .base import ClassifierModel, to_hw, validate_common
from .registry import register_model

__all__ = ["MLP", "mlp"]


class MLP(ClassifierModel):
    """Perceptron with a norm between each hidden linear layer and its ReLU.

    ``Flatten → Linear(C·H·W → h1) → Norm(h1, spatial=False) → ReLU → … → head Linear(h_L →
    num_classes)``, one block per hidden width. With ``"bn"`` the norm is ``BatchNorm1d``
    (FedTAN's single BN layer, L = 1; FedBN's ABIDE MLP, L = 2). ``num_features`` is the last width.

    Args:
        num_classes: number of logits.
        in_channels: input channels.
        input_size: input ``(H, W)`` or side length (28 for MNIST: 784 inputs).
        norm_layer: norm specification, resolved by ``get_norm_layer``.
        hidden: hidden width, or one width per hidden layer (default: 30, FedTAN's; ``[16, 16]``
            is FedBN's ABIDE MLP).
        init_std: if given, the hidden layers' weights and biases are drawn from
            ``N(0, init_std²)`` (FedBN Appendix F's synthetic task: ``W_k ~ N(0, α²I)``,
            ``b_k ~ N(0, α²)`` with α = 10) instead of PyTorch's default uniform init.
    """

    def __init__(
        self,
        *,
        num_classes: int = 10,
        in_channels: int = 1,
        input_size: int | Sequence[int] = 28,
        norm_layer: NormSpec = "bn",
        hidden: int | Sequence[int] = 30,
        init_std: float | None = None,
    ) -> None:
        super().__init__()
        validate_common(num_classes, in_channels)
        widths = [hidden] if isinstance(hidden, int) and not isinstance(hidden, bool) else hidden
        if (isinstance(widths, (str, bytes)) or not isinstance(widths, Sequence) or not widths
                or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in widths)):
            raise ValueError(f"hidden must be a positive integer or a non-empty list of them, got {hidden!r}")
        norm_layer = get_norm_layer(norm_layer)
        h, w = to_hw(input_size)
        layers: list[nn.Module] = [nn.Flatten()]
        fan_in = in_channels * h * w
        for width in widths:
            layers += [nn.Linear(fan_in, width), norm_layer(width, spatial=False), nn.ReLU(inplace=True)]
            fan_in = width
        self.fc = nn.Sequential(*layers)
        if init_std is not None:
            if isinstance(init_std, bool) or not isinstance(init_std, (int, float)) or not init_std > 0:
                raise ValueError(f"init_std must be a positive number, got {init_std!r}")
            for m in self.fc:
                if isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, 0.0, float(init_std))
                    nn.init.normal_(m.bias, 0.0, float(init_std))
        self.num_features = fan_in
        self.num_classes = num_classes
        self.head = nn.Linear(fan_in, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


@register_model()
def mlp(
    *,
    num_classes: int = 10,
    in_channels: int = 1,
    input_size: int | Sequence[int] = 28,
    norm_layer: NormSpec = "bn",
    hidden: int | Sequence[int] = 30,
    init_std: float | None = None,
) -> MLP:
    """FedTAN's MNIST MLP (Wang et al., 2023, Sec. 6.1.1), any input size; see :class:`MLP`."""
    return MLP(num_classes=num_classes, in_channels=in_channels, input_size=input_size, norm_layer=norm_layer, hidden=hidden,
               init_std=init_std)
