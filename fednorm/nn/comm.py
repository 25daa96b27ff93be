"""Cross-client reduction handles, the federated analogue of a process group.

A norm layer that needs statistics of *all* participating clients (FedTAN's layer-wise
aggregation, FBN's shared statistics) calls ``comm.sum(t)`` on a tensor whose leading axis
indexes the clients it holds. In the in-process simulator all clients live in one tensor and
the reduction is a plain, differentiable sum; a distributed runtime sums its local clients and
then all-reduces across processes, so the layer's code is the same in both.
"""

from __future__ import annotations

import torch

__all__ = ["ClientComm", "LocalClientComm"]


class ClientComm:
    """Interface: a differentiable sum over every participating client."""

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum of ``t`` over its leading client axis and over all other participants."""
        raise NotImplementedError

    @property
    def bytes_sent(self) -> int:
        """Bytes this handle has sent so far (0 when nothing crosses a process boundary)."""
        return 0


class LocalClientComm(ClientComm):
    """All clients are rows of one tensor in this process; counts synchronisations for accounting."""

    def __init__(self) -> None:
        self.num_reductions = 0
        self.floats_reduced = 0

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        self.num_reductions += 1
        self.floats_reduced += t[0].numel() if t.dim() else 1
        return t.sum(dim=0)
