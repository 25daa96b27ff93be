"""The client-concatenated layout of stacked models (:mod:`fednorm.nn.stacked`).

Activations of K clients are ``[B, K·C, ...]`` (client k owns channels ``k·C .. (k+1)·C − 1``)
and parameters ``[K, *shape]``; these helpers move batches into and out of that layout and copy a
layer's tensors for K clients.
"""

from __future__ import annotations

import torch

__all__ = ["NotStackableError", "to_client_layout", "from_client_layout", "repeat_clients"]


class NotStackableError(ValueError):
    """Raised when a model cannot be run as a stacked (vectorized) model; says which module."""


def to_client_layout(x: torch.Tensor) -> torch.Tensor:
    """``[K, B, C, ...]`` (each client's batch) -> ``[B, K·C, ...]``."""
    k, b, c = x.shape[:3]
    return x.transpose(0, 1).reshape(b, k * c, *x.shape[3:])


def from_client_layout(y: torch.Tensor, num_clients: int) -> torch.Tensor:
    """``[B, K·C, ...]`` -> ``[K, B, C, ...]``."""
    b = y.shape[0]
    return y.reshape(b, num_clients, -1, *y.shape[2:]).transpose(0, 1)


def repeat_clients(t: torch.Tensor | None, k: int) -> torch.Tensor | None:
    """``t`` copied for ``k`` clients, ``[K, *t.shape]``, detached and contiguous (``None`` stays ``None``)."""
    return None if t is None else t.detach().unsqueeze(0).repeat(k, *([1] * t.dim())).contiguous()
