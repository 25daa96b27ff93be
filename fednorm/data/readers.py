"""Readers for one domain of the user's own data: an ``.npz`` file (or its ``_partN`` pieces),
an image folder in torchvision's ``ImageFolder`` layout, or a registered dataset.

Each reader returns a :class:`DomainArrays`: uint8 ``N×H×W×C`` train and test images at their
stored size, int64 labels, and the class names where the source has them (folders). Fitting
all domains to one size and channel count is :func:`fit_images`; the ``domains`` dataset
(:mod:`fednorm.data.domains_dataset`) combines both. Every problem with a file is a
:class:`~fednorm.errors.DatasetError` that names the file and says how to fix it.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import DatasetError
from .base import _stratified_split

__all__ = [
    "DomainArrays",
    "IMAGE_SUFFIXES",
    "natural_key",
    "fit_images",
    "to_channels",
    "resize_images",
    "npz_part_files",
    "read_npz_domain",
    "read_image_folder_domain",
    "decode_images",
    "stratified_split",
]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
NPZ_FORMAT = "'x' (uint8 N×H×W×C images) and 'y' (integer labels), or x_train/y_train/x_test/y_test"


@dataclass
class DomainArrays:
    """One domain's two splits as stored, before resizing.

    Attributes:
        x_train, x_test: uint8 ``N×H×W×C`` (C is 1 or 3).
        y_train, y_test: int64 labels.
        classes: class names indexed by label (image folders), else ``None``.
        where: the files, for messages.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: list[str] | None
    where: str


def natural_key(name: str) -> list[object]:
    """Sort key that orders ``"2"`` before ``"10"`` (class folders named by numbers)."""
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", name)]


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The library's deterministic stratified split (as ``digits``); sorted train and test indices."""
    return _stratified_split(labels, test_fraction, seed)


# -- fitting images to one shape -------------------------------------------------------------


def to_channels(x: np.ndarray, channels: int) -> np.ndarray:
    """uint8 ``N×H×W×C`` with ``C`` changed to ``channels``: grey is copied to RGB; RGB becomes
    grey with ITU-R 601 luma weights (PIL's ``convert("L")``: ``(299 R + 587 G + 114 B) / 1000``)."""
    c = x.shape[-1]
    if c == channels:
        return x
    if c == 1 and channels == 3:
        return np.repeat(x, 3, axis=-1)
    if c == 3 and channels == 1:
        luma = x.astype(np.uint32) @ np.array([299, 587, 114], dtype=np.uint32)
        return ((luma + 500) // 1000).astype(np.uint8)[..., None]
    raise DatasetError(f"cannot convert {c}-channel images to {channels} channels (only 1 and 3 are supported)")


def resize_images(x: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """uint8 ``N×H×W×C`` resized to ``size`` (bilinear, antialiased when shrinking), rounded."""
    if tuple(x.shape[1:3]) == tuple(size) or len(x) == 0:
        return x if len(x) else np.empty((0, *size, x.shape[-1]), np.uint8)
    out = []
    for start in range(0, len(x), 4096):  # bounded memory for large domains
        t = torch.from_numpy(np.ascontiguousarray(x[start : start + 4096])).permute(0, 3, 1, 2).to(torch.float32)
        shrink = size[0] < t.shape[-2] or size[1] < t.shape[-1]
        t = F.interpolate(t, size=size, mode="bilinear", align_corners=False, antialias=shrink)
        out.append(t.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy())
    return np.concatenate(out)


def fit_images(x: np.ndarray, size: tuple[int, int], channels: int) -> np.ndarray:
    """``x`` as uint8 ``N×size×channels`` (see :func:`resize_images`, :func:`to_channels`)."""
    return np.ascontiguousarray(to_channels(resize_images(x, size), channels))


# -- .npz --------------------------------------------------------------------------------------


def npz_part_files(path: Path) -> tuple[Path, ...]:
    """``path`` itself, else its pieces ``<stem>_part0.npz, _part1.npz, ...`` in numeric order
    (large arrays kept in several files under a size limit); empty when neither exists."""
    if path.is_file():
        return (path,)
    stem = path.name[: -len(".npz")] if path.name.endswith(".npz") else path.name
    parts = [p for p in path.parent.glob(f"{stem}_part*.npz") if re.fullmatch(rf"{re.escape(stem)}_part\d+\.npz", p.name)]
    return tuple(sorted(parts, key=lambda p: int(p.stem.rsplit("_part", 1)[1])))


def _read_npz_arrays(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {k: archive[k] for k in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise DatasetError(
            f"Could not read {path}: {' '.join(str(exc).split())}. The archive is truncated or corrupt: write it again "
            f"with np.savez({path.name!r}, x=images, y=labels)."
        ) from exc


def _as_nhwc(x: np.ndarray, where: str) -> np.ndarray:
    """``N×H×W`` → ``N×H×W×1``; channels-first ``N×C×H×W`` (C in 1, 3) → channels-last; uint8 only."""
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim == 4 and x.shape[-1] not in (1, 3) and x.shape[1] in (1, 3):
        x = np.moveaxis(x, 1, -1)
    if x.ndim != 4 or x.shape[-1] not in (1, 3):
        raise DatasetError(
            f"Images in {where} have shape {x.shape}; expected N×H×W (grey) or N×H×W×C with C = 1 or 3. "
            f"Fix: save the images as one uint8 array of that shape under the key 'x'."
        )
    if x.dtype != np.uint8:
        raise DatasetError(
            f"Images in {where} are {x.dtype}; expected uint8 pixels in [0, 255]. Fix: save "
            f"(x * 255).round().astype(np.uint8) for images in [0, 1], or x.astype(np.uint8)."
        )
    return x


def _as_labels(y: np.ndarray, n: int, where: str) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1 or not (np.issubdtype(y.dtype, np.integer) or (y.dtype.kind == "f" and np.all(y == np.round(y)))):
        raise DatasetError(
            f"Labels in {where} have shape {y.shape} and dtype {y.dtype}; expected one integer label per image. "
            f"Fix: save y as an int64 array of length N."
        )
    if len(y) != n:
        raise DatasetError(f"{where} holds {n} images but {len(y)} labels; save one label per image.")
    y = y.astype(np.int64)
    if len(y) and y.min() < 0:
        raise DatasetError(f"Labels in {where} include {int(y.min())}; labels must be 0, 1, ..., num_classes - 1.")
    return y


def read_npz_domain(paths: Sequence[Path], *, test_fraction: float, split_seed: int, split: bool = True) -> DomainArrays:
    """One domain from an ``.npz`` file or its ``_partN`` pieces (arrays concatenated key by key).

    Keys ``x_train``, ``y_train``, ``x_test``, ``y_test`` give the splits; keys ``x``, ``y`` are
    split stratified (``test_fraction`` of each class to the test split, seeded by ``split_seed``).
    """
    where = ", ".join(str(p) for p in paths)
    pieces = [_read_npz_arrays(p) for p in paths]
    keys = set(pieces[0])
    for p, piece in zip(paths, pieces):
        if set(piece) != keys:
            raise DatasetError(f"The pieces of one domain hold different arrays: {paths[0]} has {sorted(keys)}, {p} has {sorted(piece)}")
    if {"x_train", "y_train", "x_test", "y_test"} <= keys:
        stored = True
    elif {"x", "y"} <= keys:
        stored = False
    else:
        raise DatasetError(f"{where} holds the arrays {sorted(keys)}; a domain archive needs {NPZ_FORMAT}.")

    def joined(key: str) -> np.ndarray:
        arrays = [_as_nhwc(piece[key], f"{p} ['{key}']") if key.startswith("x") else piece[key] for p, piece in zip(paths, pieces)]
        if key.startswith("x") and len({a.shape[1:] for a in arrays}) > 1:
            raise DatasetError(f"The pieces {where} hold images of different shapes {sorted({a.shape[1:] for a in arrays})} under '{key}'")
        return np.concatenate(arrays) if len(arrays) > 1 else arrays[0]

    if stored:
        xs = {s: joined(f"x_{s}") for s in ("train", "test")}
        ys = {s: _as_labels(joined(f"y_{s}"), len(xs[s]), f"{where} ['y_{s}']") for s in ("train", "test")}
    else:
        x = joined("x")
        y = _as_labels(joined("y"), len(x), f"{where} ['y']")
        tr, te = stratified_split(y, test_fraction, split_seed) if split else (np.arange(len(y)), np.arange(0))
        xs, ys = {"train": x[tr], "test": x[te]}, {"train": y[tr], "test": y[te]}
    if len(ys["train"]) == 0:
        raise DatasetError(f"{where} holds no training images; a domain needs at least one per client.")
    return DomainArrays(xs["train"], ys["train"], xs["test"], ys["test"], None, where)


# -- image folders ---------------------------------------------------------------------------


def _class_folders(root: Path) -> list[Path]:
    return sorted((p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")), key=lambda p: natural_key(p.name))


def _images_in(folder: Path) -> list[Path]:
    return sorted((f for f in folder.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES), key=lambda p: natural_key(str(p)))


def folder_files(root: Path) -> dict[str, list[tuple[Path, str]]]:
    """``{"train": [(file, class name), ...], "test": [...]}`` of an image folder, or
    ``{"all": [...]}`` when it has no ``train``/``test`` subfolders. Raises on an empty class folder."""
    splits = {s: root / s for s in ("train", "test") if (root / s).is_dir()}
    if set(splits) != {"train", "test"}:
        splits = {"all": root}
    out: dict[str, list[tuple[Path, str]]] = {}
    for split, base in splits.items():
        classes = _class_folders(base)
        if not classes:
            raise DatasetError(
                f"{base} has no class folders; an image-folder domain needs one subfolder per class, "
                f"e.g. {base}/cat/001.png and {base}/dog/001.png (torchvision's ImageFolder layout)."
            )
        files = []
        for cdir in classes:
            images = _images_in(cdir)
            if not images:
                raise DatasetError(
                    f"The class folder {cdir} holds no images ({', '.join(IMAGE_SUFFIXES[:4])}, ...); put its images "
                    f"there or remove the folder."
                )
            files += [(f, cdir.name) for f in images]
        out[split] = files
    return out


def _decode(path: Path, mode: str, size: tuple[int, int] | None) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im = im.convert(mode)
            if size is not None and (im.height, im.width) != tuple(size):
                im = im.resize((size[1], size[0]), Image.BILINEAR)
            arr = np.asarray(im, dtype=np.uint8)
    except (OSError, ValueError, UnidentifiedImageError) as exc:
        raise DatasetError(f"Could not read the image {path}: {' '.join(str(exc).split())}. Replace or delete the file.") from exc
    return arr[..., None] if arr.ndim == 2 else arr


def decode_images(files: Sequence[Path], where: Path | str, *, mode: str | None, size: tuple[int, int] | None) -> np.ndarray:
    """``files`` decoded to one uint8 ``N×H×W×C`` array: ``mode`` "L" or "RGB" (default: RGB if
    the images have colour), resized to ``size`` (default: their own, which must then agree)."""
    mode = mode or _image_mode(files)
    images = [_decode(f, mode, size) for f in files]
    shapes = {im.shape for im in images}
    if len(shapes) > 1:
        first = {im.shape: f for im, f in zip(images, files)}
        listed = "; ".join(f"{f.name}: {s[0]}×{s[1]}" for s, f in list(first.items())[:3])
        raise DatasetError(
            f"The images in {where} have different sizes ({listed}); set dataset_args.image_size "
            f"(e.g. {{image_size: 32}}) to resize them on load."
        )
    if not images:
        return np.empty((0, *(size or (1, 1)), 1 if mode == "L" else 3), np.uint8)
    return np.stack(images)


def _image_mode(files: Sequence[Path]) -> str:
    """"RGB" if any of the first images has colour, else "L" (grey)."""
    from PIL import Image

    for f in files[:16]:
        try:
            with Image.open(f) as im:
                if im.mode not in ("1", "L", "LA", "I", "I;16", "F"):
                    return "RGB"
        except OSError:
            continue  # reported when decoded
    return "L"


def read_image_folder_domain(
    root: Path, *, size: tuple[int, int] | None, channels: int | None, classes: Sequence[str] | None,
    test_fraction: float, split_seed: int,
) -> DomainArrays:
    """One domain from ``root/<class>/*`` (or ``root/{train,test}/<class>/*``).

    Images are decoded with PIL to ``channels`` (default: RGB if the images have colour) and
    resized to ``size`` (bilinear; default: the images' own size, which must then be the same
    for all). Labels index ``classes`` (default: the class folders in natural order).
    """
    splits = folder_files(root)
    names = sorted({c for files in splits.values() for _, c in files}, key=natural_key) if classes is None else list(classes)
    index = {c: i for i, c in enumerate(names)}
    unknown = sorted({c for files in splits.values() for _, c in files if c not in index})
    if unknown:
        raise DatasetError(f"{root} has class folders {unknown} that are not among the classes {names}; rename or remove them.")
    all_files = [f for files in splits.values() for f, _ in files]
    mode = {1: "L", 3: "RGB"}.get(channels or 0) or _image_mode(all_files)
    decoded: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for split, files in splits.items():
        images = decode_images([f for f, _ in files], root, mode=mode, size=size)
        decoded[split] = (images, np.array([index[c] for _, c in files], dtype=np.int64))
    if "all" in decoded:
        x, y = decoded["all"]
        tr, te = stratified_split(y, test_fraction, split_seed)
        decoded = {"train": (x[tr], y[tr]), "test": (x[te], y[te])}
    (xtr, ytr), (xte, yte) = decoded["train"], decoded["test"]
    return DomainArrays(xtr, ytr, xte, yte, names, str(root))
