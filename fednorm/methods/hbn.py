"""HBN: Hybrid Batch Normalisation (Chen et al., ICML 2025; spec/000_hbn.md).

Each round, before local training, every participating client runs a statistics pass under the
*downloaded* global weights (Eq. 7) and uploads, per HBN layer, the exact ``(count, mean, biased
variance)`` of the layer's input. The server pools them into the exact global statistics with
the within- plus between-client variance and Bessel's correction (Eq. 8), smooths them over rounds
with ``lambda`` (Eq. 11), and averages the weights (FedAvg, sample-count weights). The mixing
logits ``alpha`` never leave their client (per-client state bank).

Evaluation follows the paper (§4.1, spec §2.3): the round's clients recompute their statistics
under the *new* global weights and these, pooled with lambda = 1, normalise the test set; so the
statistics used at test time describe the evaluated weights rather than lagging one round.

Not yet here (tracked in the HBN issue): the ``reference-code`` preset (alpha sign, first-64
statistics, hybrid uploads, lambda 0.002, averaged alpha) and the extra statistics-only round T+1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from ..errors import ConfigError
from ..nn.functional import pooled_stats
from ..nn.hbn import HybridBatchNorm, collect_hbn_statistics
from ..nn.state import state_keys
from .base import ClientContext, ClientUpdates
from .fedavg import FedAvg
from .registry import register_method

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.simulator import Simulation

__all__ = ["HBN"]


@register_method("hbn")
class HBN(FedAvg):
    """FedAvg with HBN layers: a statistics pass per round, exact pooled global statistics.

    Args:
        stats_momentum: lambda of Eq. 11, the weight of the new pooled statistics
            (paper: 0.01; the released code: 0.002; 1 = no smoothing). (default: 0.01)
        stats_mode: forward of earlier layers during the statistics pass: ``"train"`` (hybrid
            normalisation, as the code) or ``"eval"`` (global statistics only). (default: "train")
        stats_batch_size: chunk size of the statistics pass. (default: 512)
        eval_resync: recompute the statistics of the round's clients under the new weights
            before evaluating (the paper's protocol). (default: True)
        weighting: FedAvg weights. (default: "num_examples", as the code)
    """

    name = "hbn"

    def __init__(
        self,
        stats_momentum: float = 0.01,
        stats_mode: Literal["train", "eval"] = "train",
        stats_batch_size: int = 512,
        eval_resync: bool = True,
        weighting: Literal["num_examples", "uniform"] = "num_examples",
    ) -> None:
        super().__init__(weighting=weighting)
        if not (isinstance(stats_momentum, (int, float)) and 0 < stats_momentum <= 1):
            raise ConfigError(f"stats_momentum (lambda, Eq. 11) must be in (0, 1], got {stats_momentum!r}")
        if stats_mode not in ("train", "eval"):
            raise ConfigError(f"Unknown value '{stats_mode}' for argument stats_mode. Valid values are {{train, eval}}")
        if not (isinstance(stats_batch_size, int) and stats_batch_size >= 2):
            raise ConfigError(f"stats_batch_size must be an integer >= 2, got {stats_batch_size!r}")
        self.stats_momentum = float(stats_momentum)
        self.stats_mode = stats_mode
        self.stats_batch_size = stats_batch_size
        self.eval_resync = eval_resync
        self.layers: list[str] = []
        self._last_round_clients: list[int] = []

    # -- model policy -----------------------------------------------------------------------
    def setup(self, model: nn.Module) -> None:
        self.layers = [name for name, m in model.named_modules() if isinstance(m, HybridBatchNorm)]
        if not self.layers:
            raise ConfigError("method 'hbn' needs HBN layers: use norm 'hbn' (or convert_to_hybrid on your model)")
        super().setup(model)

    def select_local_keys(self, model: nn.Module) -> set[str]:
        """alpha (HBN Eq. 9) is configured per client and never communicated."""
        return state_keys(model, lambda m: isinstance(m, HybridBatchNorm), names=HybridBatchNorm.local_tensors)

    # -- client -----------------------------------------------------------------------------
    def client_statistics(self, model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Eq. 7: per HBN layer, exact (count, mean, biased var) of its input on ``x``."""
        batches = list(x.split(self.stats_batch_size))
        if len(batches) > 1 and len(batches[-1]) < 2 and self.stats_mode == "train":
            batches[-2] = torch.cat(batches[-2:])  # a batch of one has no batch variance
            batches.pop()
        stats = collect_hbn_statistics(model, batches, train_mode=self.stats_mode == "train")
        out = {}
        for name in self.layers:
            s = stats[name]
            out[f"hbn.{name}.count"] = s.count.reshape(())
            out[f"hbn.{name}.mean"] = s.mean
            out[f"hbn.{name}.var"] = s.var
        return out

    def client_begin(self, ctx: ClientContext) -> None:
        if ctx.num_examples == 0:
            ctx.uploads.update(self._empty_statistics(ctx.model))
            return
        ctx.uploads.update(self.client_statistics(ctx.model, ctx.x))

    def _empty_statistics(self, model: nn.Module) -> dict[str, torch.Tensor]:
        modules = dict(model.named_modules())
        out = {}
        for name in self.layers:
            c = modules[name].num_features
            out[f"hbn.{name}.count"] = torch.zeros((), dtype=torch.float64)
            out[f"hbn.{name}.mean"] = torch.zeros(c, dtype=torch.float64)
            out[f"hbn.{name}.var"] = torch.zeros(c, dtype=torch.float64)
        return out

    # -- server -----------------------------------------------------------------------------
    def configure_round(self, server_round: int, client_ids: list[int]) -> None:
        self._last_round_clients = list(client_ids)

    def pooled(self, extras: dict[str, torch.Tensor], name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Eq. 8: exact pooled mean and Bessel variance of one layer's input over the clients."""
        count = extras[f"hbn.{name}.count"].reshape(-1)
        if float(count.sum()) < 2:
            return None
        _, mean, var = pooled_stats(count, extras[f"hbn.{name}.mean"], extras[f"hbn.{name}.var"], unbiased=True)
        return mean, var

    def aggregate(
        self, server_round: int, global_state: dict[str, torch.Tensor], updates: ClientUpdates
    ) -> dict[str, torch.Tensor]:
        new = super().aggregate(server_round, global_state, updates)
        lam = self.stats_momentum
        for name in self.layers:
            pooled = self.pooled(updates.extras, name)
            if pooled is None:
                continue
            for key, value in zip(("running_mean", "running_var"), pooled):
                old = global_state[f"{name}.{key}"]
                new[f"{name}.{key}"] = ((1 - lam) * old.double() + lam * value).to(old.dtype)  # Eq. 11
        return new

    # -- evaluation -------------------------------------------------------------------------
    def evaluation_state(self, sim: "Simulation") -> dict[str, torch.Tensor]:
        """The round's clients' statistics under the new weights, pooled with lambda = 1 (§4.1)."""
        if not self.eval_resync or not self._last_round_clients:
            return sim.global_state
        uploads = []
        for cid in self._last_round_clients:
            idx = sim.data.client_train[cid]
            model = sim.client_model(cid)
            if len(idx) == 0:
                uploads.append(self._empty_statistics(model))
            else:
                uploads.append(self.client_statistics(model, sim.data.train_x.index_select(0, idx)))
        extras = {k: torch.stack([u[k] for u in uploads]) for k in uploads[0]}
        state = dict(sim.global_state)
        for name in self.layers:
            pooled = self.pooled(extras, name)
            if pooled is None:
                continue
            for key, value in zip(("running_mean", "running_var"), pooled):
                state[f"{name}.{key}"] = value.to(state[f"{name}.{key}"].dtype)
        return state

    def report(self, sim: "Simulation") -> dict[str, Any]:
        """Learned mixing per layer (the paper never reports it): the batch-statistics weight
        ``sigmoid(-alpha)`` averaged over channels, as mean/min/max over the clients that trained."""
        out: dict[str, Any] = {}
        for name in self.layers:
            key = f"{name}.alpha"
            weights = [torch.sigmoid(-sim.bank.get(c)[key]).mean().item() for c in sim.bank if key in (sim.bank.get(c) or {})]
            if weights:
                out[name] = {
                    "batch_weight_mean": sum(weights) / len(weights),
                    "batch_weight_min": min(weights),
                    "batch_weight_max": max(weights),
                    "clients": len(weights),
                }
        return {"hbn_batch_weight": out}

    def hparams(self) -> dict[str, Any]:
        return {
            "stats_momentum": self.stats_momentum,
            "stats_mode": self.stats_mode,
            "eval_resync": self.eval_resync,
            "weighting": self.weighting,
        }

