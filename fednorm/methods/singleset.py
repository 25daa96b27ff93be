"""SingleSet: every client trains alone on its own data, with no communication.

The FedBN paper's lower baseline (Li et al., 2021, Sec. 5.2, Table 1 "SingleSet"): each client
trains a model on its local data for the same number of epochs as the federated methods. Here
it is a method whose every tensor is local, so it runs on the same engine, data, batches and
seeds as FedAvg and FedBN: all clients start from the same initialisation, nothing is uploaded
or aggregated, and each client is evaluated with its own model on its own test split.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .base import ClientUpdates, Method
from .policy import NormPolicy
from .registry import register_method

__all__ = ["SingleSet"]


@register_method("singleset")
class SingleSet(Method):
    """Local training only (no federation); a personalized model per client."""

    name = "singleset"
    personalized = True
    default_policy = NormPolicy("local", "local")  # nothing is sent at all
    allowed_buffers = ("local",)
    allowed_affine = ("local",)

    def select_local_keys(self, model: nn.Module) -> set[str]:
        return set(model.state_dict().keys())

    def aggregate(self, server_round: int, global_state: dict[str, torch.Tensor], updates: ClientUpdates) -> dict[str, torch.Tensor]:
        return {}

    def comm_rounds_per_round(self, model: nn.Module) -> int:
        return 0

    def hparams(self) -> dict[str, Any]:
        return {}
