"""Shared pieces of fednorm's models: the classifier interface and input-size arithmetic.

Every model is a :class:`ClassifierModel`: ``forward_features(x)`` returns the penultimate
feature vector ``(N, d)``, ``head`` is the final ``nn.Linear`` and ``forward(x)`` is
``head(forward_features(x))``, with ``num_features == d``. Feature normalization (FN,
Zhang et al., 2024) and MOON's representations hook into this split. Sizes of flattened
feature maps are computed from ``input_size`` when the model is built (no lazy modules), so the
same architecture runs on 8×8 digits, 28×28 MNIST-like digits and 32×32 CIFAR.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

__all__ = ["ClassifierModel", "to_hw", "conv_out_size", "maybe_max_pool", "validate_common"]


class ClassifierModel(nn.Module):
    """Base class: a feature extractor followed by a linear classifier ``head``.

    Subclasses set ``self.head`` (an ``nn.Linear``) and ``self.num_features`` (its
    ``in_features``) and implement :meth:`forward_features`.

    Attributes:
        num_features: dimension d of the penultimate features.
        num_classes: number of output logits.
        head: the final ``nn.Linear(num_features, num_classes)``.
    """

    num_features: int
    num_classes: int
    head: nn.Linear

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate features of ``x``, shape ``(N, num_features)``."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``head(forward_features(x))``, shape ``(N, num_classes)``."""
        return self.head(self.forward_features(x))


def to_hw(input_size: int | Sequence[int]) -> tuple[int, int]:
    """``input_size`` as ``(H, W)``; an int means a square input.

    Raises:
        ValueError: unless it is a positive int or a pair of positive ints.
    """
    if isinstance(input_size, (bool, str, bytes)):
        raise ValueError(f"input_size must be an int or (H, W), got {input_size!r}")
    if isinstance(input_size, int):
        hw = (input_size, input_size)
    else:
        try:
            hw = tuple(int(v) for v in input_size)
        except TypeError:
            raise ValueError(f"input_size must be an int or (H, W), got {input_size!r}") from None
        if len(hw) != 2:
            raise ValueError(f"input_size must be an int or (H, W), got {input_size!r}")
    if min(hw) < 1:
        raise ValueError(f"input_size must be positive, got {input_size!r}")
    return hw  # type: ignore[return-value]


def conv_out_size(size: int, kernel_size: int, stride: int = 1, padding: int = 0) -> int:
    """Output length of a convolution or pooling along one axis (no dilation)."""
    return (size + 2 * padding - kernel_size) // stride + 1


def maybe_max_pool(hw: tuple[int, int]) -> tuple[nn.Module, tuple[int, int]]:
    """A ``MaxPool2d(2, 2)`` and the pooled size, or ``nn.Identity`` if the map is below 2×2.

    Pooling a 1-pixel axis would give an empty map; small inputs (8×8 digits) therefore skip
    the pools that would shrink the map below 1×1 instead of failing.
    """
    if min(hw) < 2:
        return nn.Identity(), hw
    return nn.MaxPool2d(2, 2), (hw[0] // 2, hw[1] // 2)


def validate_common(num_classes: int, in_channels: int) -> None:
    """Check the arguments shared by every builder."""
    for name, value in (("num_classes", num_classes), ("in_channels", in_channels)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
