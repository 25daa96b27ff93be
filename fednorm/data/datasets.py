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
"""

from __future__ import annotations

import bz2
import functools
import gzip
import math
import os
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterable, Sequence

import numpy as np
import torch

from fednorm.errors import DatasetError
from fednorm.registry import Registry

from .download import check_integrity, download_url, extract_archive
from .transforms import normalize

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

DATASETS: Registry[type["ImageDataset"]] = Registry("dataset")
register_dataset = DATASETS.register

ENV_DATA_ROOT = "FEDNORM_DATA"


def list_datasets(
    include: str | Iterable[str] | None = None, exclude: str | Iterable[str] | None = None
) -> list[str]:
    """Sorted names of the registered datasets, optionally filtered by fnmatch patterns."""
    return DATASETS.list(include, exclude)


def default_root() -> Path:
    """Where datasets live when no ``root`` is given: ``$FEDNORM_DATA``, else ``~/.cache/fednorm``."""
    env = os.environ.get(ENV_DATA_ROOT)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fednorm"


@dataclass(frozen=True)
class DatasetInfo:
    """Static facts about a dataset that models and training code need before loading it.

    Attributes:
        name: registry key.
        num_classes: labels lie in ``[0, num_classes)``.
        in_channels: ``C`` of the ``N×H×W×C`` images.
        image_size: ``(H, W)``.
        mean: per-channel mean of the training split, in [0, 1] units.
        std: per-channel (population) standard deviation of the training split.
        augment: whether training uses random crop + flip by default (CIFAR only: flips
            change the meaning of digits).
        crop_padding: zero padding of that random crop.
    """

    name: str
    num_classes: int
    in_channels: int
    image_size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augment: bool = False  # default train-time random crop+flip (CIFAR only)
    crop_padding: int = 4


@dataclass(frozen=True)
class _Found:
    """The files of one split in one layout, as located on disk."""

    layout: str  # "idx", "npz", "pickle", "libsvm", "builtin"
    paths: tuple[Path, ...]


class ImageDataset:
    """One split of an image-classification dataset, held in memory.

    Subclasses declare ``info``, ``classes``, ``resources`` and ``mirrors`` and implement
    ``_locate`` (find this split's files, verifying checksums) and ``_load`` (parse them);
    the base class handles the root folder, downloading, the not-found error and the
    validation of the loaded arrays.

    Args:
        root: folder searched for the files (default: :func:`default_root`).
        train: the training split if True, else the test split.
        download: fetch the upstream files into ``root`` when they are not found.

    Attributes:
        data: uint8 images, ``N×H×W×C`` (always 4-D).
        targets: int64 labels in ``[0, info.num_classes)``, shape ``N``.
        classes: class names, indexed by label.

    Raises:
        DatasetError: when the files are missing, fail their checksum or do not parse.
    """

    info: ClassVar[DatasetInfo]
    classes: list[str] = []
    resources: ClassVar[list[tuple[str, str | None]]] = []
    mirrors: ClassVar[list[str]] = []

    def __init__(self, root: str | os.PathLike | None = None, train: bool = True, download: bool = False) -> None:
        self.root: Path | None = self._resolve_root(root)
        self.train = train
        self.classes = list(type(self).classes)
        if download:
            self.download()
        found, problems = self._locate()
        if found is None:
            details = "".join(f" {p}." for p in problems)
            raise DatasetError(f"Dataset not found or corrupted at {self.root}.{details} {self._advice()}")
        self.source = found
        data, targets = self._load(found)
        self.data, self.targets = self._validate(data, targets, found)

    # -- hooks for subclasses ------------------------------------------------------------

    def _resolve_root(self, root: str | os.PathLike | None) -> Path | None:
        return Path(root).expanduser() if root is not None else default_root()

    def _locate(self) -> tuple[_Found | None, list[str]]:
        """This split's files, or ``None`` plus the reasons (e.g. failed checksums)."""
        raise NotImplementedError

    def _load(self, found: _Found) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _advice(self) -> str:
        """How to obtain the files; appended to the not-found error."""
        return "You can use download=True to download it."

    @property
    def download_folder(self) -> Path:
        """Folder that ``download()`` writes to."""
        assert self.root is not None  # only datasets with a root download
        return self.root

    def _after_download(self) -> None:
        """Post-processing of downloaded files (e.g. unpacking an archive)."""

    # -- shared behaviour ----------------------------------------------------------------

    def _check_integrity(self) -> bool:
        return self._locate()[0] is not None

    def download(self) -> None:
        """Fetch every file in ``resources`` unless this split is already present.

        Idempotent: files that already verify are not fetched again. The caller checks the
        files again afterwards, so a download that went wrong still fails loudly.
        """
        if self._check_integrity() or not self.resources:
            return
        if not self.mirrors:
            raise DatasetError(f"{type(self).__name__} has no download location; {self._advice()}")
        first = self.mirrors[0].rstrip("/") + "/"
        for filename, md5 in self.resources:
            download_url(first + filename, self.download_folder, filename, md5, mirrors=self.mirrors[1:])
        self._after_download()

    def _validate(self, data: Any, targets: Any, found: _Found) -> tuple[np.ndarray, np.ndarray]:
        """Check dtype, shape and label range, so a bad file fails here and not mid-training."""
        where = ", ".join(str(p) for p in found.paths) or self.info.name
        info = self.info
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8:
            dtype = getattr(data, "dtype", type(data).__name__)
            raise DatasetError(f"Images in {where} must be uint8, got {dtype}")
        expected = (*info.image_size, info.in_channels)
        if data.ndim != 4 or tuple(data.shape[1:]) != expected:
            raise DatasetError(
                f"Images in {where} must have shape N×{'×'.join(map(str, expected))} "
                f"for {info.name}, got {tuple(data.shape)}"
            )
        targets = np.asarray(targets)
        if targets.ndim != 1 or not np.issubdtype(targets.dtype, np.integer):
            raise DatasetError(
                f"Labels in {where} must be a 1-D integer array, got shape {targets.shape} "
                f"and dtype {targets.dtype}"
            )
        if len(data) != len(targets):
            raise DatasetError(f"{where} holds {len(data)} images but {len(targets)} labels")
        if len(data) == 0:
            raise DatasetError(f"{where} holds no samples")
        lo, hi = int(targets.min()), int(targets.max())
        if lo < 0 or hi >= info.num_classes:
            raise DatasetError(
                f"Labels in {where} must lie in [0, {info.num_classes}) for {info.name}, "
                f"got values in [{lo}, {hi}]"
            )
        return np.ascontiguousarray(data), targets.astype(np.int64, copy=False)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        """``(image H×W×C uint8, label)``; for bulk access use ``data``/``targets`` directly."""
        return self.data[index], int(self.targets[index])

    def __repr__(self) -> str:
        lines = [
            f"Dataset {type(self).__name__} ({self.info.name})",
            f"    Number of datapoints: {len(self)}",
            f"    Split: {'train' if self.train else 'test'}",
            " ".join(["    Source:", self.source.layout, *(str(p) for p in self.source.paths)]),
        ]
        return "\n".join(lines)


# -- file helpers ------------------------------------------------------------------------


def _read_maybe_compressed(path: Path) -> bytes:
    """File contents, transparently gunzipped or bunzipped (sniffed from the magic bytes)."""
    try:
        with open(path, "rb") as f:
            head = f.read(3)
        if head[:2] == b"\x1f\x8b":
            with gzip.open(path, "rb") as f:
                return f.read()
        if head == b"BZh":
            with bz2.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError) as exc:  # truncated streams raise EOFError, bad ones OSError
        raise DatasetError(f"Could not read {path}: {exc}. The file is truncated or corrupt.") from exc


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


def _load_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` from an ``.npz`` file, adding a channel axis to ``N×H×W`` images."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = {"x", "y"} - set(archive.files)
            if missing:
                raise DatasetError(
                    f"{path} lacks the array(s) {sorted(missing)}; the npz layout needs "
                    f"'x' (uint8 N×H×W×C) and 'y' (int64 labels), found {sorted(archive.files)}"
                )
            x, y = archive["x"], archive["y"]
    except DatasetError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise DatasetError(f"Could not read {path}: {exc}. The file is truncated or corrupt.") from exc
    if x.ndim == 3:
        x = x[..., None]
    return x, y


def _npz_num_samples(path: Path) -> int:
    """Number of samples in an npz file, read from the ``y`` header without loading arrays."""
    try:
        with zipfile.ZipFile(path) as zf, zf.open("y.npy") as f:
            version = np.lib.format.read_magic(f)
            fmt = np.lib.format
            read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _, _ = read_header(f)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"Could not read the header of {path}: {exc}") from exc
    return int(shape[0]) if shape else 0


def _natural(path: Path) -> list[object]:
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def _npz_split_files(folder: Path, prefix: str, train: bool) -> tuple[Path, ...]:
    """Files of the npz layout for one split.

    ``{prefix}_train.npz`` if present, else every ``{prefix}_train*.npz`` concatenated in
    natural name order (``part2`` before ``part10``; a split stored in parts). For the test split, ``{prefix}_test.npz``
    if present, else the largest ``{prefix}_test*.npz``: several test files are alternative
    versions (e.g. a complete lossy copy and a lossless subset), not parts.
    """
    split = "train" if train else "test"
    exact = folder / f"{prefix}_{split}.npz"
    if exact.is_file():
        return (exact,)
    matches = sorted((p for p in folder.glob(f"{prefix}_{split}*.npz") if p.is_file()), key=_natural)  # part2 before part10
    if train or len(matches) <= 1:
        return tuple(matches)
    return (max(matches, key=lambda p: (_npz_num_samples(p), p.name)),)


def _load_npz_split(paths: Sequence[Path]) -> tuple[np.ndarray, np.ndarray]:
    parts = [_load_npz(p) for p in paths]
    for p, (x, y) in zip(paths, parts):
        if x.ndim != 4 or y.ndim != 1 or len(x) != len(y):
            raise DatasetError(f"{p} holds x of shape {x.shape} and y of shape {y.shape}; expected N×H×W×C and N")
    if len(parts) == 1:
        return parts[0]
    shapes = {x.shape[1:] for x, _ in parts}
    if len(shapes) != 1:
        raise DatasetError(f"The parts {', '.join(map(str, paths))} have different image shapes {sorted(shapes)}")
    return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])


# -- registry entry points ---------------------------------------------------------------


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
    ``info.mean/std``), and int64 labels.

    One vectorized conversion, so clients can index tensors instead of decoding samples.
    """
    mean = ds.info.mean if mean is None else tuple(mean)
    std = ds.info.std if std is None else tuple(std)
    if len(mean) != ds.info.in_channels or len(std) != ds.info.in_channels:
        raise DatasetError(
            f"input normalisation has {len(mean)} mean and {len(std)} std values, '{ds.info.name}' has "
            f"{ds.info.in_channels} channel(s)"
        )
    x = normalize(ds.data, mean, std)
    y = torch.from_numpy(np.array(ds.targets, dtype=np.int64))  # a copy: independent of ds
    return x, y


# -- datasets ------------------------------------------------------------------------------

_DIGIT_NAMES = [str(i) for i in range(10)]


def _stratified_split(targets: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic stratified split: per class, a seeded permutation; the first
    ``floor(n_c * test_fraction + 0.5)`` indices go to the test split. Both index arrays
    are sorted, so the original sample order is kept within each split."""
    rng = np.random.default_rng(seed)
    test_parts = []
    for c in np.unique(targets):
        members = rng.permutation(np.flatnonzero(targets == c))
        test_parts.append(members[: int(math.floor(len(members) * test_fraction + 0.5))])
    test_mask = np.zeros(len(targets), dtype=bool)
    test_mask[np.concatenate(test_parts)] = True
    return np.flatnonzero(~test_mask), np.flatnonzero(test_mask)


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
        npz = _npz_split_files(self.root, self.npz_prefix, self.train)
        if npz:
            return _Found("npz", npz), problems
        return None, problems

    def _load(self, found: _Found) -> tuple[np.ndarray, np.ndarray]:
        if found.layout == "npz":
            return _load_npz_split(found.paths)
        images_path, labels_path = found.paths
        images = read_idx(images_path, ndim=3)
        labels = read_idx(labels_path, ndim=1)
        if images.dtype != np.uint8 or labels.dtype != np.uint8:
            raise DatasetError(f"{images_path} and {labels_path} must hold uint8 IDX data (type code 0x08)")
        if len(images) != len(labels):
            raise DatasetError(f"{images_path} holds {len(images)} images but {labels_path} {len(labels)} labels")
        return images[..., None], labels.astype(np.int64)

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
        npz = _npz_split_files(self.root, self.npz_prefix, self.train)
        if npz:
            return _Found("npz", npz), problems
        return None, problems

    def _load(self, found: _Found) -> tuple[np.ndarray, np.ndarray]:
        if found.layout == "npz":
            return _load_npz_split(found.paths)
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
        npz = _npz_split_files(self.root, self.npz_prefix, self.train)
        if npz:
            return _Found("npz", npz), problems
        return None, problems

    def _load(self, found: _Found) -> tuple[np.ndarray, np.ndarray]:
        if found.layout == "npz":
            return _load_npz_split(found.paths)
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
