"""Multi-source (feature-shift) datasets: one array per split plus the source of every sample.

FedBN's setting (spec/004_fedbn.md §2) gives each client one data source ("domain") with its
own train and test split. A :class:`MultiDomainDataset` is an ordinary :class:`ImageDataset`
(``data``, ``targets``) with two more attributes, ``domains`` (int64 source index of every
sample) and ``domain_names``; the ``domains`` partition assigns whole sources to clients, and
:func:`~fednorm.data.federated.build_federated_data` draws each such client's test split from
its own source's test set.

Registered datasets:

* ``digits_domains`` — generated offline from MNIST, USPS and CIFAR-10
  (:mod:`fednorm.data.digits_domains`), cached as an ``.npz``.
* ``digits5``, ``office_caltech10``, ``domainnet``, ``image_folder`` — presets of the
  ``domains`` dataset (:mod:`fednorm.data.presets`, :mod:`fednorm.data.domains_dataset`); this
  module keeps Digits-5's file readers (:func:`digits5_locate`, :func:`digits5_read`).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import DatasetError
from .cache import generated_cache_dir
from .datasets import (
    CIFAR10,
    MNIST,
    USPS,
    DatasetInfo,
    ImageDataset,
    _CifarUnpickler,
    _Found,
    _load_npz_split,
    _npz_split_files,
    register_dataset,
)
from .digits_domains import DOMAIN_NAMES, cache_key, find_fonts, generate_digits_domains

__all__ = ["MultiDomainDataset", "generated_cache_dir", "DigitsDomains", "Digits5", "ImageFolderDomains", "OfficeCaltech10", "DomainNet"]

_DIGITS = [str(i) for i in range(10)]
_HALF = (0.5, 0.5, 0.5)  # FedBN's Normalize((0.5,)*3, (0.5,)*3) for every digits domain


class MultiDomainDataset(ImageDataset):
    """An :class:`ImageDataset` whose samples come from several sources.

    Subclasses' ``_load`` returns ``(data, targets, domains)``; ``domain_names[d]`` names source
    ``d``. Attributes as :class:`ImageDataset`, plus ``domains`` (int64, ``N``) and
    ``domain_names``.
    """

    domain_names: list[str]

    def __init__(self, root: str | os.PathLike | None = None, train: bool = True, download: bool = False) -> None:
        self._domains: np.ndarray | None = None
        super().__init__(root, train, download)
        domains = np.asarray(self._domains, dtype=np.int64)
        if domains.shape != self.targets.shape:
            raise DatasetError(f"{self.info.name}: {len(domains)} domain labels for {len(self.targets)} samples")
        if domains.size and (domains.min() < 0 or domains.max() >= len(self.domain_names)):
            raise DatasetError(f"{self.info.name}: domain indices outside [0, {len(self.domain_names)})")
        self.domains = domains

    def _load(self, found: _Found) -> tuple[np.ndarray, np.ndarray]:
        data, targets, domains = self._load_domains(found)
        self._domains = domains
        return data, targets

    def _load_domains(self, found: _Found) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    def domain_sizes(self) -> dict[str, int]:
        counts = np.bincount(self.domains, minlength=len(self.domain_names))
        return {n: int(c) for n, c in zip(self.domain_names, counts)}


# -- generated digits domains ---------------------------------------------------------------


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK)


@register_dataset("digits_domains")
class DigitsDomains(MultiDomainDataset):
    """Five feature-shifted digit domains built offline (see :mod:`fednorm.data.digits_domains`).

    ``mnist``, ``usps``, ``synth`` (printed digits), ``mnistm`` (MNIST-M style) and ``colour``
    (colour/contrast/inversion shift), each 7,438 train / 1,860 test, 28×28×3, normalised with
    mean = std = 0.5 as FedBN's code. Needs MNIST, USPS and CIFAR-10 in ``root`` in any layout
    their loaders accept (e.g. the npz files of the team's shared data). The result is cached in
    :func:`generated_cache_dir` (a copy placed in ``root`` is used too); the file name encodes
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


# -- the real Digits-5 ----------------------------------------------------------------------


def _read_pickle_arrays(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(images, labels)`` from one of FedBN's ``.pkl`` files, unpickling numpy arrays only."""
    try:
        with open(path, "rb") as f:
            obj = _CifarUnpickler(f, encoding="latin1").load()
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError) as exc:
        raise DatasetError(f"Could not read {path}: {exc}. The file is truncated or corrupt.") from exc
    if not (isinstance(obj, (tuple, list)) and len(obj) == 2):
        raise DatasetError(f"{path} must hold a pickled (images, labels) pair, got {type(obj).__name__}")
    return np.asarray(obj[0]), np.asarray(obj[1])


def _read_mat(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """SVHN/SynthDigits ``.mat``: ``X`` ``H×W×3×N`` uint8, ``y`` ``N×1`` (10 means digit 0)."""
    try:
        from scipy.io import loadmat

        mat = loadmat(path)
    except Exception as exc:  # scipy raises several unrelated types for bad files
        raise DatasetError(f"Could not read {path}: {exc}. The file is truncated or corrupt.") from exc
    if "X" not in mat or "y" not in mat:
        raise DatasetError(f"{path} must hold arrays 'X' (H×W×3×N) and 'y' (N×1)")
    x = np.asarray(mat["X"])
    if x.ndim != 4:
        raise DatasetError(f"{path}: 'X' must be H×W×3×N, got shape {x.shape}")
    y = np.asarray(mat["y"]).reshape(-1).astype(np.int64)
    return np.moveaxis(x, -1, 0).astype(np.uint8), np.where(y == 10, 0, y)


def _read_mnistm_folder(folder: Path, labels_file: Path) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-M's original release: PNGs in ``folder`` listed with labels in ``labels_file``."""
    from PIL import Image

    names, labels = [], []
    for line in labels_file.read_text().splitlines():
        if line.strip():
            name, label = line.split()
            names.append(name)
            labels.append(int(label))
    try:
        images = np.stack([np.asarray(Image.open(folder / n).convert("RGB")) for n in names])
    except (OSError, ValueError) as exc:
        raise DatasetError(f"Could not read the MNIST-M images in {folder}: {exc}") from exc
    return images, np.asarray(labels, dtype=np.int64)


def _as_images(x: np.ndarray, where: str) -> np.ndarray:
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4 or x.shape[-1] not in (1, 3):
        raise DatasetError(f"{where}: expected N×H×W or N×H×W×{{1,3}} images, got {x.shape}")
    return x.astype(np.uint8)


DIGITS5_DOMAINS = ["mnist", "svhn", "usps", "synth", "mnistm"]
DIGITS5_FOLDERS = {"mnist": "MNIST", "svhn": "SVHN", "usps": "USPS", "synth": "SynthDigits", "mnistm": "MNIST_M"}
DIGITS5_ADVICE = (
    "Digits-5 is not downloadable automatically: put FedBN's released folders (MNIST, SVHN, USPS, "
    "SynthDigits, MNIST_M with partitions/train_part*.pkl and test.pkl) or the upstream files "
    "(train_32x32.mat, synth_train_32x32.mat, mnist_m/..., <domain>_{train,test}.npz) in --data-dir. "
    "Offline, use 'digits_domains'."
)


def digits5_locate(root: Path, domain: str, train: bool) -> tuple[str, tuple[Path, ...]] | None:
    """Where Digits-5's ``domain`` split is under ``root`` (``root/digits5``, ``root/Digits``):
    ``(layout, paths)`` or None. Layouts in search order: FedBN's pickles, ``<domain>_{split}.npz``
    (or its ``_part*`` pieces), SVHN's ``.mat``, MNIST-M's PNGs, then the MNIST/USPS loaders."""
    split = "train" if train else "test"
    for base in [b for b in (root, root / "digits5", root / "Digits") if b.is_dir()]:
        folder = base / DIGITS5_FOLDERS[domain]
        if train:
            parts = sorted((folder / "partitions").glob("train_part*.pkl"), key=lambda p: int(p.stem.rsplit("part", 1)[1]))
            if parts:
                return "fedbn_pkl", tuple(parts)
        elif (folder / "test.pkl").is_file():
            return "fedbn_pkl", (folder / "test.pkl",)
        npz = _npz_split_files(base, domain, train)
        if npz:
            return "npz", npz
        mat = {"svhn": f"{split}_32x32.mat", "synth": f"synth_{split}_32x32.mat"}.get(domain)
        for f in (base / mat, base / DIGITS5_FOLDERS[domain] / mat) if mat else ():
            if f.is_file():
                return "mat", (f,)
        if domain == "mnistm":
            for m in (base / "mnist_m", base / "MNIST_M"):
                if (m / f"mnist_m_{split}_labels.txt").is_file():
                    return "mnistm_png", (m / f"mnist_m_{split}", m / f"mnist_m_{split}_labels.txt")
    if domain in ("mnist", "usps"):
        try:
            ds = (MNIST if domain == "mnist" else USPS)(root, train=train)
        except DatasetError:
            return None
        return "loader", ds.source.paths
    return None


def digits5_read(root: Path, domain: str, train: bool, layout: str, paths: tuple[Path, ...]) -> tuple[np.ndarray, np.ndarray]:
    """One Digits-5 split as stored: uint8 ``N×H×W×C`` (C = 1 or 3) and int64 labels."""
    if layout == "fedbn_pkl":
        pairs = [_read_pickle_arrays(p) for p in paths]
        x, y = np.concatenate([_as_images(a, str(p)) for (a, _), p in zip(pairs, paths)]), np.concatenate([b for _, b in pairs])
    elif layout == "npz":
        x, y = _load_npz_split(paths)
    elif layout == "mat":
        x, y = _read_mat(paths[0])
    elif layout == "mnistm_png":
        x, y = _read_mnistm_folder(*paths)
    else:
        ds = (MNIST if domain == "mnist" else USPS)(root, train=train)
        x, y = ds.data, ds.targets
    x = _as_images(np.asarray(x), f"{domain} in {paths[0]}")
    y = np.asarray(y).reshape(-1).astype(np.int64)
    if len(x) != len(y):
        raise DatasetError(f"{domain}: {len(x)} images but {len(y)} labels in {paths[0]}")
    return x, y


def __getattr__(name: str) -> Any:
    """``Digits5`` and the image-folder datasets moved to :mod:`fednorm.data.presets` (presets of
    the ``domains`` dataset); their old import path still works."""
    if name in ("Digits5", "ImageFolderDomains", "ImageFolder", "OfficeCaltech10", "DomainNet"):
        from . import presets

        return getattr(presets, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- image folders (Office-Caltech10, DomainNet) ----------------------------------------------

_IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp"}


def _ci_child(folder: Path, name: str) -> Path | None:
    """The child of ``folder`` called ``name``, ignoring case."""
    exact = folder / name
    if exact.is_dir():
        return exact
    for p in folder.iterdir() if folder.is_dir() else ():
        if p.is_dir() and p.name.lower() == name.lower():
            return p
    return None
