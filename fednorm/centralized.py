"""The centralized reference: the federation's model trained on the union of the clients' data.

Four of the five papers plot it as the upper bound (FedTAN Table 1 "Centralized+BN", FBN Remark
4.1, the LN paper's Fig. 4/6, HBN). It is a config recipe, not a method: one client holding
every training sample (``num_clients: 1, partition: iid``), FedAvg (the identity on one client),
no client or server optimizer, and the same model, norm, optimizer settings and rounds as the
federation, with the **same number of training samples per round**:

- ``batch="union"`` (default; the LN paper's Fig. 4, batch 320 = 10 clients × 32, and the FBN
  paper's merged batch 500): batch ``K·B`` for the round's ``K`` sampled clients, the same
  number of SGD steps per round;
- ``batch="same"`` (FedTAN's reproduction note A9 keeps batch 128): batch ``B``, ``K`` times the
  steps.

With local epochs (no ``local_steps``) the federation trains ``E·n·K/N`` samples per round in
expectation (``n`` training samples, ``N`` clients); the reference takes
``round(E·n·K/N / batch)`` steps. Clients smaller than one batch (which train on all their
samples each step) make the federation's count smaller than ``K·B`` per step; the reference
does not model that. A fresh optimiser every round (the clients' rule) resets its momentum each
round, as FedTAN's note A9 asks.

``fednorm compare --methods fedavg,centralized`` runs it beside the federation;
``fednorm run --method centralized`` (or ``method: centralized`` in a config file; ``method_args:
{batch: same}`` picks the other batch rule) runs it alone, through :func:`expand_centralized`;
``centralized_config(cfg)`` gives the config in Python.
"""

from __future__ import annotations

from typing import Any

from .config import ExperimentConfig
from .errors import ConfigError

__all__ = ["centralized_overrides", "centralized_config", "expand_centralized", "CENTRALIZED"]

#: The name ``fednorm compare --methods`` accepts for the reference.
CENTRALIZED = "centralized"


def centralized_overrides(config: ExperimentConfig, *, batch: str = "union", train_size: int | None = None) -> dict[str, Any]:
    """The config fields that turn ``config`` (a federation) into its centralized reference.

    Args:
        config: the federated experiment.
        batch: ``"union"`` (batch ``K·B``, same steps) or ``"same"`` (batch ``B``, ``K``× steps).
        train_size: training samples over all clients, for local epochs (default: read from the
            federation's data).
    """
    if batch not in ("union", "same"):
        raise ConfigError(f"Unknown value '{batch}' for argument batch. Valid values are {{union, same}}")
    k = config.sampled_per_round
    bc = config.batch_size * k if batch == "union" else config.batch_size
    if config.dsgd:
        steps = 1 if batch == "union" else k
    elif config.local_steps is not None:
        steps = config.local_steps * (1 if batch == "union" else k)
    else:
        if train_size is None:
            from .data.federated import federated_data_from_config
            from .data.validation import hold_out_validation

            # the samples that train: a validation split (validation_fraction) is held out of them
            data = hold_out_validation(federated_data_from_config(config), config.validation_fraction, config.seed)
            train_size = int(sum(len(ix) for ix in data.client_train))
        per_round = config.local_epochs * train_size * k / config.num_clients
        steps = max(1, round(per_round / bc))
    return {
        "num_clients": 1, "clients_per_round": 1, "partition": "iid", "partition_args": {},
        "method": "fedavg", "method_args": {}, "client_opt": "none", "client_opt_args": {},
        "server_opt": "none", "server_opt_args": {}, "batch_size": bc, "local_steps": None if config.dsgd else steps,
        "attack": "none", "num_byzantine": 0, "aggregator": "mean",
    }


def centralized_config(config: ExperimentConfig, *, batch: str = "union", train_size: int | None = None) -> ExperimentConfig:
    """``config``'s centralized reference (see :func:`centralized_overrides`)."""
    from .api import resolve_config

    over = {k: v for k, v in centralized_overrides(config, batch=batch, train_size=train_size).items() if v is not None}
    base = config.model_dump()
    base.update(over)
    return resolve_config(base)


def expand_centralized(config: ExperimentConfig) -> ExperimentConfig:
    """``config`` itself, or, when its method is ``centralized``, the reference of the federation
    it describes (:func:`centralized_config`; ``method_args`` may hold ``batch``). The run records
    the expanded config (FedAvg on one client holding the union)."""
    if config.method != CENTRALIZED:
        return config
    args = dict(config.method_args)
    batch = args.pop("batch", "union")
    if args:
        raise ConfigError(f"method 'centralized' takes only method_args batch (union or same), got {sorted(args)}")
    federation = config.model_copy(update={"method": "fedavg", "method_args": {}})
    return centralized_config(federation, batch=batch)
