"""Morpho-MNIST (Castro et al., 2019) in its release layout: MNIST digits thinned, thickened, swollen, fractured.

FedBN's Appendix G (Table 17) scores its trained digits models on two of these datasets as new,
never-trained clients: *Morpho-global* (thinning and thickening) and *Morpho-local* (swelling and
fractures). The release (https://github.com/dccastro/Morpho-MNIST, Google Drive links in its
README) unpacks to one folder per dataset, each in MNIST's gzipped IDX format::

    <variant>/                          # plain, thin, thic, swel, frac, global, local
      train-images-idx3-ubyte.gz        # 60,000 28×28 uint8 images
      train-labels-idx1-ubyte.gz        # the digit labels, copied from MNIST
      t10k-images-idx3-ubyte.gz         # 10,000 test images
      t10k-labels-idx1-ubyte.gz
      train-pert-idx1-ubyte.gz          # global/local only: the perturbation of each image
      t10k-pert-idx1-ubyte.gz           #   (0 plain, 1 thinned, 2 thickened, 3 swollen, 4 fractured)
      train-morpho.csv, t10k-morpho.csv # morphometrics (not read)

``global`` interleaves plain, thinned and thickened digits at random, ``local`` plain, swollen
and fractured ones (the release's README). The files are read with MNIST's IDX reader
(:func:`fednorm.data.mnist.read_idx`); the perturbation labels, where present, are
``perturbations`` (int64, one per image), else ``None``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

import numpy as np

from ..errors import ConfigError, DatasetError
from .base import DatasetInfo, ImageDataset, _Found, register_dataset
from .mnist import MNIST, read_idx, read_idx_images

__all__ = ["MorphoMNIST", "MORPHO_VARIANTS", "PERTURBATIONS"]

MORPHO_VARIANTS = ("plain", "thin", "thic", "swel", "frac", "global", "local")
"""The release's datasets (folder names)."""
PERTURBATIONS = ("plain", "thinned", "thickened", "swollen", "fractured")
"""Names of the perturbation labels of ``*-pert-idx1-ubyte.gz``, by value."""


@register_dataset("morpho_mnist")
class MorphoMNIST(ImageDataset):
    """One Morpho-MNIST dataset (``variant``): 60,000 train / 10,000 test 28×28 grey digits, 10 classes.

    Searched: ``root/<variant>``, ``root/morpho_mnist/<variant>``, ``root/Morpho-MNIST/<variant>``,
    each holding ``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`` (module docstring). The
    release has no checksums and sits behind Google Drive links, so there is no ``download()``.

    Args:
        variant: which dataset: ``plain``, ``thin``, ``thic``, ``swel``, ``frac``, ``global`` (default) or
            ``local``.

    Attributes:
        perturbations: the perturbation label of each image (0 plain, 1 thinned, 2 thickened, 3 swollen,
            4 fractured)
            from ``<split>-pert-idx1-ubyte[.gz]`` when the folder has it (``global``, ``local``),
            else ``None``.

    ``mean``/``std`` are MNIST's figures (not recomputed: the release's digits are binarised
    and resampled); FedBN's runs normalise with 0.5/0.5 instead.
    """

    classes = list(MNIST.classes)
    info = DatasetInfo(name="morpho_mnist", num_classes=10, in_channels=1, image_size=(28, 28), mean=(0.1307,), std=(0.3081,))
    alt_folders: ClassVar[tuple[str, ...]] = ("", "morpho_mnist", "Morpho-MNIST")

    def __init__(self, root: str | os.PathLike | None = None, train: bool = True, download: bool = False, *,
                 variant: str = "global") -> None:
        if variant not in MORPHO_VARIANTS:
            raise ConfigError(f"Unknown value '{variant}' for argument variant. Valid values are {{{', '.join(MORPHO_VARIANTS)}}}")
        self.variant = variant
        self.perturbations: np.ndarray | None = None
        super().__init__(root, train=train, download=download)

    def _split(self) -> str:
        return "train" if self.train else "t10k"

    def _folders(self) -> list[Path]:
        assert self.root is not None
        return [self.root / sub / self.variant for sub in self.alt_folders]

    def _locate(self) -> tuple[_Found | None, list[str]]:
        stems = [f"{self._split()}-{kind}-ubyte" for kind in ("images-idx3", "labels-idx1", "pert-idx1")]
        problems: list[str] = []
        for folder in self._folders():
            files = [MNIST._find_file(folder, stem, lenient=False) for stem in stems]
            if files[0] is not None and files[1] is not None:
                return _Found("idx", tuple(f for f in files if f is not None)), problems
            if any(files):
                problems.append(f"{folder} has {', '.join(f.name for f in files if f)} but not "
                                f"{' and '.join(s + '[.gz]' for s, f in zip(stems[:2], files) if f is None)}")
        return None, problems

    def _load(self, found: _Found) -> tuple[np.ndarray, np.ndarray]:
        images_path = found.paths[0]
        images, labels = read_idx_images(*found.paths[:2])
        if len(found.paths) > 2:
            pert = read_idx(found.paths[2], ndim=1).astype(np.int64)
            if len(pert) != len(images) or (len(pert) and not 0 <= pert.min() <= pert.max() < len(PERTURBATIONS)):
                raise DatasetError(f"{found.paths[2]} must hold one perturbation label in [0, {len(PERTURBATIONS)}) per image "
                                   f"of {images_path} ({len(images)}), got {len(pert)}")
            self.perturbations = pert
        return images, labels

    def _advice(self) -> str:
        split = self._split()
        folders = ", ".join(str(f) for f in self._folders())
        return (f"Morpho-MNIST has no automatic download: get the '{self.variant}' dataset from the links in "
                f"https://github.com/dccastro/Morpho-MNIST and unzip it so that {split}-images-idx3-ubyte.gz and "
                f"{split}-labels-idx1-ubyte.gz lie in one of: {folders}.")
