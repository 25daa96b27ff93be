"""The per-round diagnostics of a simulation (``diagnostics: every:N``), as metrics.jsonl keys.

Every key starts with ``diag/`` and holds a number (a flat namespace, so a TensorBoard or report
writer can take each key as one scalar curve); ``<layer>`` is the normalization layer's
module name:

=================================================  =====================================================
``diag/stats/client_mean_shift/<layer>``           clients' statistics vs the union's exact ones: mean
``diag/stats/client_mean_shift_max/<layer>``       shift ``|μ_i − μ*| / σ*`` (p-weighted mean over
``diag/stats/client_var_logratio/<layer>``         clients, and the worst client), and
``diag/stats/client_var_logratio_max/<layer>``     ``|log(σ_i² / σ*²)|``: the heterogeneity BN sees
``diag/stats/agg_mean_shift/<layer>``              the aggregated running statistics (the global model's
``diag/stats/agg_var_logratio/<layer>``            buffers) vs the union's exact ones: the aggregation bias
``diag/grad/cosine``, ``diag/grad/rel_error``,     the clients' p-weighted gradient vs centralized BN's on
``diag/grad/norm_ratio``                           a probe batch drawn across clients
``diag/acc/aggregated``                            test accuracy with the aggregated statistics
``diag/acc/recalibrated``                          ... with the union's exact statistics (one pass)
``diag/acc/gap``                                   recalibrated − aggregated: closable without training
``diag/hbn/batch_weight_{mean,p10,p50,p90}/<l>``   HBN: learned batch weights ``sigmoid(−α)`` over clients × channels
``diag/local/mean_spread/<layer>``                 FedBN/SiloBN: spread of the local running means across
``diag/local/logvar_spread/<layer>``               clients (std over clients / pooled σ) and of log variances
``diag/seconds``, ``diag/round_seconds``           the diagnostics' time and the round's (training + aggregation)
=================================================  =====================================================

The client statistics are each client's moments in the exact pass (the global model, earlier
layers normalised with the union statistics): what the layer's input looks like on that client's
data. Methods whose model is personalized (FedBN, SiloBN) have no global BN state: only the
``diag/local/*`` spread and (for HBN's local alpha) the batch weights are reported for them.
"""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError
from ..rng import torch_generator
from .gradients import gradient_deviation
from .statistics import exact_statistics, norm_layers, standardized_distance

__all__ = ["Diagnostics", "parse_schedule", "PROBE_PER_CLIENT"]

#: Probe samples drawn from each client for the gradient deviation (fewer if it holds fewer).
PROBE_PER_CLIENT = 32


def parse_schedule(value: str) -> int:
    """``"every:N"`` -> N (a positive integer); anything else is a :class:`ConfigError`."""
    match = re.fullmatch(r"\s*every\s*:\s*(\d+)\s*", str(value))
    if not match or int(match.group(1)) < 1:
        raise ConfigError(f"diagnostics must be 'every:N' with N >= 1 (e.g. every:5), got {value!r}")
    return int(match.group(1))


class Diagnostics:
    """Computes the diagnostics of a :class:`~fednorm.engine.simulator.Simulation` after a round.

    Args:
        every: run at evaluated rounds that are multiples of ``every``, and at the last round.
        probe_per_client: probe samples per client for the gradient deviation.
        batch_size: chunk size of the statistics passes.
    """

    def __init__(self, every: int, probe_per_client: int = PROBE_PER_CLIENT, batch_size: int = 512) -> None:
        self.every = every
        self.probe_per_client = probe_per_client
        self.batch_size = batch_size

    @classmethod
    def from_config(cls, config: Any) -> "Diagnostics | None":
        value = getattr(config, "diagnostics", None)
        return None if value in (None, "", "off") else cls(parse_schedule(value))

    def due(self, server_round: int, last_round: int) -> bool:
        return server_round % self.every == 0 or server_round == last_round

    # -- the pieces --------------------------------------------------------------------------
    def __call__(self, sim: Any, round_seconds: float | None = None) -> dict[str, float]:
        """All diagnostics of ``sim`` at its current global state, as ``diag/...`` metrics."""
        start = time.perf_counter()
        out: dict[str, float] = {}
        method = sim.method
        data = sim.data
        client_x = [data.train_x[ix] for ix in data.client_train]
        if not method.personalized and norm_layers(sim.model):
            out.update(self.statistics(sim, client_x))
            out.update(self.gradients(sim))
        out.update(self.local_spread(sim))
        out.update(self.hbn_batch_weights(sim))
        out["diag/seconds"] = time.perf_counter() - start
        if round_seconds is not None:
            out["diag/round_seconds"] = round_seconds
        return out

    def statistics(self, sim: Any, client_x: list[torch.Tensor], progress: Any = None) -> dict[str, float]:
        """Statistics mismatch (clients and aggregate vs exact) and the recalibrated accuracy;
        ``progress`` goes to :func:`exact_statistics`."""
        model = sim.global_model(sim.global_state)
        exact = exact_statistics(model, client_x, batch_size=self.batch_size, channels_last=sim.spec.channels_last,
                                 progress=progress)
        sizes = torch.tensor([float(len(x)) for x in client_x], dtype=torch.float64)
        out: dict[str, float] = {}
        recalibrated = dict(sim.global_state)
        for name, ref in exact.union.items():
            shifts, ratios, weights = [], [], []
            for i, m in enumerate(exact.clients[name]):
                if m is None:
                    continue
                s, r = standardized_distance(m.mean, m.var, ref)
                shifts.append(s), ratios.append(r), weights.append(float(sizes[i]))
            w = np.asarray(weights) / sum(weights)
            out[f"diag/stats/client_mean_shift/{name}"] = float(np.dot(w, shifts))
            out[f"diag/stats/client_mean_shift_max/{name}"] = float(max(shifts))
            out[f"diag/stats/client_var_logratio/{name}"] = float(np.dot(w, ratios))
            out[f"diag/stats/client_var_logratio_max/{name}"] = float(max(ratios))
            mean_key, var_key = f"{name}.running_mean", f"{name}.running_var"
            s, r = standardized_distance(sim.global_state[mean_key], sim.global_state[var_key], ref)
            out[f"diag/stats/agg_mean_shift/{name}"] = s
            out[f"diag/stats/agg_var_logratio/{name}"] = r
            n = float(ref.count)
            recalibrated[mean_key] = ref.mean.to(sim.global_state[mean_key].dtype)
            recalibrated[var_key] = (ref.var * (n / max(n - 1.0, 1.0))).to(sim.global_state[var_key].dtype)
        aggregated, _, _ = sim.evaluate_global(sim.global_state)
        recal, _, _ = sim.evaluate_global(recalibrated)
        out["diag/acc/aggregated"] = aggregated
        out["diag/acc/recalibrated"] = recal
        out["diag/acc/gap"] = recal - aggregated
        return out

    def probe(self, sim: Any) -> tuple[list[int], list[torch.Tensor], list[torch.Tensor]]:
        """The probe batch: up to ``probe_per_client`` seeded samples of every client with 2+."""
        data = sim.data
        ids, xs, ys = [], [], []
        for cid, ix in enumerate(data.client_train):
            if len(ix) < 2:
                continue
            gen = torch_generator(sim.config.seed, "diagnostics-probe", sim.server_round, cid)
            pick = ix[torch.randperm(len(ix), generator=gen)[: self.probe_per_client]]
            ids.append(cid), xs.append(data.train_x[pick]), ys.append(data.train_y[pick])
        return ids, xs, ys

    def gradients(self, sim: Any) -> dict[str, float]:
        method = sim.method
        mode = "synchronised" if method.synced_steps(sim.server_round) > 0 and method.sync_backward(sim.server_round) else "local"
        ids, xs, ys = self.probe(sim)
        if not ids:
            return {}
        shared = set(method.shared_keys)
        params = [n for n, p in sim.model.named_parameters() if p.requires_grad and n in shared]
        states = [sim.executor.client_state(cid, sim.global_state) for cid in ids]
        dev = gradient_deviation(sim.model, sim.global_state, states, xs, ys, params, mode=mode)
        return {f"diag/grad/{k}": v for k, v in dev.items()}

    def local_spread(self, sim: Any) -> dict[str, float]:
        """FedBN/SiloBN: spread of the clients' local running statistics, per layer."""
        local = sim.method.local_keys
        layers = [n for n, _ in norm_layers(sim.model) if f"{n}.running_mean" in local and f"{n}.running_var" in local]
        if not layers:
            return {}
        bank = sim.collect_bank()
        out: dict[str, float] = {}
        for name in layers:
            rows = [s for _, s in sorted(bank.items()) if f"{name}.running_mean" in s]
            if len(rows) < 2:
                continue
            means = torch.stack([s[f"{name}.running_mean"].double() for s in rows])
            variances = torch.stack([s[f"{name}.running_var"].double().clamp_min(0) for s in rows])
            pooled_sd = (variances.mean(0) + means.var(0, unbiased=False) + 1e-5).sqrt()
            out[f"diag/local/mean_spread/{name}"] = float((means.std(0, unbiased=False) / pooled_sd).mean())
            out[f"diag/local/logvar_spread/{name}"] = float((variances + 1e-5).log().std(0, unbiased=False).mean())
        return out

    def hbn_batch_weights(self, sim: Any) -> dict[str, float]:
        """HBN: distribution of ``sigmoid(−alpha)`` over the clients that trained and channels."""
        from ..nn.hbn import hbn_modules

        layers = [n for n, _ in hbn_modules(sim.model)]
        if not layers:
            return {}
        bank = sim.collect_bank()
        out: dict[str, float] = {}
        for name in layers:
            values = [torch.sigmoid(-v.double()).reshape(-1) for s in bank.values() for k, v in s.items()
                      if k == f"{name}.alpha" or k.endswith(f".{name}.alpha")]
            if not values:
                continue
            w = torch.cat(values)
            out[f"diag/hbn/batch_weight_mean/{name}"] = float(w.mean())
            for q in (10, 50, 90):
                out[f"diag/hbn/batch_weight_p{q}/{name}"] = float(torch.quantile(w, q / 100))
        return out

