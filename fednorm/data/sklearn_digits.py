"""scikit-learn's bundled 8×8 digits: the embedded dataset that needs no files and no network.

Split out of :mod:`fednorm.data.datasets` (one module per source family); the old import paths
still work.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import ClassVar

import numpy as np

from .base import _DIGIT_NAMES, DatasetInfo, ImageDataset, _Found, _stratified_split, register_dataset

__all__ = ["Digits"]


@functools.lru_cache(maxsize=1)
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All 1797 digits as uint8 ``N×8×8×1`` and int64 labels (cached).

    Reads scikit-learn's bundled ``digits.csv.gz`` (64 pixels then the label per row) without
    importing scikit-learn, which takes seconds: every process of a Flower or torch.distributed
    run builds the data. Falls back to ``sklearn.datasets.load_digits`` if the file moved.
    """
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz" if spec else None
    if path is not None and path.is_file():
        table = np.loadtxt(path, delimiter=",")
        pixels, target = table[:, :-1].reshape(-1, 8, 8), table[:, -1]
    else:  # pragma: no cover - another scikit-learn layout
        from sklearn.datasets import load_digits

        bunch = load_digits()
        pixels, target = bunch.images, bunch.target
    images = np.floor(pixels * (255.0 / 16.0) + 0.5).astype(np.uint8)[..., None]
    images.flags.writeable = False  # shared by every Digits instance; splits index copies
    return images, target.astype(np.int64)


@register_dataset("digits")
class Digits(ImageDataset):
    """scikit-learn's bundled handwritten digits (UCI optdigits test set): 1797 images, 8×8.

    Needs no files and no network, which makes it the embedded default dataset for
    examples and tests. Pixel values 0..16 map to uint8 by ``round(v * 255 / 16)``.
    There is no upstream split, so this class makes a deterministic stratified 80/20
    split: for each class, in label order, ``np.random.default_rng(0)`` permutes its
    indices and the first ``floor(0.2 * n_c + 0.5)`` become test samples (1438 train /
    359 test). ``root`` and ``download`` are ignored.
    """

    test_fraction: ClassVar[float] = 0.2
    split_seed: ClassVar[int] = 0
    # Computed from the train split defined above (digits_test.py recomputes them).
    info = DatasetInfo(
        name="digits",
        num_classes=10,
        in_channels=1,
        image_size=(8, 8),
        mean=(0.3055,),
        std=(0.3759,),
    )
    classes = _DIGIT_NAMES

    def _resolve_root(self, root: str | os.PathLike | None) -> Path | None:
        return None

    def _locate(self) -> tuple[_Found | None, list[str]]:
        return _Found("builtin", ()), []

    def _load(self, found: _Found) -> tuple[np.ndarray, np.ndarray]:
        images, targets = _digits_arrays()
        train_idx, test_idx = _stratified_split(targets, self.test_fraction, self.split_seed)
        idx = train_idx if self.train else test_idx
        return images[idx], targets[idx]
