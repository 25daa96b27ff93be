"""Client-level differential privacy of the uploads: clipped updates and bounded statistics,
each with Gaussian noise added per client before the server aggregates (issue 22).

The formulation (docs/privacy.md):

* **Privacy unit**: one client (all its data), the unit of DP-FedAvg (McMahan et al. 2018,
  arXiv:1710.06963). Neighbouring runs differ in one client's data being present or not; an absent
  client's upload is the global model (update 0) and statistics 0.
* **Updates** (DP-FedAvg's clipping): each client's update ``Δ_i = θ_i − θ`` over the shared
  floating tensors that are not statistics is clipped to L2 norm ``C`` (``dp_clip``):
  ``Δ_i · min(1, C / ‖Δ_i‖)``.
* **Statistics** (means and variances of activations: BN running statistics shared by
  FedAvg+BN, HBN's uploads): their sensitivity is bounded by the activation bound ``B``
  (``dp_stats_bound``): activations clipped to ``[−B, B]`` have per-channel means in ``[−B, B]``
  and variances in ``[0, B²]``, so every uploaded mean is clamped to ``[−B, B]`` and every
  variance to ``[0, B²]`` (the set of statistics that clipped activations can produce); the L2
  sensitivity of a client's statistics vector is then ``S = sqrt(n_mean·B² + n_var·B⁴)``.
* **Noise**: every client adds ``N(0, (σ·C)²)`` to each coordinate of its clipped update and
  ``N(0, (σ·S)²)`` to each coordinate of its statistics before upload (``σ`` = ``dp_noise``), so
  each upload is a Gaussian mechanism with noise multiplier σ on each part: together one
  Gaussian mechanism with multiplier ``σ/√2`` (two sensitivity-1 parts after scaling). The
  server then sees only noisy uploads (local noise: no trusted server and no secure aggregation
  is assumed), and whatever it computes from them (HBN's pooling, clamping a variance at 0) is
  post-processing.
* **Weights**: the uploads' sample counts would reveal the clients' sizes; under DP the model
  average is uniform over the round's clients (the method's weighting is replaced by 1/m), HBN's
  statistics are pooled with equal counts (a public constant) and BN's ``num_batches_tracked``
  keeps the global value.

Accounting (:mod:`fednorm.privacy.accounting`): a client's ε at δ after the rounds it took part
in, with Opacus's RDP accountant; no amplification by subsampling is claimed, since the server
sees who uploaded.

Refused (one message each): methods whose protocol exchanges statistics inside local training
(FedTAN's layer-wise exchanges) or weights them by counts the server must know (FBN's Eq. 9-10),
and uploads this module does not cover (e.g. SCAFFOLD's control variates).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..errors import ConfigError
from ..rng import torch_generator

__all__ = ["ClientLevelDP", "clip_update", "PUBLIC_COUNT"]

#: The count every client's statistics carry under DP (equal weights; large, so Bessel's
#: ``N/(N−1)`` in HBN's Eq. 8 is 1 to float precision).
PUBLIC_COUNT = float(2**30)


def clip_update(delta: torch.Tensor, clip: float) -> tuple[torch.Tensor, float]:
    """``delta · min(1, clip / ‖delta‖)`` and the factor applied."""
    norm = float(delta.norm())
    factor = 1.0 if norm <= clip else clip / norm
    return delta * factor, factor


class ClientLevelDP:
    """Clipping and per-client Gaussian noise of a round's uploads (module docstring).

    Args:
        noise: σ, the noise multiplier (0: clipping only, no privacy).
        clip: C, the L2 bound of a client's update.
        stats_bound: B, the activation bound of the statistics.
        seed: the experiment seed (the noise is seeded per round and client).
    """

    def __init__(self, noise: float, clip: float, stats_bound: float, seed: int = 0) -> None:
        self.noise = float(noise)
        self.clip = float(clip)
        self.stats_bound = float(stats_bound)
        self.seed = seed
        self.participation: dict[int, int] = {}  # round uploads per client
        self.queries: dict[int, int] = {}  # statistics-only answers per client (HBN's passes outside rounds)
        self.has_statistics = False

    @classmethod
    def from_config(cls, config: Any) -> "ClientLevelDP | None":
        if config.dp_clip is None:
            return None
        return cls(config.dp_noise, config.dp_clip, config.dp_stats_bound, config.seed)

    # -- what is private ---------------------------------------------------------------------
    def check_method(self, method: Any) -> None:
        """Refuse methods whose protocol this mechanism does not cover, saying why."""
        inner = getattr(method, "inner", method)
        if getattr(inner, "requires_lockstep", False):
            raise ConfigError(
                f"dp_clip/dp_noise do not work with method '{inner.name}': its clients exchange BN statistics and "
                "their gradients inside the synchronised local step (FedTAN's layer-wise exchanges), which the "
                "client-level mechanism does not privatize; use fedavg, fedbn, silobn or hbn"
            )
        if inner.name == "fbn":
            raise ConfigError(
                "dp_clip/dp_noise do not work with method 'fbn': its aggregation (Eq. 9-10) weights each client's "
                "per-step statistics by its batch counts, which under DP the server must not learn; use fedavg, "
                "fedbn, silobn or hbn"
            )

    def _statistics_extras(self, extras: dict[str, torch.Tensor]) -> tuple[list[str], list[str], list[str]]:
        means = [k for k in extras if k.endswith(".mean")]
        variances = [k for k in extras if k.endswith(".var")]
        counts = [k for k in extras if k.endswith(".count")]
        other = set(extras) - set(means) - set(variances) - set(counts)
        if other:
            raise ConfigError(
                f"dp_clip/dp_noise cover model updates and normalization statistics; this run also uploads "
                f"{sorted(other)[:3]}, which they do not privatize (e.g. SCAFFOLD's control variates): "
                "drop the client optimizer or the privacy options"
            )
        return means, variances, counts

    # -- the mechanism -----------------------------------------------------------------------
    def __call__(self, updates: Any, global_state: dict[str, torch.Tensor], method: Any, server_round: int) -> Any:
        """The round's uploads as the clients send them under DP (clipped, bounded, noisy)."""
        stats = method.statistics_keys()
        means_x, vars_x, counts_x = self._statistics_extras(updates.extras)
        stat_extras = bool(means_x or vars_x)
        state_means = [k for k in stats["mean"] if k in updates.states]
        state_vars = [k for k in stats["var"] if k in updates.states]
        states = {k: v.clone() for k, v in updates.states.items()}
        extras = {k: v.clone() for k, v in updates.extras.items()}
        for k, v in states.items():  # counters (num_batches_tracked) would reveal a client's size
            if not v.is_floating_point():
                v.copy_(global_state[k].expand_as(v))
        if stat_extras:  # the method's statistics are the uploads; the state copies are unused
            for k in state_means + state_vars:
                states[k].copy_(global_state[k].expand_as(states[k]))
            mean_t, var_t = [(extras, k) for k in means_x], [(extras, k) for k in vars_x]
        else:
            mean_t, var_t = [(states, k) for k in state_means], [(states, k) for k in state_vars]
        stat_names = {k for _, k in mean_t + var_t}
        update_keys = [k for k in method.shared_keys if k not in stat_names and states[k].is_floating_point()]
        for k in counts_x:
            extras[k].fill_(PUBLIC_COUNT)
        b = self.stats_bound
        n_mean = sum(d[k][0].numel() for d, k in mean_t)
        n_var = sum(d[k][0].numel() for d, k in var_t)
        stats_sensitivity = math.sqrt(n_mean * b**2 + n_var * b**4)
        self.has_statistics = self.has_statistics or bool(n_mean + n_var)
        for row, cid in enumerate(updates.client_ids):
            gen = torch_generator(self.seed, "dp-noise", server_round, cid)
            delta = torch.cat([(states[k][row].double() - global_state[k].double()).reshape(-1) for k in update_keys])
            clipped, _ = clip_update(delta, self.clip)
            if self.noise > 0:
                clipped = clipped + self.noise * self.clip * torch.randn(clipped.shape, generator=gen, dtype=torch.float64)
            start = 0
            for k in update_keys:
                n = global_state[k].numel()
                value = global_state[k].double() + clipped[start:start + n].reshape(global_state[k].shape)
                states[k][row].copy_(value.to(states[k].dtype))
                start += n
            for group, lo, hi in ((mean_t, -b, b), (var_t, 0.0, b * b)):
                for d, k in group:
                    v = d[k][row].double().clamp(lo, hi)
                    if self.noise > 0:
                        v = v + self.noise * stats_sensitivity * torch.randn(v.shape, generator=gen, dtype=torch.float64)
                    if hi == b * b:
                        v = v.clamp_min(0)  # post-processing: a variance is not negative
                    d[k][row].copy_(v.to(d[k].dtype))
            self.participation[cid] = self.participation.get(cid, 0) + 1
        out = type(updates)(
            client_ids=list(updates.client_ids), states=states, num_examples=torch.ones_like(updates.num_examples),
            train_loss=updates.train_loss, num_steps=updates.num_steps, extras=extras, failures=dict(updates.failures),
            seconds=updates.seconds,
        )
        return out

    def privatize_answers(self, answers: dict[int, dict[str, torch.Tensor]], server_round: int, query: str) -> dict[int, dict[str, torch.Tensor]]:
        """Statistics a client sends outside a round (HBN's initial pass, evaluation re-sync and
        round T+1): bounded, noised and counted like the statistics of an upload; each answer
        is one Gaussian mechanism with multiplier σ."""
        out: dict[int, dict[str, torch.Tensor]] = {}
        for cid, answer in answers.items():
            means, variances, counts = self._statistics_extras(answer)
            b = self.stats_bound
            sensitivity = math.sqrt(sum(answer[k].numel() for k in means) * b**2 + sum(answer[k].numel() for k in variances) * b**4)
            gen = torch_generator(self.seed, "dp-noise", query, server_round, cid)
            new = dict(answer)
            for keys, lo, hi in ((means, -b, b), (variances, 0.0, b * b)):
                for k in keys:
                    v = answer[k].double().clamp(lo, hi)
                    if self.noise > 0:
                        v = v + self.noise * sensitivity * torch.randn(v.shape, generator=gen, dtype=torch.float64)
                    new[k] = (v.clamp_min(0) if lo == 0.0 else v).to(answer[k].dtype)
            for k in counts:
                new[k] = torch.full_like(answer[k], PUBLIC_COUNT)
            out[cid] = new
            self.queries[cid] = self.queries.get(cid, 0) + 1
        return out

    @property
    def noise_multiplier(self) -> float:
        """The noise multiplier of one upload as one Gaussian mechanism: σ, or σ/√2 when the
        upload also holds statistics (two parts, each with multiplier σ)."""
        return self.noise / math.sqrt(2.0) if self.has_statistics else self.noise

    def metrics(self, delta: float) -> dict[str, float]:
        """``dp/...`` metrics: ε at δ of the client that took part most, and the mechanism."""
        from .accounting import epsilon

        histories = {(self.participation.get(c, 0), self.queries.get(c, 0)) for c in set(self.participation) | set(self.queries)}
        eps = max((epsilon([(self.noise_multiplier, r), (self.noise, q)], delta) for r, q in histories), default=0.0)
        return {"dp/epsilon": eps, "dp/delta": delta, "dp/noise_multiplier": self.noise_multiplier,
                "dp/max_participation": max(self.participation.values(), default=0),
                "dp/max_statistics_queries": max(self.queries.values(), default=0)}

    def state_dict(self) -> dict[str, Any]:
        return {"participation": dict(self.participation), "queries": dict(self.queries), "has_statistics": self.has_statistics}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.participation = {int(k): int(v) for k, v in state.get("participation", {}).items()}
        self.queries = {int(k): int(v) for k, v in state.get("queries", {}).items()}
        self.has_statistics = bool(state.get("has_statistics", False))
