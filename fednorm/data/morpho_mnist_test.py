"""Morpho-MNIST's release layout on a small generated tree: gzipped IDX files written byte by byte here
(not with fednorm's reader), read back exactly; the perturbation labels; the folder search; the errors."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from fednorm.data.datasets import list_datasets, load_dataset
from fednorm.data.morpho_mnist import MorphoMNIST
from fednorm.errors import ConfigError, DatasetError


def write_idx_gz(path: Path, array: np.ndarray) -> None:
    """LeCun's IDX format, gzipped: 0, 0, type 0x08 (uint8), rank, big-endian uint32 dims, then the bytes."""
    assert array.dtype == np.uint8
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") as f:
        f.write(header + array.tobytes())


def write_fake_morpho_mnist(root: Path, variants: tuple[str, ...] = ("global", "local"), n_train: int = 30, n_test: int = 20,
                            *, seed: int = 0) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The release layout ``root/<variant>/{train,t10k}-{images-idx3,labels-idx1,pert-idx1}-ubyte.gz`` with random
    28×28 digits, every class present; returns ``{(variant, split): (images, labels, perturbations)}`` as written."""
    rng = np.random.default_rng(seed)
    written = {}
    for variant in variants:
        for split, n in (("train", n_train), ("t10k", n_test)):
            x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
            y = rng.permutation(np.arange(n) % 10).astype(np.uint8)
            pert = rng.integers(0, 5, n, dtype=np.uint8)
            write_idx_gz(root / variant / f"{split}-images-idx3-ubyte.gz", x)
            write_idx_gz(root / variant / f"{split}-labels-idx1-ubyte.gz", y)
            write_idx_gz(root / variant / f"{split}-pert-idx1-ubyte.gz", pert)
            written[(variant, split)] = (x, y, pert)
    return written


def test_reads_exactly_the_images_labels_and_perturbations_written(tmp_path: Path) -> None:
    written = write_fake_morpho_mnist(tmp_path, n_train=13, n_test=7)
    for variant in ("global", "local"):
        for train, split in ((True, "train"), (False, "t10k")):
            ds = load_dataset("morpho_mnist", tmp_path, train=train, variant=variant)
            x, y, pert = written[(variant, split)]
            assert ds.data.dtype == np.uint8 and ds.data.shape == (len(x), 28, 28, 1)
            np.testing.assert_array_equal(ds.data[..., 0], x)
            np.testing.assert_array_equal(ds.targets, y.astype(np.int64))
            assert ds.targets.dtype == np.int64
            np.testing.assert_array_equal(ds.perturbations, pert.astype(np.int64))
    assert "morpho_mnist" in list_datasets()


def test_a_variant_without_perturbation_labels_and_the_folders_searched(tmp_path: Path) -> None:
    written = write_fake_morpho_mnist(tmp_path / "morpho_mnist", variants=("thin",), n_train=4, n_test=3)
    for f in (tmp_path / "morpho_mnist" / "thin").glob("*-pert-*"):
        f.unlink()
    ds = MorphoMNIST(tmp_path, train=False, variant="thin")
    assert ds.perturbations is None
    np.testing.assert_array_equal(ds.data[..., 0], written[("thin", "t10k")][0])
    # unzipped files are read too (the reader takes gzipped or plain IDX)
    folder = tmp_path / "morpho_mnist" / "thin"
    for f in folder.glob("t10k-*.gz"):
        (folder / f.stem).write_bytes(gzip.decompress(f.read_bytes()))
        f.unlink()
    np.testing.assert_array_equal(MorphoMNIST(tmp_path, train=False, variant="thin").targets, written[("thin", "t10k")][1])


def test_errors_name_the_files_and_the_valid_variants(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"Unknown value 'thick' for argument variant.*global.*local"):
        MorphoMNIST(tmp_path, variant="thick")
    with pytest.raises(DatasetError, match=r"(?s)dccastro/Morpho-MNIST.*t10k-images-idx3-ubyte.gz.*/local"):
        load_dataset("morpho_mnist", tmp_path, train=False, variant="local")
    write_fake_morpho_mnist(tmp_path, variants=("local",), n_train=4, n_test=3)
    (tmp_path / "local" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DatasetError, match="but not t10k-labels-idx1-ubyte"):
        MorphoMNIST(tmp_path, train=False, variant="local")
    write_idx_gz(tmp_path / "local" / "t10k-labels-idx1-ubyte.gz", np.zeros(2, np.uint8))  # 3 images, 2 labels
    with pytest.raises(DatasetError, match="3 images but .* 2 labels"):
        MorphoMNIST(tmp_path, train=False, variant="local")
    write_idx_gz(tmp_path / "local" / "t10k-labels-idx1-ubyte.gz", np.zeros(3, np.uint8))
    write_idx_gz(tmp_path / "local" / "t10k-pert-idx1-ubyte.gz", np.full(3, 7, np.uint8))
    with pytest.raises(DatasetError, match="perturbation label in"):
        MorphoMNIST(tmp_path, train=False, variant="local")
