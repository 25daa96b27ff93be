"""FedSAM: sharpness-aware local steps (the HBN paper's Table 4 row "FedSAM"; Chen et al., 2025).

Each local step of SAM (Foret et al., ICLR 2021) takes two passes on the same batch:

1. the gradient ``g = ∇L(w)`` (the engine's ordinary backward pass);
2. the ascent point ``w + ε`` with ``ε = ρ·g/‖g‖`` (one norm over every trainable tensor), the
   gradient ``∇L(w + ε)`` there, and the weights back at ``w``;

then the optimiser steps from ``w`` with ``∇L(w + ε)`` (after the usual clipping, weight decay
and momentum). FedSAM (Qu et al., ICML 2022; Caldarola et al., ECCV 2022) is FedAvg whose clients
take these steps.

The second pass leaves no trace on the model's buffers: BatchNorm running statistics (and any
other buffer a norm layer updates in its forward) are restored after it, so they are those of
the ordinary pass at ``w``, as SAM's reference code asks ("disable running stats" on the second
pass); FBN's per-batch statistics record drops the second pass's entry too. Any client-loss term (FedProx's, FedDecorr's, ...) is part of both passes.

On the vectorized executor each client of a stacked chunk takes its own SAM step: its own norm
``‖g_i‖`` over its rows of the stacked gradients, its own ascent point, and the second pass runs
the whole chunk at once on the step's batches (:meth:`FedSAM.stacked_gradient`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from ..methods.base import ClientContext, StackedClientContext
from .checks import check_number
from .client import ClientOptimizer, register_client_optimizer

__all__ = ["FedSAM", "sam_perturbation", "stacked_sam_perturbation"]


def sam_perturbation(grads: list[torch.Tensor], rho: float, eps: float = 1e-12) -> list[torch.Tensor]:
    """SAM's ascent step ``ρ·g/(‖g‖ + eps)`` with ``‖g‖`` the norm over all of ``grads``."""
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.double()) for g in grads]))
    scale = rho / (float(norm) + eps)
    return [g * scale for g in grads]


def stacked_sam_perturbation(grads: list[torch.Tensor], rho: float, eps: float = 1e-12) -> list[torch.Tensor]:
    """:func:`sam_perturbation` of every client of a stack at once: row ``i`` of each of
    ``grads`` (``[K, ...]``) is client ``i``'s, and each client's norm is over its rows only."""
    k = grads[0].shape[0]
    sq = torch.stack([g.double().reshape(k, -1).pow(2).sum(dim=1) for g in grads]).sum(dim=0)
    scale = rho / (sq.sqrt() + eps)  # [K], float64
    return [g * scale.view(k, *([1] * (g.dim() - 1))).to(g.dtype) for g in grads]


def _recorders(model: nn.Module) -> list[tuple[list, int]]:
    """FBN's per-batch statistics records and their lengths (the base layers' ``_recorder``,
    the stacked layers' ``recorder``): the second pass's entries are dropped."""
    found = []
    for m in model.modules():
        for attr in ("_recorder", "recorder"):
            r = getattr(m, attr, None)
            if isinstance(r, list):
                found.append((r, len(r)))
    return found


@register_client_optimizer("fedsam")
class FedSAM(ClientOptimizer):
    """FedSAM: every local step is a SAM step (see the module docstring).

    Args:
        rho: the neighbourhood radius ρ. The HBN paper (Table 4) gives no value; the default is
            SAM's and FedSAM's usual 0.05 (Foret et al.; Qu et al. tune ρ ∈ {0.01, …, 0.1}).
            (default: 0.05)
        eps: added to ``‖g‖`` (default: 1e-12, SAM's reference code).
    """

    name = "fedsam"
    uses_gradient = True
    stacked = True
    stacks_across_runs = True  # each row's perturbation from its own gradient

    def __init__(self, rho: float = 0.05, eps: float = 1e-12) -> None:
        self.rho = check_number("fedsam rho", rho, 0.0)
        self.eps = check_number("fedsam eps", eps, 0.0)

    def gradient(self, ctx: ClientContext, model: nn.Module, closure: Callable[[], torch.Tensor]) -> None:
        params = [p for p in model.parameters() if p.requires_grad and p.grad is not None]
        if not params or self.rho == 0:
            return
        start = [p.detach().clone() for p in params]
        eps = sam_perturbation([p.grad for p in params], self.rho, self.eps)
        buffers = [(b, b.detach().clone()) for b in model.buffers()]
        # FBN's layers record each training batch's statistics in a list: drop the second pass's.
        recorders = _recorders(model)
        with torch.no_grad():
            for p, e in zip(params, eps):
                p.add_(e.to(p.dtype))
        closure()  # gradients at w + eps replace p.grad
        with torch.no_grad():
            for p, w in zip(params, start):
                p.copy_(w)
            for b, saved in buffers:
                b.copy_(saved)
        for r, n in recorders:
            del r[n:]

    def stacked_gradient(
        self, ctx: StackedClientContext, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
        rows: torch.Tensor, closure: Callable[[], None],
    ) -> None:
        with_grad = [p for p in params.values() if p.grad is not None]
        if not with_grad or self.rho == 0:
            return
        start = [p.detach().clone() for p in with_grad]
        eps = stacked_sam_perturbation([p.grad for p in with_grad], self.rho, self.eps)
        saved = [(b, b.detach().clone()) for b in buffers.values()]
        recorders = _recorders(ctx.model)
        with torch.no_grad():
            for p, e in zip(with_grad, eps):
                p.add_(e)
        closure()  # each client's gradient at its own w_i + eps_i replaces its rows of p.grad
        with torch.no_grad():
            for p, w in zip(with_grad, start):
                p.copy_(w)
            for b, value in saved:
                b.copy_(value)
        for r, n in recorders:
            del r[n:]

    def hparams(self) -> dict[str, Any]:
        return {"rho": self.rho}
