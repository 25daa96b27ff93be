"""Personalized models scored on the whole test set (``personalized_test: whole``).

A personalized method (FedBN, SiloBN) has one model per client and no global one. By default
(``personalized_test: own``) :func:`~fednorm.engine.round_evaluation.evaluate_simulation` scores
each client's model on that client's own test split. FedTAN (Wang et al., 2023, §6.2.1) reports
FedBN and SiloBN otherwise: every client's model on the whole test set, the accuracies averaged
over the clients (its Table 1: 90.74% / 19.46% for FedBN, IID / non-IID). :func:`whole_test_scores`
computes that; ``evaluate_simulation`` then reports it as ``test_accuracy`` and ``test_loss``.

The client models are built in this process (``sim.client_model``), so it needs every client's
local tensors here: the in-process engine, not a runtime that hosts clients elsewhere
(:mod:`fednorm.distributed`, :mod:`fednorm.flower`), which :func:`whole_test_scores` refuses.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..errors import ConfigError
from .evaluation import evaluate

__all__ = ["whole_test_scores"]


def _clients_are_here(sim: Any) -> bool:
    """Whether every client's model can be built in this process: ``query_clients`` is the
    in-process engine's (a runtime hosting clients elsewhere overrides it)."""
    owner = next(c for c in type(sim).__mro__ if "query_clients" in vars(c))
    return owner.__module__ == "fednorm.engine.simulator"


def whole_test_scores(sim: Any, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Each client's model (the global ``state`` plus its local tensors) on the whole test set.

    Returns ``test_accuracy`` and ``test_loss``, the unweighted means over the clients of each
    model's accuracy and mean loss (every client counts once; all score the same samples), and
    ``client_accuracies_whole_test``, one accuracy per client in client order.

    Raises:
        ConfigError: when the clients are hosted outside this process.
    """
    if not _clients_are_here(sim):
        raise ConfigError(
            "personalized_test: whole scores every client's model in the server's process; this runtime hosts the "
            "clients elsewhere: use personalized_test: own"
        )
    data, cfg = sim.data, sim.config
    accs: list[float] = []
    losses: list[float] = []
    for cid in range(data.num_clients):
        res = evaluate(sim.client_model(cid, state), data.test_x, data.test_y, batch_size=cfg.eval_batch_size,
                       channels_last=sim.spec.channels_last)
        accs.append(float(res.accuracy))
        losses.append(float(res.loss))
    return {
        "test_accuracy": sum(accs) / len(accs) if accs else math.nan,
        "test_loss": sum(losses) / len(losses) if losses else math.nan,
        "client_accuracies_whole_test": accs,
    }
