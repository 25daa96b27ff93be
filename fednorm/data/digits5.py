"""Digits-5's files (FedBN's benchmark): where each domain's split is, and how to read it.

The ``digits5`` preset (:class:`~fednorm.data.presets.Digits5`) asks :func:`digits5_locate` for a
domain's files and :func:`digits5_read` for its arrays. The layouts are FedBN's released pickles,
``<domain>_{train,test}.npz``, SVHN's and SynthDigits' ``.mat``, MNIST-M's PNGs, and whatever the
MNIST and USPS loaders read.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from ..errors import DatasetError
from .base import _load_npz_split, _npz_split_files
from .cifar import _CifarUnpickler
from .mnist import MNIST
from .usps import USPS

__all__ = ["DIGITS5_DOMAINS", "DIGITS5_FOLDERS", "DIGITS5_ADVICE", "digits5_locate", "digits5_read"]


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
