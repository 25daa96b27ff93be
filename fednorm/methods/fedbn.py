"""FedBN and SiloBN: BatchNorm tensors that stay on their client.

FedBN (Li et al., ICLR 2021, Sec. 4.1): every tensor of a BatchNorm layer —
affine ``weight``/``bias``, ``running_mean``/``running_var`` and ``num_batches_tracked`` — stays
local; everything else is averaged. SiloBN (Andreux et al. 2020): only the statistics (the
buffers) stay local; the affine parameters are averaged. Both select BN tensors by module type
(any ``_BatchNorm`` subclass), not by the ``'bn'`` key substring of FedBN's released code, so
they work for any model. Each client is evaluated with its own model (personalized).
"""

from __future__ import annotations

import warnings
from typing import Literal

from torch import nn

from ..nn.state import batch_norm_keys
from .fedavg import FedAvg
from .policy import NormPolicy
from .registry import register_method

__all__ = ["FedBN", "SiloBN"]


@register_method("fedbn")
class FedBN(FedAvg):
    """FedAvg that keeps every BatchNorm tensor local (FedBN, Algorithm 1).

    Args:
        weighting: ``"uniform"`` is the paper's and its code's 1/K; ``"num_examples"`` weights
            by client size (McMahan et al.), as the paper notes is possible. (default: ``"uniform"``)
    """

    name = "fedbn"
    personalized = True
    default_policy = NormPolicy("local", "local")
    allowed_buffers = ("local",)  # averaging the statistics is what FedBN exists to avoid
    allowed_affine = ("local", "global")  # global affine: SiloBN

    def __init__(self, weighting: Literal["num_examples", "uniform"] = "uniform") -> None:
        super().__init__(weighting=weighting)

    def setup(self, model: nn.Module) -> None:
        if not batch_norm_keys(model):
            warnings.warn(
                f"{self.name}: the model has no BatchNorm layers, so nothing stays local and this equals FedAvg",
                stacklevel=3,
            )
        super().setup(model)


@register_method("silobn")
class SiloBN(FedBN):
    """FedAvg that keeps only BatchNorm statistics local; affine parameters are averaged (SiloBN)."""

    name = "silobn"
    default_policy = NormPolicy("local", "global")
