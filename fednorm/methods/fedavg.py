"""FedAvg (McMahan et al. 2017, arXiv:1602.05629) with every tensor shared.

With BatchNorm this is the papers' common baseline "FedAvg + BN": running statistics are
averaged like weights, which is biased under non-IID data (FBN §3, FedTAN §2, HBN Eq. 3).
``num_batches_tracked`` (an integer counter) takes the maximum over clients.

With a robust rule set on the method (``aggregator``/``stats_aggregator``, from the config's
``aggregator``, ``nnm`` and ``robust_targets``; :mod:`fednorm.robust`), the model update and the
BN statistics are combined by that rule instead (:meth:`FedAvg.robust_aggregate`).
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import torch

from ..errors import ConfigError
from .base import ClientUpdates, Method
from .registry import register_method

__all__ = ["FedAvg", "aggregate_group"]


def aggregate_group(aggregator: Any, stacked: dict[str, torch.Tensor], weights: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Aggregate tensors ``[K, *shape]`` as one concatenated vector per client, split back."""
    keys = list(stacked)
    k = next(iter(stacked.values())).shape[0]
    flat = torch.cat([stacked[key].reshape(k, -1).double() for key in keys], dim=1)
    agg = aggregator(flat, None if weights is None else weights.to(flat.device))
    out, start = {}, 0
    for key in keys:
        ref = stacked[key]
        n = ref[0].numel()
        out[key] = agg[start : start + n].reshape(ref.shape[1:]).to(ref.dtype)
        start += n
    return out


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
        if self.robust:
            return self.robust_aggregate(updates, weights, self.shared_keys)
        return super().aggregate(server_round, global_state, updates)

    def robust_aggregate(self, updates: ClientUpdates, weights: torch.Tensor, keys: list[str]) -> dict[str, torch.Tensor]:
        """``keys`` aggregated in three groups: statistics means and statistics variances with
        ``stats_aggregator`` (robust naive BN, Guerraoui et al., 2024, Sec. 5), all other floating
        tensors (the model update) with ``aggregator``. Each group is one vector per client,
        so NNM measures distances over the whole group; integer tensors take the maximum."""
        stats = self.statistics_keys()
        means = [k for k in keys if k in set(stats["mean"])]
        variances = [k for k in keys if k in set(stats["var"])]
        grouped = set(means) | set(variances)
        floating = [k for k in keys if k not in grouped and updates.states[k].is_floating_point()]
        out = {k: updates.states[k].max(dim=0).values for k in keys if not updates.states[k].is_floating_point()}
        from ..robust import get_aggregator

        plain = get_aggregator("mean")
        for group, agg in ((means, self.stats_aggregator), (variances, self.stats_aggregator), (floating, self.aggregator)):
            if group:
                out.update(aggregate_group(agg or plain, {k: updates.states[k] for k in group}, weights))
        for k in variances:
            out[k] = out[k].clamp_min(0)
        return out

    def hparams(self) -> dict[str, Any]:
        return {"weighting": self.weighting}
