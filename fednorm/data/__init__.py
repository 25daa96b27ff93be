"""Datasets, partitions over clients, and the in-memory federated view of both.

Every public name of the package is importable from here; importing it registers every built-in
dataset and partition. The modules import one another one way only (``tests/test_import_graph.py``):
the families build on ``fednorm.data.base`` and ``fednorm.data.partition_base``.

The dispatching function ``partition(name, labels, ...)`` lives in ``fednorm.data.partition``
(not re-exported here, so that the submodule name is not shadowed).
"""

from .base import DATASETS, DatasetInfo, ImageDataset, MultiDomainDataset, default_root, register_dataset
from .cifar import CIFAR10, CIFAR100
from .mnist import MNIST, FashionMNIST
from .sklearn_digits import Digits
from .usps import USPS
from .datasets import dataset_to_tensors, get_dataset_info, list_datasets, load_dataset
from .domains import DigitsDomains
from .domains_dataset import DomainsDataset
from .gaussians import TwoGaussians
from .tiny_imagenet import TinyImageNet
from .morpho_mnist import MorphoMNIST
from .abide import ABIDE
from .presets import PACS, Digits5, DomainNet, ImageFolder, OfficeCaltech10
from .hf import HFImageDataset  # registers --dataset hf:<path> (datasets is imported only when used)
from .download import check_integrity, download_url, extract_archive
from .federated import FederatedData, build_federated_data
from . import provenance  # registers dataset/partition user:NAME (data given from Python)
from .partition_base import PARTITIONS, register_partition
from .partition import describe, get_partition, label_histogram, list_partitions, split_like
from .transforms import normalize, random_crop_flip

__all__ = [
    "CIFAR10",
    "CIFAR100",
    "MNIST",
    "USPS",
    "Digits",
    "Digits5",
    "DigitsDomains",
    "DomainsDataset",
    "DomainNet",
    "ImageFolder",
    "MultiDomainDataset",
    "OfficeCaltech10",
    "PACS",
    "TwoGaussians",
    "TinyImageNet",
    "MorphoMNIST",
    "ABIDE",
    "FashionMNIST",
    "default_root",
    "check_integrity",
    "download_url",
    "extract_archive",
    "normalize",
    "random_crop_flip",
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
