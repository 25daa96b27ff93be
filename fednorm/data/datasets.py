"""Image-classification datasets as in-memory uint8 arrays, found by name in a registry.

Each dataset follows torchvision's conventions (``resources = [(filename, md5)]`` and
``mirrors`` as class attributes, ``__init__(root, train=True, download=False)``, an
idempotent ``download()`` followed by a second check) but loads the whole split into two
plain arrays: ``data`` (uint8, ``N×H×W×C``) and ``targets`` (int64, ``N``). Federated
partitioners only read ``targets``, and training code turns a client's slice into
normalized tensors in one vectorized step (:func:`dataset_to_tensors`). Besides each
dataset's upstream format, loaders accept an ``.npz`` layout (``x`` uint8 ``N×H×W×C``,
``y`` int64), the format of the project's shared benchmark data. Every file is validated
after loading, and a missing, truncated or corrupt file raises
:class:`~fednorm.errors.DatasetError` naming the file.

Layout: this module holds the registry's entry points (:func:`load_dataset`,
:func:`get_dataset_info`, :func:`list_datasets`, :func:`dataset_to_tensors`);
:mod:`~fednorm.data.base` holds the registry, :class:`~fednorm.data.base.ImageDataset` and the
shared file helpers; each source family has its own module (:mod:`~fednorm.data.mnist` for
IDX/MNIST-like data, :mod:`~fednorm.data.usps`, :mod:`~fednorm.data.cifar`,
:mod:`~fednorm.data.sklearn_digits`, :mod:`~fednorm.data.domains`, :mod:`~fednorm.data.presets`
and :mod:`~fednorm.data.domains_dataset` for several domains, :mod:`~fednorm.data.readers` for
your own files, :mod:`~fednorm.data.hf` for Hugging Face). The families import only the base, so
this module's imports of them go one way: ``from fednorm.data.datasets import MNIST`` keeps
working, and the import graph has no circle (``tests/test_import_graph.py``).
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from fednorm.errors import DatasetError

from .base import DATASETS, DatasetInfo, ImageDataset, default_root, register_dataset
from .cifar import CIFAR10, CIFAR100
from .mnist import MNIST, FashionMNIST, read_idx
from .sklearn_digits import Digits
from .transforms import normalize
from .usps import USPS

__all__ = [
    "DATASETS",
    "register_dataset",
    "list_datasets",
    "load_dataset",
    "get_dataset_info",
    "default_root",
    "DatasetInfo",
    "ImageDataset",
    "Digits",
    "MNIST",
    "FashionMNIST",
    "USPS",
    "CIFAR10",
    "CIFAR100",
    "read_idx",
    "dataset_to_tensors",
]


def list_datasets(
    include: str | Iterable[str] | None = None, exclude: str | Iterable[str] | None = None
) -> list[str]:
    """Sorted names of the registered datasets, optionally filtered by fnmatch patterns."""
    return DATASETS.list(include, exclude)


def load_dataset(
    name: str, root: str | os.PathLike | None = None, *, train: bool = True, download: bool = False, **options: Any
) -> ImageDataset:
    """Load one split of the dataset registered as ``name`` (see :func:`list_datasets`).

    ``options`` are the dataset's own settings (a config's ``dataset_args``, e.g. ``domains``
    and ``image_size`` of the ``domains`` dataset); a dataset without such settings refuses any.
    """
    builder = DATASETS.get_builder(name)
    if options:
        import inspect

        from fednorm.errors import ConfigError

        own = [p for p in inspect.signature(builder.__init__).parameters if p not in ("self", "root", "train", "download")]
        unknown = sorted(k for k in options if k not in own)
        if unknown:
            takes = f"its options: {', '.join(own)}" if own else "it has none"
            raise ConfigError(f"dataset_args: dataset '{name}' takes no option {', '.join(map(repr, unknown))} ({takes})")
    return builder(root=root, train=train, download=download, **options)


def get_dataset_info(name: str) -> DatasetInfo:
    """Static facts about dataset ``name`` (shape, classes, normalization), without loading it."""
    return DATASETS.get_builder(name).info


def dataset_to_tensors(
    ds: ImageDataset, mean: Sequence[float] | None = None, std: Sequence[float] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole dataset as float32 ``N×C×H×W`` normalized with ``mean``/``std`` (default:
    ``info.mean/std``), and int64 labels. uint8 images are scaled to [0, 1] first; float
    features (``sample_dtype`` float32) are standardised in their own units.

    One vectorized conversion, so clients can index tensors instead of decoding samples.
    """
    mean = ds.info.mean if mean is None else tuple(mean)
    std = ds.info.std if std is None else tuple(std)
    if len(mean) != ds.info.in_channels or len(std) != ds.info.in_channels:
        raise DatasetError(
            f"input normalisation has {len(mean)} mean and {len(std)} std values, '{ds.info.name}' has "
            f"{ds.info.in_channels} channel(s)"
        )
    if np.issubdtype(ds.data.dtype, np.floating):  # feature vectors in their own units: no /255
        m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        x = (torch.from_numpy(np.ascontiguousarray(ds.data, dtype=np.float32)).permute(0, 3, 1, 2) - m) / s
        x = x.contiguous()
    else:
        x = normalize(ds.data, mean, std)
    y = torch.from_numpy(np.array(ds.targets, dtype=np.int64))  # a copy: independent of ds
    return x, y
