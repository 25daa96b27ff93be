"""Datasets, partitions over clients, and the in-memory federated view of both.

The dispatching function ``partition(name, labels, ...)`` lives in :mod:`fednorm.data.partition`
(not re-exported here, so that the submodule name is not shadowed).
"""

from .datasets import (
    DATASETS,
    DatasetInfo,
    ImageDataset,
    dataset_to_tensors,
    get_dataset_info,
    list_datasets,
    load_dataset,
    register_dataset,
)
from .federated import FederatedData, build_federated_data
from .partition import (
    PARTITIONS,
    describe,
    get_partition,
    label_histogram,
    list_partitions,
    register_partition,
    split_like,
)

__all__ = [
    "DATASETS",
    "DatasetInfo",
    "ImageDataset",
    "dataset_to_tensors",
    "get_dataset_info",
    "list_datasets",
    "load_dataset",
    "register_dataset",
    "FederatedData",
    "build_federated_data",
    "PARTITIONS",
    "describe",
    "get_partition",
    "label_histogram",
    "list_partitions",
    "register_partition",
    "split_like",
]
