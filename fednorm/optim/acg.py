"""FedACG: accelerated client gradient (Kim, Kim & Han, CVPR 2024, arXiv:2201.03172), the HBN
paper's Table 4 row "FedACG" (Chen et al., 2025: base GN 76.01, +HBN 79.19).

Round ``t`` with server model ``θ`` and server momentum ``m`` (zero at the start):

1. the server sends the look-ahead ``θ̃ = θ + λ·m`` and every client starts from it;
2. a client minimises ``L_i(w) + (β/2)·‖w − θ̃‖²``;
3. the server sets ``m ← λ·m + Δ`` with ``Δ = mean_i(w_i) − θ̃``, and ``θ ← θ + m``.

So ``θ_new = mean_i(w_i)`` and ``m = θ_new − θ_old``: the new global model is the aggregate and
the momentum is the server's last move. This module computes ``m`` as exactly that move
(:meth:`ClientOptimizer.server_moved`), which keeps the wrapped method's aggregation (FedAvg's
sample weights, HBN's statistics) and any server optimizer. Only *shared learnable parameters*
get the look-ahead and carry momentum; buffers (BN/HBN statistics) and client-local tensors
(HBN's α) are sent as they are, and the proximal term anchors a local tensor to its own start,
as FedProx does. The look-ahead is applied before the wrapped method's ``client_begin``, so
HBN's statistics pass sees the model the client trains from.

Defaults from the released code (geehokim/FedACG, ``configs/server/FedACG.yaml`` momentum 0.85,
``configs/client/ACG.yaml`` prox_loss weight 1e-3); the HBN paper gives no value.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..methods.base import ClientContext, Method, StackedClientContext
from .checks import check_number
from .client import ClientOptimizer, register_client_optimizer

__all__ = ["FedACG"]


@register_client_optimizer("fedacg")
class FedACG(ClientOptimizer):
    """FedACG: clients start from the server's look-ahead ``θ + λ·m`` and stay near it.

    Args:
        lam: λ, the server momentum and look-ahead factor (default: 0.85, the released code's).
        beta: β, the proximal weight toward the look-ahead model (default: 1e-3, the code's).
    """

    name = "fedacg"
    uses_begin = True
    uses_loss = True
    uses_end = True
    stacked = True
    stacks_across_runs = True  # each row looks ahead from its own run's global state and momentum (peer)
    begin_first = True

    def __init__(self, lam: float = 0.85, beta: float = 1e-3) -> None:
        self.lam = check_number("fedacg lam", lam, 0.0, 1.0)
        self.beta = check_number("fedacg beta", beta, 0.0)
        self.m: dict[str, torch.Tensor] = {}
        self._anchor: list[tuple[nn.Parameter, torch.Tensor]] = []
        self._stacked_anchor: dict[str, torch.Tensor] = {}

    def setup(self, model: nn.Module, method: Method, num_clients: int, local_momentum: float = 0.0) -> None:
        super().setup(model, method, num_clients, local_momentum)
        params = dict(model.named_parameters())
        self.m = {k: torch.zeros_like(params[k], dtype=torch.float64).detach() for k in self.shared_trainable_keys}

    def look_ahead(self, global_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``θ + λ·m`` for the shared learnable parameters (what the clients start from)."""
        return {k: (global_state[k].double() + self.lam * m).to(global_state[k].dtype) for k, m in self.m.items()}

    # -- client ------------------------------------------------------------------------------
    def begin(self, ctx: ClientContext) -> None:
        params = dict(ctx.model.named_parameters())
        with torch.no_grad():
            for k, v in self.look_ahead(ctx.global_state).items():
                params[k].copy_(v)
        self._anchor = [(params[k], params[k].detach().clone()) for k in self.trainable_keys]

    def loss(self, ctx: ClientContext, model: nn.Module, loss: torch.Tensor) -> torch.Tensor:
        if self.beta == 0:
            return loss
        prox = sum(((p - w0) ** 2).sum() for p, w0 in self._anchor)
        return loss + 0.5 * self.beta * prox

    def end(self, ctx: ClientContext) -> None:
        self._anchor = []

    def stacked_begin(self, ctx: StackedClientContext) -> None:
        params = dict(ctx.model.named_parameters())
        with torch.no_grad():
            if ctx.methods:  # runs stacked: each row looks ahead with its own run's momentum
                starts = [self.peer(ctx, i).look_ahead(ctx.global_state_of(i)) for i in range(len(ctx))]
                for k in self.m:
                    params[k].copy_(torch.stack([start[k] for start in starts]))
            else:
                for k, v in self.look_ahead(ctx.global_state).items():
                    params[k].copy_(v.unsqueeze(0).expand_as(params[k]))
        self._stacked_anchor = {k: params[k].detach().clone() for k in self.trainable_keys}

    def stacked_loss(self, ctx: StackedClientContext, params: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor | None:
        if self.beta == 0:
            return None
        every = len(rows) == len(ctx)
        prox = sum(((params[k] - (w0 if every else w0.index_select(0, rows))) ** 2).sum()
                   for k, w0 in self._stacked_anchor.items())
        return 0.5 * self.beta * prox

    def stacked_end(self, ctx: StackedClientContext) -> None:
        self._stacked_anchor = {}

    # -- server ------------------------------------------------------------------------------
    def server_moved(self, server_round: int, old: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> None:
        """``m ← λ·m + (mean_i w_i − θ̃)``, which is the server's move ``θ_new − θ_old``."""
        for k in self.m:
            self.m[k] = new[k].double() - old[k].double()

    def state_dict(self) -> dict[str, Any]:
        return {"m": {k: v.detach().cpu().clone() for k, v in self.m.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state.get("m", {}).items():
            self.m[k] = v.to(torch.float64)

    def hparams(self) -> dict[str, Any]:
        return {"lam": self.lam, "beta": self.beta}
