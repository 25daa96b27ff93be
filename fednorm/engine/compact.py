"""Smaller checkpoints of DSGD runs: the clients' momenta replaced by their weighted mean.

Why: DSGD (the FBN paper's optimiser, ``dsgd: true``) keeps a persistent momentum per client, one
copy of the model each. FBN's 10 clients make a 58 MB checkpoint, 52 MB of it momentum: too large
to commit or to carry to another machine, so an unfinished run could only resume where it started.
Lossless compression does not help much (zlib leaves 64%: the mantissas are noise).

Why the mean is enough. Every client computes its gradient ``g_k`` at the same global weights
``w``, steps ``m_k <- beta m_k + (1 - beta) g_k`` and uploads ``w - lr m_k``; the server takes the
weighted mean with weights ``a_k`` that are the same every round (the client's number of training
samples ``n_k``, or 1 each with ``weighting: uniform``). So
``w' = w - lr M`` with ``M = sum a_k m_k / sum a_k``, and ``M' = beta M + (1 - beta) sum a_k g_k /
sum a_k``: the global weights depend on the client momenta only through ``M``. Setting every
``m_k`` to ``M`` changes the client momenta but, in real arithmetic, no later global weight,
statistic or evaluation. In floating point the resumed run rounds differently from one that was
never interrupted (its mean is taken in another order); in float64 the two agree to ~1e-12.

Byzantine clients that attack only the BN statistics (``attack_targets: stats``, the FBN robust
table's) upload the honest clients' plain mean as their weights, so the aggregate stays a fixed
linear combination of the honest momenta, with coefficients ``a_k + f b / H`` (``H`` honest
clients, ``f`` attackers of weight ``b``): the combination with those coefficients is kept.

It holds only where the server's rule for the weights is such a fixed linear combination and every
client steps every round; :func:`mean_momentum_exact` names what breaks it (a robust rule or NNM on
the weights, attacks on the updates, partial participation or failures, differential privacy, a
client optimiser), and :func:`compact_checkpoint` refuses those runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .executor import MOMENTUM_PREFIX

__all__ = ["COMPACTED_KEY", "CompactInfo", "mean_momentum_exact", "momentum_weights", "compact_checkpoint"]

#: Key of a compacted checkpoint saying what was replaced (read by reports; ignored on resume).
COMPACTED_KEY = "compacted"
# Methods whose model aggregate is FedAvg's weighted mean of the client weights (client_weights).
_LINEAR_METHODS = ("fedavg", "fbn", "fixbn")


@dataclass(frozen=True)
class CompactInfo:
    """What :func:`compact_checkpoint` did."""

    round: int
    clients: int  # clients whose momentum now is the shared mean
    tensors: int  # momentum tensors per client
    bytes_saved: int  # tensor bytes no longer stored (the storage of K-1 momenta)


def mean_momentum_exact(config: Mapping[str, Any]) -> str | None:
    """None when replacing the clients' DSGD momenta by their weighted mean changes no later global
    weight (see the module docstring), else why not. ``config``: the run's config as a dict (a
    checkpoint's ``config``, or ``ExperimentConfig.model_dump()``)."""
    c = dict(config)
    if not c.get("dsgd"):
        return "not a DSGD run: its clients keep no persistent momentum"
    num_clients = int(c.get("num_clients") or 0)
    if c.get("clients_per_round") not in (None, num_clients):
        return "partial participation: a client's momentum waits between its rounds, so the mean does not evolve alone"
    faults = [k for k in ("client_failure_rate", "client_nan_rate", "straggler_rate") if float(c.get(k) or 0) > 0]
    if faults or c.get("client_deadline") is not None:
        return f"clients may miss a round ({', '.join(faults) or 'client_deadline'})"
    attacked = str(c.get("attack", "none")) != "none"
    if attacked and c.get("attack_targets", "stats") != "stats":
        return (f"attack_targets '{c.get('attack_targets')}': the Byzantine updates are computed from the honest clients' "
                "individual updates")
    robust_weights = c.get("robust_targets", "both") != "stats" and (str(c.get("aggregator", "mean")) != "mean" or bool(c.get("nnm")))
    if robust_weights:
        return f"the weights are aggregated with '{'nnm+' if c.get('nnm') else ''}{c.get('aggregator')}', which is not a linear mean"
    if float(c.get("dp_noise") or 0) > 0 or c.get("dp_clip") is not None:
        return "differential privacy clips and noises each client's update"
    if str(c.get("client_opt", "none")) != "none":
        return f"client optimiser '{c.get('client_opt')}' keeps per-client state of its own"
    if str(c.get("method")) not in _LINEAR_METHODS:
        return f"method '{c.get('method')}': only FedAvg's weighted mean ({', '.join(_LINEAR_METHODS)}) is known to be linear"
    return None


def momentum_weights(config: Mapping[str, Any], client_sizes: Sequence[int]) -> torch.Tensor:
    """Each client's coefficient of its momentum in the server's new weights (float64, not
    normalised): its number of training samples (FedAvg's ``num_examples``, the client's data, not
    the one batch it stepped on), or 1 for every client holding data with ``weighting: uniform``;
    plus, under an attack on the statistics, its share ``f b / H`` of the f Byzantine rows, which
    upload the plain mean of the H honest clients' weights with weight ``b`` (the honest mean of
    ``num_examples``, or 1)."""
    sizes = torch.as_tensor([int(n) for n in client_sizes], dtype=torch.float64)
    uniform = (config.get("method_args") or {}).get("weighting", "num_examples") == "uniform"
    weights = (sizes > 0).to(torch.float64) if uniform else sizes
    f = int(config.get("num_byzantine") or 0) if str(config.get("attack", "none")) != "none" else 0
    if f:
        if bool((sizes == 0).any()):
            raise ValueError("a client without data under an attack: the Byzantine rows' weight is not fixed")
        byzantine = 1.0 if uniform else float(sizes.mean())
        weights = weights + f * byzantine / len(sizes)
    return weights


def compact_checkpoint(state: dict[str, Any], client_sizes: Sequence[int]) -> CompactInfo:
    """Replace, in place, every client's DSGD momentum in ``state`` (a checkpoint as loaded) by
    their weighted mean: one tensor that every client's entry references, so ``torch.save`` stores
    it once. ``client_sizes``: each client's number of training samples (the partition's), indexed
    by client id. Marks the state with :data:`COMPACTED_KEY`.

    Raises:
        ValueError: the run is not one where the mean is exact (:func:`mean_momentum_exact`), or the
            bank's clients do not match ``client_sizes``.
    """
    config = state.get("config") or {}
    reason = mean_momentum_exact(config)
    if reason is not None:
        raise ValueError(f"cannot replace this run's client momenta by their mean: {reason}")
    bank: dict[int, dict[str, torch.Tensor]] = state["bank"]
    weights = momentum_weights(config, client_sizes)
    holders = sorted(cid for cid, s in bank.items() if any(k.startswith(MOMENTUM_PREFIX) for k in s))
    if not holders:
        raise ValueError("the checkpoint holds no client momentum (a DSGD run before its first round?)")
    expected = [cid for cid in range(len(weights)) if weights[cid] > 0]
    if holders != expected:
        raise ValueError(f"the clients holding momentum ({len(holders)}) are not the {len(expected)} clients with data: "
                         "the partition does not match the checkpoint, or a client missed a round")
    keys = sorted(k for k in bank[holders[0]] if k.startswith(MOMENTUM_PREFIX))
    a = weights[holders]
    saved = 0
    for key in keys:
        stacked = torch.stack([bank[cid][key].double() for cid in holders])
        mean = torch.tensordot(a / a.sum(), stacked, dims=1).to(bank[holders[0]][key].dtype)
        for cid in holders:
            bank[cid][key] = mean
        saved += (len(holders) - 1) * mean.numel() * mean.element_size()
    info = CompactInfo(round=int(state.get("server_round", 0)), clients=len(holders), tensors=len(keys), bytes_saved=saved)
    state[COMPACTED_KEY] = {"kind": "dsgd_momentum_mean", "round": info.round, "clients": info.clients}
    return info
