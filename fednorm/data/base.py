"""What every dataset family builds on: the registry, :class:`ImageDataset` and its file helpers.

:class:`ImageDataset` holds one split in memory and owns everything the families share: the root
folder, downloading, the npz fallback (``root/<npz_prefix>_train*.npz``, tried when a family's own
layout is absent, so no family repeats it), the not-found error and the validation of the loaded
arrays. A family (:mod:`~fednorm.data.mnist`, :mod:`~fednorm.data.usps`, :mod:`~fednorm.data.cifar`,
:mod:`~fednorm.data.sklearn_digits`, the multi-domain ones) imports this module and registers
itself with :func:`register_dataset`; nothing here imports a family, so the import graph stays
acyclic. The entry points (:func:`~fednorm.data.datasets.load_dataset`, ...) live in
:mod:`fednorm.data.datasets`.
"""

from __future__ import annotations

import bz2
import gzip
import math
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np

from fednorm.errors import DatasetError
from fednorm.registry import Registry

from .download import download_url

__all__ = ["DATASETS", "register_dataset", "default_root", "DatasetInfo", "ImageDataset", "MultiDomainDataset"]

DATASETS: Registry[type["ImageDataset"]] = Registry("dataset")
register_dataset = DATASETS.register

ENV_DATA_ROOT = "FEDNORM_DATA"


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

    layout: str  # "idx", "npz", "npz_split" (the base class's fallback), "pickle", "libsvm", "builtin"
    paths: tuple[Path, ...]


class ImageDataset:
    """One split of an image-classification dataset, held in memory.

    Subclasses declare ``info``, ``classes``, ``resources`` and ``mirrors`` and implement
    ``_locate`` (find this split's files in the upstream layout, verifying checksums) and
    ``_load`` (parse them); the base class handles the root folder, downloading, the npz
    layout (``root/<npz_prefix>_train*.npz`` / ``_test*.npz``, tried when the upstream files are
    absent; set ``npz_prefix``), the not-found error and the validation of the loaded arrays.

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
    #: dtype of ``data``: uint8 pixels, or float32 for feature vectors in their own units (a
    #: generated task such as ``fednorm.data.gaussians``; ``N×1×1×F``, one feature a channel)
    sample_dtype: ClassVar[type] = np.uint8
    resources: ClassVar[list[tuple[str, str | None]]] = []
    mirrors: ClassVar[list[str]] = []
    npz_prefix: ClassVar[str | None] = None

    def __init__(self, root: str | os.PathLike | None = None, train: bool = True, download: bool = False) -> None:
        self.root: Path | None = self._resolve_root(root)
        self.train = train
        self.classes = list(type(self).classes)
        if download:
            self.download()
        found, problems = self._locate_split()
        if found is None:
            details = "".join(f" {p}." for p in problems)
            raise DatasetError(f"Dataset not found or corrupted at {self.root}.{details} {self._advice()}")
        self.source = found
        data, targets = _load_npz_split(found.paths) if found.layout == "npz_split" else self._load(found)
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

    def _locate_split(self) -> tuple[_Found | None, list[str]]:
        """The upstream files (:meth:`_locate`), else this split's npz files."""
        found, problems = self._locate()
        if found is None and self.npz_prefix and self.root is not None:
            npz = _npz_split_files(self.root, self.npz_prefix, self.train)
            if npz:
                return _Found("npz_split", npz), problems
        return found, problems

    def _check_integrity(self) -> bool:
        return self._locate_split()[0] is not None

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
        if not isinstance(data, np.ndarray) or data.dtype != self.sample_dtype:
            dtype = getattr(data, "dtype", type(data).__name__)
            raise DatasetError(f"Images in {where} must be {np.dtype(self.sample_dtype).name}, got {dtype}")
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


# -- shared by several families -----------------------------------------------------------

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


# -- datasets whose samples come from several sources ---------------------------------------


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
