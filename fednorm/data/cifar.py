"""CIFAR-10 and CIFAR-100 in the official python (pickled batch) layout or as npz.

Split out of :mod:`fednorm.data.datasets` (one module per source family); the old import paths
still work.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fednorm.errors import DatasetError

from .base import DatasetInfo, ImageDataset, _Found, register_dataset
from .download import check_integrity, extract_archive

__all__ = ["CIFAR10", "CIFAR100"]


class _CifarUnpickler(pickle.Unpickler):
    """Unpickler for the CIFAR batches that only builds numpy arrays and builtins.

    The batches are pickled dicts; refusing every other global means a tampered file
    cannot run code even if it somehow passed its checksum.
    """

    _ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),  # how protocol-2 pickles written by Python 3 store bytes
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed in a CIFAR batch")
        if module.startswith("numpy.core."):  # numpy >= 2 moved numpy.core to numpy._core
            try:
                return super().find_class(module.replace("numpy.core.", "numpy._core.", 1), name)
            except (ImportError, AttributeError):
                pass
        return super().find_class(module, name)


def _load_cifar_batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """Images ``N×32×32×3`` and labels from one CIFAR python batch file."""
    try:
        with open(path, "rb") as f:
            entry = _CifarUnpickler(f, encoding="latin1").load()
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError) as exc:
        raise DatasetError(f"Could not read {path}: {exc}. The file is truncated or corrupt.") from exc
    if not isinstance(entry, dict):
        raise DatasetError(f"{path} is not a CIFAR batch: expected a pickled dict, got {type(entry).__name__}")
    entry = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in entry.items()}
    if "data" not in entry or label_key not in entry:
        raise DatasetError(f"{path} is not a CIFAR batch: expected keys 'data' and '{label_key}', got {sorted(entry)}")
    data = np.asarray(entry["data"])
    labels = np.asarray(entry[label_key])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DatasetError(f"{path}: 'data' must be uint8 N×3072, got {data.dtype} {data.shape}")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


@register_dataset("cifar10")
class CIFAR10(ImageDataset):
    """CIFAR-10 (Krizhevsky, 2009): 50000 train / 10000 test colour images, 32×32, 10 classes.

    Reads the official python layout ``root/cifar-10-batches-py/{data_batch_1..5,
    test_batch}`` (each file md5-checked), otherwise the npz layout in ``root``:
    ``cifar10_train.npz`` or the parts ``cifar10_train*.npz`` concatenated in sorted name
    order; ``cifar10_test.npz`` or else the largest ``cifar10_test*.npz``. ``download()``
    fetches and unpacks the official tar.gz.

    ``std`` is the true per-channel standard deviation of the training pixels,
    (0.2470, 0.2435, 0.2616). Much FL code, including HBN's, uses (0.2023, 0.1994,
    0.2010), a widely copied figure that is not the dataset's std; pass it explicitly
    to reproduce such code exactly.
    """

    base_folder: ClassVar[str] = "cifar-10-batches-py"
    resources = [("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a")]
    mirrors = ["https://www.cs.toronto.edu/~kriz/"]
    train_list: ClassVar[list[tuple[str, str | None]]] = [
        ("data_batch_1", "c99cafc152244af753f735de768cd75f"),
        ("data_batch_2", "d4bba439e000b95fd0a9bffe97cbabec"),
        ("data_batch_3", "54ebc095f3ab1f0389bbae665268c751"),
        ("data_batch_4", "634d18415352ddfa80567beed471001a"),
        ("data_batch_5", "482c414d41f54cd18b22e5b47cb7c3cb"),
    ]
    test_list: ClassVar[list[tuple[str, str | None]]] = [("test_batch", "40351d587109b95175f43aff81a1287e")]
    label_key: ClassVar[str] = "labels"
    npz_prefix: ClassVar[str] = "cifar10"
    classes = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    info = DatasetInfo(
        name="cifar10",
        num_classes=10,
        in_channels=3,
        image_size=(32, 32),
        mean=(0.4914, 0.4822, 0.4465),
        std=(0.2470, 0.2435, 0.2616),
        augment=True,
    )

    def _locate(self) -> tuple[_Found | None, list[str]]:
        assert self.root is not None
        folder = self.root / self.base_folder
        entries = self.train_list if self.train else self.test_list
        paths = [folder / name for name, _ in entries]
        problems: list[str] = []
        if all(p.is_file() for p in paths):
            bad = [p for p, (_, md5) in zip(paths, entries) if not check_integrity(p, md5)]
            if not bad:
                return _Found("pickle", tuple(paths)), problems
            problems += [f"{p} failed its md5 check" for p in bad]
        return None, problems

    def _load(self, found: _Found) -> tuple[np.ndarray, np.ndarray]:
        batches = [_load_cifar_batch(p, self.label_key) for p in found.paths]
        return np.concatenate([x for x, _ in batches]), np.concatenate([y for _, y in batches])

    def _after_download(self) -> None:
        extract_archive(self.download_folder / self.resources[0][0], self.download_folder)

    def _advice(self) -> str:
        split = "train" if self.train else "test"
        names = ", ".join(n for n, _ in (self.train_list if self.train else self.test_list))
        return (
            f"You can use download=True to download it, or unpack {self.resources[0][0]} so that "
            f"{self.root / self.base_folder} holds {names}; or put {self.npz_prefix}_{split}*.npz in {self.root}."
        )


@register_dataset("cifar100")
class CIFAR100(CIFAR10):
    """CIFAR-100 (Krizhevsky, 2009) with its 100 fine labels; same layouts as :class:`CIFAR10`."""

    base_folder = "cifar-100-python"
    resources = [("cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85")]
    train_list = [("train", "16019d7e3df5f24257cddd939b257f8d")]
    test_list = [("test", "f0ef6b0ae62326f3e7ffdfab6717acfc")]
    label_key = "fine_labels"
    npz_prefix = "cifar100"
    classes = [
        "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle", "bottle",
        "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle", "caterpillar", "cattle",
        "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch", "crab", "crocodile", "cup", "dinosaur",
        "dolphin", "elephant", "flatfish", "forest", "fox", "girl", "hamster", "house", "kangaroo", "keyboard",
        "lamp", "lawn_mower", "leopard", "lion", "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain",
        "mouse", "mushroom", "oak_tree", "orange", "orchid", "otter", "palm_tree", "pear", "pickup_truck", "pine_tree",
        "plain", "plate", "poppy", "porcupine", "possum", "rabbit", "raccoon", "ray", "road", "rocket",
        "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper", "snail", "snake", "spider",
        "squirrel", "streetcar", "sunflower", "sweet_pepper", "table",
        "tank", "telephone", "television", "tiger", "tractor",
        "train", "trout", "tulip", "turtle", "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm",
    ]  # fmt: skip
    # The usual CIFAR-100 training-set figures (true population std, as for CIFAR10).
    info = DatasetInfo(
        name="cifar100",
        num_classes=100,
        in_channels=3,
        image_size=(32, 32),
        mean=(0.5071, 0.4865, 0.4409),
        std=(0.2673, 0.2564, 0.2762),
        augment=True,
    )
