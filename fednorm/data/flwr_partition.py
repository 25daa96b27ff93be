"""Flower's partitioners by name: ``--partition flwr:DirichletPartitioner``.

A user of the Flower ecosystem gets the same client splits as with ``flwr_datasets``: the
partitioner class of :mod:`flwr_datasets.partitioner` is built with ``num_partitions`` =
``num_clients``, ``seed`` = the run's seed (where it takes one), ``partition_by="label"``
(where it takes one) and the run's ``partition_args``; it is given the training labels as a
Hugging Face dataset with a ``label`` column, and each client gets the indices of
``load_partition(i)``. Needs the ``hf`` extra (``pip install fednorm[hf]``).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np

from ..config_roles import PARTITION_FIELDS
from ..errors import ConfigError, PartitionError

__all__ = ["flwr_partitioner", "FLWR_EXTRA"]

FLWR_EXTRA = "flwr: partitions need flwr-datasets: pip install 'fednorm[hf]' (or pip install flwr-datasets)"
# what every partition receives (its config fields, and what multi-source data supplies: partition._DATA_ARGS);
# passed on only where the Flower partitioner takes them
_CONFIG_FIELDS = {*PARTITION_FIELDS, "domains", "domain_names"}
_INDEX = "__fednorm_index"


def _partitioner_class(name: str) -> type:
    try:
        from flwr_datasets import partitioner as module
    except ImportError:
        raise ConfigError(FLWR_EXTRA) from None
    names = {n.lower(): n for n in dir(module) if n.endswith("Partitioner") and n != "Partitioner"}
    key = name.strip().lower()
    if key not in names and key + "partitioner" in names:
        key += "partitioner"
    if key not in names:
        import difflib

        close = difflib.get_close_matches(key, list(names), n=1)
        hint = f" Did you mean 'flwr:{names[close[0]]}'?" if close else ""
        raise ValueError(f"Unknown partition 'flwr:{name}'.{hint} flwr_datasets.partitioner has: {', '.join(sorted(names.values()))}")
    return getattr(module, names[key])


def flwr_partitioner(name: str) -> Callable[..., list[np.ndarray]]:
    """The partition function for ``flwr:<name>`` (the registry's ``flwr`` prefix)."""
    cls = _partitioner_class(name)
    accepted = {p for p in inspect.signature(cls.__init__).parameters if p != "self"}

    def partition(labels: Any, num_clients: int, *, seed: int, **params: Any) -> list[np.ndarray]:
        from datasets import Dataset

        labels = np.asarray(labels, dtype=np.int64)
        unknown = sorted(k for k in params if k not in accepted and k not in _CONFIG_FIELDS)
        if unknown:
            raise PartitionError(
                f"partition_args: flwr:{cls.__name__} takes no option {', '.join(map(repr, unknown))} "
                f"(its options: {', '.join(sorted(accepted - {'num_partitions'})) or 'none'})"
            )
        kwargs = {k: v for k, v in params.items() if k in accepted}
        if "num_partitions" in accepted:
            kwargs["num_partitions"] = num_clients
        if "seed" in accepted:
            kwargs.setdefault("seed", seed)
        if "partition_by" in accepted:
            kwargs.setdefault("partition_by", "label")
        try:
            part = cls(**kwargs)
            part.dataset = Dataset.from_dict({"label": labels, _INDEX: np.arange(len(labels))})
            n = part.num_partitions
            out = [np.sort(np.asarray(part.load_partition(i)[_INDEX], dtype=np.int64)) for i in range(n)]
        except (TypeError, ValueError, KeyError, IndexError) as exc:
            raise PartitionError(f"flwr:{cls.__name__} with {kwargs}: {' '.join(str(exc).split())}") from None
        if len(out) != num_clients:
            raise PartitionError(f"flwr:{cls.__name__} made {len(out)} partitions for num_clients={num_clients}")
        return out

    partition.__name__ = f"flwr_{cls.__name__}"
    partition.__doc__ = f"flwr_datasets.partitioner.{cls.__name__} (see fednorm.data.flwr_partition)."
    return partition
