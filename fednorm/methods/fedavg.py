"""FedAvg (McMahan et al. 2017, arXiv:1602.05629) with every tensor shared.

With BatchNorm this is the papers' common baseline "FedAvg + BN": running statistics are
averaged like weights, which is biased under non-IID data (FBN §3, FedTAN §2, HBN Eq. 3).
``num_batches_tracked`` (an integer counter) takes the maximum over clients.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import torch

from ..errors import ConfigError
from .base import ClientUpdates, Method
from .registry import register_method

__all__ = ["FedAvg"]


@register_method("fedavg")
class FedAvg(Method):
    """Federated averaging of all parameters and buffers.

    Args:
        weighting: ``"num_examples"`` (McMahan et al.; HBN's code) or ``"uniform"`` (FedBN's
            and FBN's papers, 1/K). (default: ``"num_examples"``)
    """

    name = "fedavg"

    def __init__(self, weighting: Literal["num_examples", "uniform"] = "num_examples") -> None:
        super().__init__()
        if weighting not in ("num_examples", "uniform"):
            raise ConfigError(
                f"Unknown value '{weighting}' for argument weighting. Valid values are {{num_examples, uniform}}"
            )
        self.weighting = weighting

    def client_weights(self, updates: ClientUpdates) -> torch.Tensor:
        if self.weighting == "uniform":
            w = (updates.num_examples > 0).to(torch.float64)
        else:
            w = updates.num_examples.to(torch.float64)
        if float(w.sum()) <= 0:
            warnings.warn("every sampled client had zero examples; keeping the global model", stacklevel=2)
        return w

    def aggregate(self, server_round: int, global_state: dict[str, torch.Tensor], updates: ClientUpdates) -> dict[str, torch.Tensor]:
        weights = self.client_weights(updates)
        if float(weights.sum()) <= 0:
            return {k: global_state[k].clone() for k in self.shared_keys}
        return super().aggregate(server_round, global_state, updates)

    def hparams(self) -> dict[str, Any]:
        return {"weighting": self.weighting}
