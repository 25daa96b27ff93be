"""USPS handwritten digits, in the LIBSVM text format (torchvision's layout) or as npz.

Split out of :mod:`fednorm.data.datasets` (one module per source family); the old import paths
still work.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np

from fednorm.errors import DatasetError

from .base import (
    _DIGIT_NAMES,
    DatasetInfo,
    ImageDataset,
    _Found,
    _read_maybe_compressed,
    register_dataset,
)
from .download import check_integrity

__all__ = ["USPS"]


@register_dataset("usps")
class USPS(ImageDataset):
    """USPS handwritten digits (Hull, 1994): 7291 train / 2007 test, 16×16.

    Reads torchvision's layout: ``usps.bz2`` / ``usps.t.bz2`` from the LIBSVM site (in
    ``root`` or ``root/usps``), one ``label index:value …`` line per image with labels
    1..10 (stored as 0..9) and values in [-1, 1], converted as torchvision does:
    ``uint8(float32((v + 1) / 2 * 255))``, truncating. Otherwise the npz layout
    ``root/usps_train.npz`` / ``root/usps_test.npz``.
    """

    resources = [("usps.bz2", "ec16c51db3855ca6c91edd34d0e9b197"), ("usps.t.bz2", "8ea070ee2aca1ac39742fdd1ef5ed118")]
    mirrors = ["https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/multiclass/"]
    classes = _DIGIT_NAMES
    # Computed from the 7291 training images under the conversion above.
    info = DatasetInfo(
        name="usps", num_classes=10, in_channels=1, image_size=(16, 16), mean=(0.2539,), std=(0.3842,)
    )
    npz_prefix: ClassVar[str] = "usps"
    train_file: ClassVar[str] = "usps.bz2"
    test_file: ClassVar[str] = "usps.t.bz2"

    def _locate(self) -> tuple[_Found | None, list[str]]:
        assert self.root is not None
        filename = self.train_file if self.train else self.test_file
        md5 = dict(self.resources).get(filename)
        problems: list[str] = []
        for folder in (self.root, self.root / "usps"):
            path = folder / filename
            if path.is_file():
                if check_integrity(path, md5):
                    return _Found("libsvm", (path,)), problems
                problems.append(f"{path} failed its md5 check")
        return None, problems

    def _load(self, found: _Found) -> tuple[np.ndarray, np.ndarray]:
        path = found.paths[0]
        values, targets = _parse_libsvm(path, num_features=16 * 16)
        if values.size and (values.min() < -1 or values.max() > 1):
            raise DatasetError(f"{path} holds pixel values outside [-1, 1]: [{values.min()}, {values.max()}]")
        images = ((values.astype(np.float32) + 1) / 2 * 255).astype(np.uint8)
        return images.reshape(-1, 16, 16, 1), targets - 1

    def _advice(self) -> str:
        filename = self.train_file if self.train else self.test_file
        split = "train" if self.train else "test"
        return (
            f"You can use download=True to download it, or put {filename} in {self.root} "
            f"or {self.root / 'usps'}; or put usps_{split}.npz in {self.root}."
        )


def _parse_libsvm(path: Path, num_features: int) -> tuple[np.ndarray, np.ndarray]:
    """Dense float64 features and int64 labels from a LIBSVM text file (bz2/gz allowed).

    Features absent from a line are 0, as LIBSVM's sparse format defines. Lines are split
    in Python, but the numbers are converted and scattered in bulk by numpy.
    """
    text = _read_maybe_compressed(path)
    try:
        lines = [ln.split() for ln in text.decode("ascii").splitlines() if ln.strip()]
        labels = np.array([float(ln[0]) for ln in lines], dtype=np.float64)
        counts = np.array([len(ln) - 1 for ln in lines], dtype=np.int64)
        pairs = " ".join(" ".join(ln[1:]) for ln in lines).replace(":", " ").split()
        flat = np.array(pairs, dtype=np.float64).reshape(-1, 2)
    except (UnicodeDecodeError, ValueError, IndexError) as exc:
        raise DatasetError(f"{path} is not a valid LIBSVM file: {exc}") from exc
    if len(flat) != counts.sum() or not np.all(labels == np.round(labels)):
        raise DatasetError(f"{path} is not a valid LIBSVM file: malformed 'index:value' pairs or labels")
    index = flat[:, 0].astype(np.int64) - 1  # LIBSVM indices are 1-based
    if index.size and (index.min() < 0 or index.max() >= num_features):
        raise DatasetError(f"{path} has feature indices outside [1, {num_features}]")
    dense = np.zeros((len(lines), num_features), dtype=np.float64)
    dense[np.repeat(np.arange(len(lines)), counts), index] = flat[:, 1]
    return dense, labels.astype(np.int64)
