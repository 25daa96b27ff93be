"""FedTAN and FedTAN-II (Wang et al., "Why Batch Normalization Damage Federated Learning on
Non-IID Data?", IEEE TNNLS 2023, arXiv:2301.02982).

FedAvg + BN is biased on non-IID data because each client's gradient is computed through its
own batch statistics. FedTAN makes the *first* local step of every round exact centralized
BatchNorm on the union of the clients' batches: in the forward pass each BN layer's mean and
then variance around the global mean are aggregated across clients (Algorithm 2), in the
backward pass the gradients with respect to them (Algorithm 3). Steps 2..E are ordinary local
BN steps and the round ends with FedAvg, running statistics averaged naively (Eq. 7), as the
paper does (Wang et al., 2023, Sec. 5.1).

Here the synchronised step runs on the vectorized executor: the round's clients are one stacked
model whose BN layers reduce over the client axis through the engine's
:class:`~fednorm.nn.comm.ClientComm`, and autograd supplies Algorithm 3. The layer-wise order
of a residual network's BN layers is therefore automatic, and the same layer code
runs over ``torch.distributed`` once the reduction is a collective.

Communication is counted where it happens, not derived: the layer-wise exchanges by the
``ClientComm`` of the synchronised step (two per BN layer forward, one backward: 3L + 1 per
round with the model exchange, the paper's count), the model exchange by the simulator.

Choices where the paper is silent, all documented in docs/fedtan.md:

- A1: statistics are aggregated with count weights ``B_i / ΣB`` (exactly the union's); Eq. 7
  uses the FedAvg weights ``|D_i| / |D|``. They coincide in every paper experiment.
- A2: each client uploads the direct partial ``∇μ`` (the variance→mean path, whose sum over
  clients is zero, is left out, as in the released code): exact, tested against centralized BN
  to ~1e-12.
- A3: the synchronised step's running variance is unbiased with the union count
  ``n/(n−1)`` (what centralized BN on the union batch does).
- A4: the client optimiser is re-created after step 1, as the released code does
  (``reset_momentum=True``); momentum restarts every round anyway.
- A6: batches are drawn without replacement (fresh permutations), not with replacement as the
  released code samples.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from ..errors import ConfigError
from ..nn.norms import is_batch_norm
from .base import ClientUpdates
from .fedavg import FedAvg
from .policy import NormPolicy
from .registry import register_method

__all__ = ["FedTAN", "FedTANForward", "batch_norm_layers"]


def batch_norm_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if is_batch_norm(m)]


@register_method("fedtan")
class FedTAN(FedAvg):
    """FedAvg whose first local step per round is BatchNorm synchronised across clients.

    Args:
        freeze_after: FedTAN-II: after this many rounds (the paper's M) the BN statistics are
            frozen at their aggregated values and used in training and evaluation; from then on
            the rounds are plain FedAvg with no layer-wise exchange. ``None``: never.
        reset_momentum: re-create the client optimiser after the synchronised step (the
            released code's behaviour). (default: ``True``)
        weighting: FedAvg weights of Eq. 7. (default: ``"num_examples"``, the paper's ``|D_i|/|D|``)
    """

    name = "fedtan"
    default_policy = NormPolicy("global", "global")
    allowed_buffers = ("global",)  # the synced first step and the averaged statistics are the method
    allowed_affine = ("global",)
    requires_lockstep = True
    backward_sync = True

    def __init__(
        self,
        freeze_after: int | None = None,
        reset_momentum: bool = True,
        weighting: Literal["num_examples", "uniform"] = "num_examples",
    ) -> None:
        super().__init__(weighting=weighting)
        if freeze_after is not None and (isinstance(freeze_after, bool) or int(freeze_after) != freeze_after or freeze_after < 0):
            raise ConfigError(f"fedtan: freeze_after must be a non-negative integer or null, got {freeze_after!r}")
        self.freeze_after = None if freeze_after is None else int(freeze_after)
        self.reset_momentum = bool(reset_momentum)
        self._layers: list[nn.Module] = []

    def setup(self, model: nn.Module) -> None:
        super().setup(model)
        self._layers = batch_norm_layers(model)
        self._buffer_keys = {
            f"{name}.{b}" for name, m in model.named_modules() if is_batch_norm(m)
            for b, _ in m.named_buffers(recurse=False)
        }
        if not self._layers:
            import warnings

            warnings.warn(f"{self.name}: the model has no BatchNorm layers, so this equals FedAvg", stacklevel=3)

    def frozen(self, server_round: int) -> bool:
        return self.freeze_after is not None and server_round > self.freeze_after

    # -- lockstep hooks -----------------------------------------------------------------------
    def synced_steps(self, server_round: int) -> int:
        return 0 if self.frozen(server_round) or not self._layers else 1

    def sync_backward(self, server_round: int) -> bool:
        return self.backward_sync

    def reset_momentum_after_sync(self) -> bool:
        return self.reset_momentum

    def frozen_statistics(self, server_round: int) -> bool:
        return self.frozen(server_round)

    # -- server -------------------------------------------------------------------------------
    def aggregate(self, server_round: int, global_state: dict[str, torch.Tensor], updates: ClientUpdates) -> dict[str, torch.Tensor]:
        new = super().aggregate(server_round, global_state, updates)
        if self.frozen(server_round):  # statistics stay exactly S̄_M (no float drift from averaging copies)
            new.update({k: global_state[k].clone() for k in self._buffer_keys if k in new})
        return new

    def hparams(self) -> dict[str, Any]:
        return {"freeze_after": self.freeze_after, "reset_momentum": self.reset_momentum, **super().hparams()}


@register_method("fedtan_forward")
class FedTANForward(FedTAN):
    """The paper's "FedAvg + Algorithm 2" baseline (a simplified FedDNA): the first step shares
    the forward statistics only; each client backpropagates with its own statistics' gradients
    and its own count. Shows why FedTAN's backward half matters (Wang et al., 2023, Sec. 6.1.3)."""

    name = "fedtan_forward"
    backward_sync = False
