"""A dataset split over clients, held as tensors in memory.

Training and test images are normalised once into float tensors; a client is just an index
tensor into them, so drawing a batch is one ``index_select`` with no per-sample Python.
Each client also gets a test split with its own label mix (the LN and FedBN papers evaluate
per client), carved out of the global test set by :func:`~fednorm.data.partition.split_like`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import PartitionError
from .datasets import DatasetInfo, dataset_to_tensors, load_dataset
from .partition import label_histogram, partition, split_like

__all__ = ["FederatedData", "build_federated_data", "cached_federated_data", "federated_data_from_config"]


@dataclass
class FederatedData:
    """Train/test tensors plus the per-client index sets.

    Attributes:
        info: dataset facts (classes, channels, image size, normalisation, augmentation).
        train_x, train_y: all training samples (``N×C×H×W`` float, ``N`` int64).
        test_x, test_y: the global test set.
        client_train: one sorted int64 index tensor into ``train_*`` per client.
        client_test: one index tensor into ``test_*`` per client, with its label mix.
        augment: apply random crop + flip to training batches.
    """

    info: DatasetInfo
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    client_train: list[torch.Tensor]
    client_test: list[torch.Tensor]
    augment: bool = False

    @property
    def num_clients(self) -> int:
        return len(self.client_train)

    @property
    def num_classes(self) -> int:
        return self.info.num_classes

    def client_sizes(self) -> np.ndarray:
        return np.array([len(ix) for ix in self.client_train], dtype=np.int64)

    def histogram(self) -> np.ndarray:
        """Per-client training label histogram, ``[num_clients, num_classes]``."""
        parts = [ix.numpy() for ix in self.client_train]
        return label_histogram(self.train_y.numpy(), parts, self.num_classes)

    def to(self, device: str | torch.device, dtype: torch.dtype | None = None) -> "FederatedData":
        self.train_x = self.train_x.to(device=device, dtype=dtype or self.train_x.dtype)
        self.test_x = self.test_x.to(device=device, dtype=dtype or self.test_x.dtype)
        self.train_y = self.train_y.to(device)
        self.test_y = self.test_y.to(device)
        self.client_train = [ix.to(device) for ix in self.client_train]
        self.client_test = [ix.to(device) for ix in self.client_test]
        return self


def build_federated_data(
    dataset: str,
    *,
    num_clients: int,
    partition_name: str,
    seed: int,
    data_dir: str | None = None,
    download: bool = False,
    augment: bool | None = None,
    **partition_params: object,
) -> FederatedData:
    """Load ``dataset``, split its training set with ``partition_name`` and build client test splits.

    Raises:
        PartitionError: the partition is impossible (e.g. more clients than samples).
        DatasetError: the files are missing or corrupt.
    """
    train = load_dataset(dataset, data_dir, train=True, download=download)
    test = load_dataset(dataset, data_dir, train=False, download=download)
    info = train.info
    if num_clients > len(train):
        raise PartitionError(
            f"num_clients={num_clients} exceeds the {len(train)} training samples of '{dataset}'"
        )
    parts = partition(partition_name, train.targets, num_clients, seed=seed, **partition_params)
    hist = label_histogram(train.targets, parts, info.num_classes)
    test_parts = split_like(test.targets, hist, seed=seed)
    train_x, train_y = dataset_to_tensors(train)
    test_x, test_y = dataset_to_tensors(test)
    return FederatedData(
        info=info,
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        client_train=[torch.as_tensor(p, dtype=torch.int64) for p in parts],
        client_test=[torch.as_tensor(p, dtype=torch.int64) for p in test_parts],
        augment=info.augment if augment is None else augment,
    )


@functools.lru_cache(maxsize=4)
def _cached(dataset: str, num_clients: int, partition_name: str, seed: int, data_dir: str | None, params: tuple) -> FederatedData:
    return build_federated_data(dataset, num_clients=num_clients, partition_name=partition_name, seed=seed, data_dir=data_dir, **dict(params))


def cached_federated_data(
    dataset: str, *, num_clients: int, partition_name: str, seed: int, data_dir: str | None = None, **partition_params: object
) -> FederatedData:
    """:func:`build_federated_data`, memoised per process (for worker processes that serve many
    clients, e.g. Flower's simulation actors). Treat the result as read-only."""
    return _cached(dataset, num_clients, partition_name, seed, data_dir, tuple(sorted(partition_params.items())))


def federated_data_from_config(config: object) -> FederatedData:
    """:func:`build_federated_data` with the data and partition fields of an ``ExperimentConfig``."""
    c = config
    return build_federated_data(
        c.dataset,  # type: ignore[attr-defined]
        num_clients=c.num_clients,  # type: ignore[attr-defined]
        partition_name=c.partition,  # type: ignore[attr-defined]
        seed=c.seed,  # type: ignore[attr-defined]
        data_dir=c.data_dir,  # type: ignore[attr-defined]
        download=c.download,  # type: ignore[attr-defined]
        augment=getattr(c, "augment", None),
        alpha=c.alpha,  # type: ignore[attr-defined]
        classes_per_client=c.classes_per_client,  # type: ignore[attr-defined]
        gamma=c.gamma,  # type: ignore[attr-defined]
        min_size=c.min_size,  # type: ignore[attr-defined]
        **c.partition_args,  # type: ignore[attr-defined]
    )
