"""FixBN (Zhong et al. 2023, arXiv:2303.06530): naive BN first, then frozen statistics.

Phase 1 (rounds ``1 .. switch_round``): FedAvg with plain BatchNorm, running statistics averaged
naively. Phase 2 (rounds after ``switch_round``): every BatchNorm normalises with the
aggregated running statistics of the end of phase 1, in training as in evaluation, and these are
no longer updated nor aggregated; the affine parameters keep training. This follows the HBN
authors' released code (the second half trains in eval mode) and the FBN paper's protocol
(Guerraoui et al., 2024, App. C.1: switch at T/2, i.e. 1500 of 3000 iterations).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import ConfigError
from ..nn.state import state_keys
from ..nn.stacked import set_frozen_statistics
from .base import ClientContext, ClientUpdates, StackedClientContext
from .fedavg import FedAvg
from .policy import NormPolicy
from .registry import register_method

__all__ = ["FixBN"]


@register_method("fixbn")
class FixBN(FedAvg):
    """FedAvg + BN whose statistics freeze after ``switch_round``.

    Args:
        switch_round: last round of phase 1 (the paper's setting: half the rounds, e.g. 1500 of
            3000). Required.
        weighting: FedAvg weights (default: ``"uniform"``, as the FBN paper's DSGD).
    """

    name = "fixbn"
    stacks_across_runs = True  # its stacked hooks read only method_args, which stacked runs share
    default_policy = NormPolicy("global", "global")
    allowed_buffers = ("global",)  # averaged, then frozen after switch_round
    allowed_affine = ("global",)

    def __init__(self, switch_round: int | None = None, weighting: Literal["num_examples", "uniform"] = "uniform") -> None:
        super().__init__(weighting=weighting)
        if switch_round is None:
            raise ConfigError("method 'fixbn' needs method_args {switch_round: R}, the last round of naive BN (the papers: rounds / 2)")
        if isinstance(switch_round, bool) or not isinstance(switch_round, int) or switch_round < 0:
            raise ConfigError(f"fixbn: switch_round must be a non-negative integer, got {switch_round!r}")
        self.switch_round = switch_round
        self.frozen = False
        self._training_frozen = False
        self._hooked: list[Any] = []
        self.frozen_keys: set[str] = set()

    def setup(self, model: nn.Module) -> None:
        super().setup(model)
        bn = lambda m: isinstance(m, _BatchNorm)  # noqa: E731
        self.frozen_keys = set(self.shared_keys) & state_keys(
            model, bn, which="buffers", names=("running_mean", "running_var", "num_batches_tracked")
        )
        if not self.frozen_keys:
            raise ConfigError("method 'fixbn' needs BatchNorm layers with running statistics (norm 'bn')")
        for handle in self._hooked:
            handle.remove()
        # A pre-hook puts BN in eval mode during phase-2 training (train_local calls model.train()).
        self._hooked = [m.register_forward_pre_hook(self._freeze_hook) for m in model.modules() if isinstance(m, _BatchNorm)]

    def _freeze_hook(self, module: nn.Module, args: Any) -> None:
        if self._training_frozen:
            module.training = False

    def is_frozen(self, server_round: int) -> bool:
        """Phase 2: rounds after ``switch_round``."""
        return server_round > self.switch_round

    # -- rounds and clients -----------------------------------------------------------------
    def configure_round(self, server_round: int, client_ids: list[int]) -> None:
        self.frozen = self.is_frozen(server_round)

    def client_begin(self, ctx: ClientContext) -> None:
        self._training_frozen = self.is_frozen(ctx.server_round)

    def client_end(self, ctx: ClientContext) -> None:
        self._training_frozen = False

    def stacked_client_begin(self, ctx: StackedClientContext) -> None:
        """Phase 2 on a stacked model: its BatchNorm normalises with the running statistics and
        leaves them alone, as BN in eval mode does."""
        set_frozen_statistics(ctx.model, self.is_frozen(ctx.server_round))

    def stacked_client_end(self, ctx: StackedClientContext) -> None:
        set_frozen_statistics(ctx.model, False)

    def aggregate(self, server_round: int, global_state: dict[str, torch.Tensor], updates: ClientUpdates) -> dict[str, torch.Tensor]:
        new = super().aggregate(server_round, global_state, updates)
        if self.is_frozen(server_round):
            new.update({k: global_state[k].clone() for k in self.frozen_keys})
        return new

    def hparams(self) -> dict[str, Any]:
        return {"switch_round": self.switch_round, "weighting": self.weighting}
