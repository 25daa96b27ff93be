"""FedTAN's MNIST DNN, generalized: ``flatten → Linear → Norm1d → ReLU → Linear``.

The FedTAN paper (Wang et al., 2023, Sec. 6.1.1): a 784 × 30 × 10 DNN whose hidden layer is
followed by BN, the activation unstated (ReLU here); 23,920 parameters at 784-30-10 with BN.
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
    """One-hidden-layer perceptron with a norm between the hidden linear layer and its ReLU.

    ``Flatten → Linear(C·H·W → hidden) → Norm(hidden, spatial=False) → ReLU → head Linear(hidden
    → num_classes)``. With ``"bn"`` the norm is ``BatchNorm1d`` (FedTAN's single BN layer, L = 1).
    ``num_features`` is ``hidden``.

    Args:
        num_classes: number of logits.
        in_channels: input channels.
        input_size: input ``(H, W)`` or side length (28 for MNIST: 784 inputs).
        norm_layer: norm specification, resolved by ``get_norm_layer``.
        hidden: hidden width (default: 30, FedTAN's).
        init_std: if given, the hidden layer's weights and biases are drawn from
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
        hidden: int = 30,
        init_std: float | None = None,
    ) -> None:
        super().__init__()
        validate_common(num_classes, in_channels)
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise ValueError(f"hidden must be a positive integer, got {hidden!r}")
        norm_layer = get_norm_layer(norm_layer)
        h, w = to_hw(input_size)
        self.fc = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_channels * h * w, hidden),
            norm_layer(hidden, spatial=False),
            nn.ReLU(inplace=True),
        )
        if init_std is not None:
            if isinstance(init_std, bool) or not isinstance(init_std, (int, float)) or not init_std > 0:
                raise ValueError(f"init_std must be a positive number, got {init_std!r}")
            nn.init.normal_(self.fc[1].weight, 0.0, float(init_std))
            nn.init.normal_(self.fc[1].bias, 0.0, float(init_std))
        self.num_features = hidden
        self.num_classes = num_classes
        self.head = nn.Linear(hidden, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


@register_model()
def mlp(
    *,
    num_classes: int = 10,
    in_channels: int = 1,
    input_size: int | Sequence[int] = 28,
    norm_layer: NormSpec = "bn",
    hidden: int = 30,
    init_std: float | None = None,
) -> MLP:
    """FedTAN's MNIST MLP (Wang et al., 2023, Sec. 6.1.1), any input size; see :class:`MLP`."""
    return MLP(num_classes=num_classes, in_channels=in_channels, input_size=input_size, norm_layer=norm_layer, hidden=hidden,
               init_std=init_std)
