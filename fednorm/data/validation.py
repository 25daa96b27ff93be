"""A validation split held out of each client's training data, for best-validation model selection.

FedBN's released code (Li et al., ICLR 2021; ``federated/fed_office.py``, ``fed_domainnet.py``) reports Office-Caltech10 and DomainNet at the round
of the best mean validation accuracy: each client's validation set is part of its domain's training
split, disjoint from the samples it trains on, and scored every round by the client's own model
(FedBN) or the server model (FedAvg). :func:`hold_out_validation` carves that part out of each
client's training indices (``ExperimentConfig.validation_fraction``): the held-out samples never
train, and the engine scores them at every evaluation (:mod:`fednorm.engine.validation`).

The draw is per client and seeded from ``(seed, "validation", client)``, so it does not depend on
the other clients, on the executor or on a resume. Validation samples are scored without training
augmentation. [code≠ours] FedBN's code takes the last samples of each domain's (pre-shuffled)
training list and scores them under the training transforms (random flip and rotation).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from ..rng import numpy_rng
from .federated import FederatedData

__all__ = ["hold_out_validation", "validation_size"]


def validation_size(num_samples: int, fraction: float) -> int:
    """How many of a client's ``num_samples`` training samples validate: ``fraction`` of them
    rounded to the nearest count (halves up), and at most all but one, so every client that
    holds data still trains on at least one sample."""
    if not 0 <= fraction < 1:
        raise ValueError(f"fraction must lie in [0, 1), got {fraction}")
    return min(math.floor(fraction * num_samples + 0.5), max(num_samples - 1, 0))


def hold_out_validation(data: FederatedData, fraction: float, seed: int) -> FederatedData:
    """``data`` with :func:`validation_size` ``(n_k, fraction)`` of each client's training
    samples moved from ``client_train`` to ``client_val`` (indices into ``train_x``/``train_y``).

    Each client's held-out samples are a uniform draw without replacement from its own training
    indices, from the stream ``(seed, "validation", client)``; both index sets stay sorted. Every
    training sample of a client ends in exactly one of the two. ``fraction == 0`` returns
    ``data`` itself (no ``client_val``), so such a run is the run without validation.

    Args:
        data: the federation (its ``client_val`` must be unset: a split is held out once).
        fraction: the share of each client's training samples that validates, in [0, 1).
        seed: the run's seed.

    Returns:
        A :class:`FederatedData` sharing ``data``'s tensors, with the reduced ``client_train``
        and the new ``client_val``.
    """
    if not 0 <= fraction < 1:
        raise ValueError(f"validation fraction must lie in [0, 1), got {fraction}")
    if fraction == 0:
        return data
    if data.client_val is not None:
        raise ValueError("the data already holds a validation split; hold one out once")
    train, val = [], []
    for client, ix in enumerate(data.client_train):
        n = len(ix)
        held = np.zeros(n, dtype=bool)
        held[numpy_rng(seed, "validation", client).permutation(n)[: validation_size(n, fraction)]] = True
        mask = torch.as_tensor(held, device=ix.device)
        train.append(ix[~mask])  # a sorted index tensor stays sorted under a mask
        val.append(ix[mask])
    return dataclasses.replace(data, client_train=train, client_val=val)
