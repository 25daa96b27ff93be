"""Hugging Face datasets on disk: ``--dataset hf:<path>``.

``<path>`` is a dataset saved with ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, or a
folder of parquet files (``train-*.parquet`` / ``test-*.parquet``, or ``train/`` and ``test/``
subfolders, as on the Hub; other files are one split). Nothing is downloaded. The image and
label columns are found by their features (an ``Image`` column, a ``ClassLabel`` column, else
``image``/``img`` and ``label``/``labels``) or named in ``dataset_args``
(``{image_column: pixels, label_column: digit}``). Without a test split, the train split is
split stratified 80/20 (``test_fraction``, ``split_seed``). Images are decoded to ``channels``
and resized to ``image_size`` (defaults: as stored) and cached like image folders
(:mod:`fednorm.data.cache`). Needs the ``hf`` extra (``pip install fednorm[hf]``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np

from ..errors import ConfigError, DatasetError
from .cache import cached_arrays, fingerprint
from .base import DATASETS, DatasetInfo, ImageDataset, _Found
from .readers import fit_images, stratified_split

__all__ = ["HFImageDataset", "hf_dataset", "HF_EXTRA"]

HF_EXTRA = "hf: datasets need the Hugging Face datasets package: pip install 'fednorm[hf]' (or pip install datasets)"
_HALF = (0.5, 0.5, 0.5)


def _load_splits(path: Path) -> dict[str, Any]:
    """``{split: datasets.Dataset}`` from a ``save_to_disk`` folder or a folder of parquet files."""
    try:
        import datasets
    except ImportError:
        raise ConfigError(HF_EXTRA) from None
    datasets.disable_progress_bars()  # a run prints its own progress
    try:
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            loaded = datasets.load_from_disk(str(path))
            return dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
        files = sorted(path.rglob("*.parquet"))
        if not files:
            raise DatasetError(
                f"{path} is neither a dataset saved with save_to_disk (no dataset_dict.json or state.json) nor a "
                f"folder of .parquet files; save it with dataset.save_to_disk('{path}')."
            )
        groups: dict[str, list[str]] = {}
        for f in files:
            rel = f.relative_to(path).parts
            head = rel[0] if len(rel) > 1 else f.name
            split = next((s for s in ("train", "test", "validation") if head.startswith(s)), "train")
            groups.setdefault(split, []).append(str(f))
        return {s: datasets.Dataset.from_parquet(fs, keep_in_memory=True) for s, fs in groups.items()}
    except DatasetError:
        raise
    except Exception as exc:  # datasets/pyarrow raise many unrelated types for a damaged folder
        raise DatasetError(f"Could not read the Hugging Face dataset at {path}: {' '.join(str(exc).split())}") from exc


def _column(ds: Any, given: str | None, kind: str, where: Path) -> str:
    import datasets

    names = list(ds.column_names)
    if given is not None:
        if given not in names:
            raise ConfigError(f"dataset_args.{kind}_column: {where} has no column {given!r} (its columns: {', '.join(names)})")
        return given
    feature = datasets.Image if kind == "image" else datasets.ClassLabel
    typed = [n for n in names if isinstance(ds.features[n], feature)]
    if typed:
        return typed[0]
    for n in ("image", "img", "pixels") if kind == "image" else ("label", "labels", "fine_label", "target"):
        if n in names:
            return n
    raise ConfigError(f"{where}: no {kind} column found among {', '.join(names)}; name it: dataset_args {{{kind}_column: ...}}")


def _images(ds: Any, column: str, mode: str | None, size: tuple[int, int] | None, where: Path) -> np.ndarray:
    from PIL import Image

    out = []
    for i, item in enumerate(ds[column]):
        if isinstance(item, Image.Image):
            img = item.convert(mode or ("L" if item.mode in ("1", "L", "I", "F") else "RGB"))
            if size is not None and (img.height, img.width) != tuple(size):
                img = img.resize((size[1], size[0]), Image.BILINEAR)
            arr = np.asarray(img, dtype=np.uint8)
        else:
            arr = np.asarray(item)
            if arr.dtype != np.uint8:
                raise DatasetError(f"{where}: column {column!r} holds {arr.dtype} values; expected images or uint8 arrays")
        out.append(arr[..., None] if arr.ndim == 2 else arr)
    shapes = {a.shape for a in out}
    if len(shapes) > 1:
        raise DatasetError(f"The images in {where} have different sizes {sorted(shapes)[:3]}; set dataset_args.image_size to resize them.")
    return np.stack(out) if out else np.empty((0, 1, 1, 1), np.uint8)


class HFImageDataset(ImageDataset):
    """One split of a Hugging Face image-classification dataset on disk (module docstring).

    Args (``dataset_args``): ``image_column``, ``label_column``, ``train_split`` (default
    ``train``), ``test_split`` (default ``test``, else a stratified split), ``image_size``,
    ``channels``, ``test_fraction``, ``split_seed``, ``cache``.
    """

    hf_path: ClassVar[str] = ""
    info = DatasetInfo(name="hf", num_classes=1, in_channels=3, image_size=(32, 32), mean=_HALF, std=_HALF)

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        train: bool = True,
        download: bool = False,
        *,
        image_column: str | None = None,
        label_column: str | None = None,
        train_split: str = "train",
        test_split: str = "test",
        image_size: int | Sequence[int] | None = None,
        channels: int | None = None,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        cache: bool = True,
    ) -> None:
        from .domains_dataset import _size

        self.options = {"image_column": image_column, "label_column": label_column, "train_split": train_split,
                        "test_split": test_split, "test_fraction": float(test_fraction), "split_seed": int(split_seed)}
        self.image_size = _size(image_size)
        if channels is not None and channels not in (1, 3):
            raise ConfigError(f"dataset_args: channels must be 1 or 3, got {channels!r}")
        self.channels = channels
        self.use_cache = bool(cache)
        super().__init__(root, train, download=False)

    def _path(self) -> Path:
        raw = Path(self.hf_path).expanduser()
        for cand in ([raw] if raw.is_absolute() else [*([self.root / raw] if self.root else []), Path.cwd() / raw]):
            if cand.exists():
                return cand
        return raw

    def _locate(self) -> tuple[_Found | None, list[str]]:
        path = self._path()
        if not path.is_dir():
            return None, [f"no folder {path} (hf:<path> is a dataset saved with save_to_disk, or a folder of parquet files)"]
        return _Found("hf", (path,)), []

    def _advice(self) -> str:
        return "Save the dataset with dataset.save_to_disk(path) (or put its parquet files in a folder) and pass --dataset hf:<path>."

    def _load(self, found: _Found) -> tuple[np.ndarray, np.ndarray]:
        path = found.paths[0]
        o = self.options
        mode = {1: "L", 3: "RGB"}.get(self.channels or 0)

        def build() -> dict[str, np.ndarray]:
            splits = _load_splits(path)
            if o["train_split"] not in splits:
                raise ConfigError(f"dataset_args.train_split: {path} has no split {o['train_split']!r} (its splits: {', '.join(splits)})")
            tr = splits[o["train_split"]]
            image = _column(tr, o["image_column"], "image", path)
            label = _column(tr, o["label_column"], "label", path)
            x = _images(tr, image, mode, self.image_size, path)
            y = np.asarray(tr[label])
            if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
                raise DatasetError(f"{path}: the label column {label!r} holds {y.dtype} values of shape {y.shape}; expected integer class indices")
            out = {}
            if o["test_split"] in splits:
                te = splits[o["test_split"]]
                out["x_test"], out["y_test"] = _images(te, image, mode, self.image_size, path), np.asarray(te[label], np.int64)
                out["x_train"], out["y_train"] = x, y.astype(np.int64)
            else:
                itr, ite = stratified_split(y, o["test_fraction"], o["split_seed"])
                out.update(x_train=x[itr], y_train=y[itr].astype(np.int64), x_test=x[ite], y_test=y[ite].astype(np.int64))
            import datasets

            feat = tr.features[label]
            names = feat.names if isinstance(feat, datasets.ClassLabel) else []
            out["classes"] = np.array(names if names else [""])
            return out

        key = fingerprint([path], {"hf": 1, **o, "size": self.image_size, "mode": mode})
        z = cached_arrays(f"hf_{path.name}", key, build, use_disk=self.use_cache)
        split = "train" if self.train else "test"
        x, y = z[f"x_{split}"], z[f"y_{split}"]
        h, w, c = z["x_train"].shape[1:]
        channels = self.channels or c
        x = fit_images(x, (h, w), channels)
        names = [str(n) for n in z["classes"] if str(n)]
        k = len(names) or int(max(z["y_train"].max(initial=0), z["y_test"].max(initial=0))) + 1
        self.classes = names or [str(i) for i in range(k)]
        self.info = DatasetInfo(name=f"hf:{self.hf_path}", num_classes=k, in_channels=channels, image_size=(h, w),
                                mean=(0.5,) * channels, std=(0.5,) * channels)
        return x, y


def hf_dataset(path: str) -> type[HFImageDataset]:
    """The dataset class for ``hf:<path>`` (the registry's ``hf`` prefix)."""
    if not path.strip():
        raise ValueError("hf: needs a path, e.g. --dataset hf:data/my_dataset")
    return type("HuggingFaceDataset", (HFImageDataset,), {"hf_path": path.strip(), "__module__": __name__})


DATASETS.add_prefix("hf", hf_dataset)
