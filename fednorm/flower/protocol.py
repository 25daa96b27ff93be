"""What fednorm's Flower messages hold: the names both sides agree on.

A server message (``"train"``, ``"evaluate"`` or ``"query"`` / ``"query.bank"``) holds

- ``"fednorm"`` (ConfigRecord): ``config`` (the experiment as JSON: under ``run_simulation``
  the run config is empty, so every message carries it), ``server-round``, ``clients`` (the
  round's sampled clients, or the queried ones), ``lr``, ``query``, ``method-state`` (the JSON
  skeleton of the method's server state, e.g. SCAFFOLD's control variate);
- ``"global"`` (ArrayRecord): the global model state;
- ``"method"`` (ArrayRecord): the tensors of the method's server state;
- ``"state"`` (ArrayRecord, queries only): tensors of the model to query that differ from the
  global state (HBN's re-synchronised statistics for evaluation);
- ``"bank"`` (ArrayRecord, once after a resume): clients' local state from the checkpoint.

A node's reply holds ``"fednorm"`` (ConfigRecord: ``partition-id``, ``num-partitions``,
``samples-seen``, the client ids and failures of ``"updates"``, or ``error-type`` / ``error``
when a fednorm error stopped it), ``"updates"`` (train: the stacked rows of the
hosted clients) or ``"answers"`` (queries: ``"<client>/<name>"`` tensors), and ``"metrics"``
(MetricRecord with ``num-examples``, for Flower's own logs).
"""

from __future__ import annotations

import json

from ..config import ExperimentConfig
from ..config_roles import NODE_IRRELEVANT_FIELDS

__all__ = ["TRAIN", "EVALUATE", "QUERY", "BANK", "config_json", "config_key"]

TRAIN = "train"
EVALUATE = "evaluate"  # personalised evaluation: each client's model on its own test split
QUERY = "query"  # a method's client query (HBN's "statistics")
BANK = "query.bank"  # the clients' local state, for checkpoints and the summary

# fields that do not change what a node computes
_NODE_IRRELEVANT = NODE_IRRELEVANT_FIELDS


def config_json(config: ExperimentConfig) -> str:
    return json.dumps(config.model_dump(mode="json"), sort_keys=True)


def config_key(text: str) -> str:
    """The part of a config that decides a node's experiment (its cache key)."""
    data = json.loads(text)
    for k in _NODE_IRRELEVANT:
        data.pop(k, None)
    return json.dumps(data, sort_keys=True)
