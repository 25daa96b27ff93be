"""MNIST-like datasets in LeCun's IDX format: MNIST and Fashion-MNIST (and the IDX reader).

Split out of :mod:`fednorm.data.datasets` (one module per source family, as torchvision); the
old import paths still work.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import ClassVar

import numpy as np

from fednorm.errors import DatasetError

from .base import (
    DatasetInfo,
    ImageDataset,
    _Found,
    _read_maybe_compressed,
    register_dataset,
)
from .download import check_integrity

__all__ = ["read_idx", "read_idx_images", "MNIST", "FashionMNIST"]


_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str | os.PathLike, ndim: int | None = None) -> np.ndarray:
    """Parse an IDX file (LeCun's MNIST format), gzipped or not.

    The header is two zero bytes, a type code (0x08 = uint8), the number of dimensions
    and one big-endian uint32 per dimension; the payload must have exactly the announced
    size, so truncation is caught here.

    Args:
        path: the file.
        ndim: expected number of dimensions (3 for images, 1 for labels), or ``None``.

    Raises:
        DatasetError: for a bad magic number, an unexpected rank or a size mismatch.
    """
    path = Path(path)
    raw = _read_maybe_compressed(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DatasetError(f"{path} is not an IDX file (bad magic number {raw[:4].hex() or 'none'})")
    dtype, rank = _IDX_DTYPES[raw[2]], raw[3]
    if ndim is not None and rank != ndim:
        raise DatasetError(f"{path} holds a {rank}-D IDX array, expected {ndim}-D")
    header = 4 + 4 * rank
    if len(raw) < header:
        raise DatasetError(f"{path} is truncated: its IDX header needs {header} bytes, got {len(raw)}")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=rank, offset=4))
    expected = math.prod(shape) * dtype.itemsize
    if len(raw) - header != expected:
        state = "truncated" if len(raw) - header < expected else "longer than its header says"
        raise DatasetError(
            f"{path} is {state}: shape {shape} needs {expected} bytes of data, got {len(raw) - header}"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def read_idx_images(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """An MNIST-format pair: uint8 images ``N×H×W`` (returned ``N×H×W×1``) and their uint8 labels
    (returned int64), checked to match; the layout of MNIST, Fashion-MNIST and Morpho-MNIST."""
    images = read_idx(images_path, ndim=3)
    labels = read_idx(labels_path, ndim=1)
    if images.dtype != np.uint8 or labels.dtype != np.uint8:
        raise DatasetError(f"{images_path} and {labels_path} must hold uint8 IDX data (type code 0x08)")
    if len(images) != len(labels):
        raise DatasetError(f"{images_path} holds {len(images)} images but {labels_path} {len(labels)} labels")
    return images[..., None], labels.astype(np.int64)


@register_dataset("mnist")
class MNIST(ImageDataset):
    """MNIST handwritten digits (LeCun et al., 1998): 60000 train / 10000 test, 28×28.

    Searched, in order: the IDX files (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
    ``t10k-…``, each optionally ``.gz``) in ``root``, ``root/MNIST/raw`` (torchvision's
    layout) and ``root/mnist``; then the npz layout ``root/mnist_train.npz`` /
    ``root/mnist_test.npz``. A ``.gz`` file named as in ``resources`` must match the
    upstream md5. ``download()`` fetches the four ``.gz`` files into ``root/MNIST/raw``.
    """

    resources = [
        ("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
        ("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432"),
        ("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3"),
        ("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c"),
    ]
    mirrors = [
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "http://yann.lecun.com/exdb/mnist/",
    ]
    classes = ["0 - zero", "1 - one", "2 - two", "3 - three", "4 - four",
               "5 - five", "6 - six", "7 - seven", "8 - eight", "9 - nine"]  # fmt: skip
    info = DatasetInfo(
        name="mnist", num_classes=10, in_channels=1, image_size=(28, 28), mean=(0.1307,), std=(0.3081,)
    )
    folder: ClassVar[str] = "MNIST"  # torchvision keeps the files in root/MNIST/raw
    alt_folders: ClassVar[tuple[str, ...]] = ("mnist",)
    # Package-managed copies: checksums are skipped (distributions may recompress files).
    system_folders: ClassVar[tuple[Path, ...]] = ()
    npz_prefix: ClassVar[str] = "mnist"

    @property
    def download_folder(self) -> Path:
        assert self.root is not None
        return self.root / self.folder / "raw"

    def _stems(self) -> tuple[str, str]:
        split = "train" if self.train else "t10k"
        return f"{split}-images-idx3-ubyte", f"{split}-labels-idx1-ubyte"

    def _search_folders(self) -> list[tuple[Path, bool]]:
        """``(folder, verify_md5)`` pairs in search order."""
        assert self.root is not None
        user = [self.root, self.download_folder, *(self.root / f for f in self.alt_folders)]
        return [(f, True) for f in user] + [(f, False) for f in self.system_folders]

    @staticmethod
    def _find_file(folder: Path, stem: str, lenient: bool) -> Path | None:
        for candidate in (folder / stem, folder / f"{stem}.gz"):
            if candidate.is_file():
                return candidate
        if lenient:  # e.g. train-images.idx3-ubyte: take whatever the package installed
            prefix = "-".join(stem.split("-")[:2])
            matches = sorted(p for p in folder.glob(f"{prefix}*") if p.is_file())
            if matches:
                return matches[0]
        return None

    def _locate(self) -> tuple[_Found | None, list[str]]:
        known_md5 = dict(self.resources)
        problems: list[str] = []
        for folder, verify in self._search_folders():
            files = [self._find_file(folder, stem, lenient=not verify) for stem in self._stems()]
            if any(f is None for f in files):
                continue
            bad = [
                f for f in files
                if verify and known_md5.get(f.name) and not check_integrity(f, known_md5[f.name])
            ]  # fmt: skip
            if bad:
                problems += [f"{f} failed its md5 check" for f in bad]
                continue
            return _Found("idx", tuple(files)), problems
        return None, problems

    def _load(self, found: _Found) -> tuple[np.ndarray, np.ndarray]:
        return read_idx_images(*found.paths)

    def _advice(self) -> str:
        stems = ", ".join(f"{s}[.gz]" for s in self._stems())
        folders = ", ".join(str(f) for f, _ in self._search_folders())
        return (
            f"You can use download=True to download it, or put {stems} in one of: {folders}; "
            f"or put {self.npz_prefix}_{'train' if self.train else 'test'}.npz in {self.root}."
        )


@register_dataset("fashion_mnist")
class FashionMNIST(MNIST):
    """Fashion-MNIST (Xiao et al., 2017): Zalando product images in MNIST's format.

    Same layouts as :class:`MNIST` (``root/FashionMNIST/raw``, ``root/fashion_mnist``,
    ``root/fashion_mnist_*.npz``), plus Debian's ``dataset-fashion-mnist`` package in
    ``/usr/share/datasets/fashion-mnist``, whose recompressed ``.gz`` files differ from
    upstream's md5 and are therefore only structurally validated.
    """

    resources = [
        ("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
        ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe"),
        ("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79"),
        ("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310"),
    ]
    mirrors = [
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
    ]
    classes = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
               "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]  # fmt: skip
    info = DatasetInfo(
        name="fashion_mnist", num_classes=10, in_channels=1, image_size=(28, 28), mean=(0.2860,), std=(0.3530,)
    )
    folder = "FashionMNIST"
    alt_folders = ("fashion_mnist", "fashion-mnist")
    system_folders = (Path("/usr/share/datasets/fashion-mnist"),)
    npz_prefix = "fashion_mnist"
