"""Multi-source (feature-shift) datasets: one array per split plus the source of every sample.

FedBN's setting (Li et al., 2021, Sec. 5) gives each client one data source ("domain") with its
own train and test split. A :class:`MultiDomainDataset` is an ordinary :class:`ImageDataset`
(``data``, ``targets``) with two more attributes, ``domains`` (int64 source index of every
sample) and ``domain_names``; the ``domains`` partition assigns whole sources to clients, and
:func:`~fednorm.data.federated.build_federated_data` draws each such client's test split from
its own source's test set.

Registered datasets:

* ``digits_domains`` — generated offline from MNIST, USPS and CIFAR-10
  (:mod:`fednorm.data.digits_domains`), cached as an ``.npz``.
* ``digits5``, ``office_caltech10``, ``domainnet``, ``image_folder`` — presets of the
  ``domains`` dataset (:mod:`fednorm.data.presets`, :mod:`fednorm.data.domains_dataset`);
  Digits-5's files are read by :mod:`fednorm.data.digits5`.

:class:`MultiDomainDataset`, the base of them all, lives in :mod:`fednorm.data.base`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import DatasetError
from .base import DatasetInfo, MultiDomainDataset, _Found, register_dataset
from .cache import generated_cache_dir
from .cifar import CIFAR10
from .digits_domains import DOMAIN_NAMES, cache_key, find_fonts, generate_digits_domains
from .mnist import MNIST
from .usps import USPS

__all__ = ["MultiDomainDataset", "generated_cache_dir", "DigitsDomains", "Digits5", "ImageFolderDomains", "OfficeCaltech10", "DomainNet"]

_DIGITS = [str(i) for i in range(10)]
_HALF = (0.5, 0.5, 0.5)  # FedBN's Normalize((0.5,)*3, (0.5,)*3) for every digits domain


# -- generated digits domains ---------------------------------------------------------------


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK)


@register_dataset("digits_domains")
class DigitsDomains(MultiDomainDataset):
    """Five feature-shifted digit domains built offline (see ``fednorm.data.digits_domains``).

    ``mnist``, ``usps``, ``synth`` (printed digits), ``mnistm`` (MNIST-M style) and ``colour``
    (colour/contrast/inversion shift), each 7,438 train / 1,860 test, 28×28×3, normalised with
    mean = std = 0.5 as FedBN's code. Needs MNIST, USPS and CIFAR-10 in ``root`` in any layout
    their loaders accept (e.g. the npz files of the team's shared data). The result is cached in
    ``generated_cache_dir()`` (a copy placed in ``root`` is used too); the file name encodes
    the generator version, seed and fonts. Generation (seed 0) takes about ten seconds.
    """

    info = DatasetInfo(name="digits_domains", num_classes=10, in_channels=3, image_size=(28, 28), mean=_HALF, std=_HALF)
    classes = _DIGITS
    domain_names = list(DOMAIN_NAMES)
    generation_seed: ClassVar[int] = 0

    def _cache_name(self) -> str:
        return cache_key(self.generation_seed, find_fonts())

    def _cache_folders(self) -> list[Path]:
        """Where a generated file is looked for: ``root`` (pre-generated copies), then the cache."""
        assert self.root is not None
        return [self.root, generated_cache_dir()]

    def _locate(self) -> tuple[_Found | None, list[str]]:
        name = self._cache_name()
        for folder in self._cache_folders():
            if (folder / name).is_file():
                return _Found("npz", (folder / name,)), []
        target = generated_cache_dir()
        if not _writable(target):
            return None, [f"the cache folder {target} is not writable (set $FEDNORM_CACHE)"]
        try:
            arrays = generate_digits_domains(self._load_source, seed=self.generation_seed)
        except DatasetError as exc:
            return None, [f"digits_domains is generated from MNIST, USPS and CIFAR-10 in {self.root}: {exc}"]
        tmp = target / f"{name}.{os.getpid()}.part.npz"
        np.savez(tmp, **arrays)
        os.replace(tmp, target / name)  # atomic: concurrent runs never read a half-written file
        return _Found("npz", (target / name,)), []

    def _load_source(self, name: str, train: bool) -> tuple[np.ndarray, np.ndarray]:
        cls = {"mnist": MNIST, "usps": USPS, "cifar10": CIFAR10}[name]
        ds = cls(self.root, train=train)
        return ds.data, ds.targets

    def _load_domains(self, found: _Found) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        path = found.paths[0]
        split = "train" if self.train else "test"
        try:
            with np.load(path, allow_pickle=False) as z:
                return z[f"x_{split}"], z[f"y_{split}"], z[f"d_{split}"]
        except (OSError, ValueError, KeyError) as exc:
            raise DatasetError(f"Could not read {path}: {exc}. Delete it to regenerate.") from exc

    def _advice(self) -> str:
        return (
            "Put MNIST (mnist_{train,test}.npz or the IDX files), USPS (usps_{train,test}.npz or usps.bz2) and "
            "CIFAR-10 (cifar10_train*.npz + cifar10_test*.npz or cifar-10-batches-py) in --data-dir "
            "(e.g. the team's shared/data)."
        )


def __getattr__(name: str) -> Any:
    """``Digits5`` and the image-folder datasets moved to :mod:`fednorm.data.presets`, Digits-5's
    readers to :mod:`fednorm.data.digits5`; their old import path still works (resolved on use;
    neither module imports this one)."""
    if name in ("Digits5", "ImageFolderDomains", "ImageFolder", "OfficeCaltech10", "DomainNet"):
        from . import presets

        return getattr(presets, name)
    if name in ("DIGITS5_DOMAINS", "DIGITS5_FOLDERS", "DIGITS5_ADVICE", "digits5_locate", "digits5_read"):
        from . import digits5

        return getattr(digits5, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
