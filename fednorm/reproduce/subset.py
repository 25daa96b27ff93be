"""Class-balanced subsets of a dataset, written in the npz layout fednorm's loaders read.

A reduced-scale table (``reduced: {data_subset: {...}}`` in a table config) trains on a seeded,
class-balanced subset of the training set and evaluates on one of the test set (for a multi-source
dataset such as ``digits_domains``: per class *and* source, so every source keeps its share). The subset is a
pure function of (dataset files, per-class counts, seed); it is written once into a folder under
the suite's output directory and that folder becomes the runs' ``data_dir``, so the run
directories record exactly which data they used and a resumed run reads the same files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import ConfigError

__all__ = ["SUBSET_KEYS", "check_subset_spec", "subset_folder_name", "make_subset"]

SUBSET_KEYS = ("train_per_class", "test_per_class", "seed")


def check_subset_spec(spec: Any, where: str) -> dict[str, int]:
    """``{train_per_class, test_per_class, seed}`` as ints, or a :class:`ConfigError` naming ``where``."""
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: data_subset must be a mapping with {', '.join(SUBSET_KEYS)}, got {spec!r}")
    unknown = sorted(set(spec) - set(SUBSET_KEYS))
    if unknown:
        raise ConfigError(f"{where}: data_subset has unknown keys {unknown}; valid: {', '.join(SUBSET_KEYS)}")
    out: dict[str, int] = {}
    for key in SUBSET_KEYS:
        value = spec.get(key, 0 if key == "seed" else None)
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "seed" else 1):
            raise ConfigError(f"{where}: data_subset.{key} must be a {'non-negative' if key == 'seed' else 'positive'} integer, got {value!r}")
        out[key] = value
    return out


def subset_folder_name(dataset: str, spec: Mapping[str, int]) -> str:
    return f"{dataset}-train{spec['train_per_class']}-test{spec['test_per_class']}-seed{spec['seed']}"


def _balanced(targets: np.ndarray, per_class: int, num_classes: int, rng: np.random.Generator, what: str) -> np.ndarray:
    picks = []
    for c in range(num_classes):
        idx = np.flatnonzero(targets == c)
        if len(idx) < per_class:
            raise ConfigError(f"data_subset: {what} has only {len(idx)} samples of class {c}, fewer than the {per_class} requested")
        picks.append(rng.choice(idx, per_class, replace=False))
    return np.sort(np.concatenate(picks))


def make_subset(dataset: str, source_dir: str | None, dest_root: Path, spec: Mapping[str, int]) -> Path:
    """Write (once) the class-balanced subset of ``dataset`` and return its folder.

    Loads both splits from ``source_dir`` with fednorm's own loaders (any layout they accept;
    a missing file raises :class:`~fednorm.errors.DatasetError` naming it), takes
    ``train_per_class``/``test_per_class`` images of every class (of every class in every
    source, for a multi-source dataset) with a generator seeded by ``seed``, and writes them
    atomically in the layout the loader reads first: ``<prefix>_{train,test}.npz``, or for
    ``digits_domains`` a copy of its generated file under the same name.
    """
    from ..data.datasets import DATASETS, load_dataset

    cls = DATASETS.get_builder(dataset)
    prefix = getattr(cls, "npz_prefix", None)
    generated = callable(getattr(cls, "_cache_name", None))  # digits_domains: one generated npz
    if prefix is None and not generated:
        raise ConfigError(f"data_subset is not supported for dataset '{dataset}' (it has no npz layout)")
    folder = Path(dest_root) / subset_folder_name(dataset, spec)
    marker = folder / "subset.json"
    if marker.is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(spec["seed"])
    record: dict[str, Any] = {"dataset": dataset, "source": str(source_dir), **spec}
    arrays: dict[str, np.ndarray] = {}
    name = None
    for split, per in (("train", spec["train_per_class"]), ("test", spec["test_per_class"])):
        ds = load_dataset(dataset, source_dir, train=split == "train")
        targets = np.asarray(ds.targets)
        domains = getattr(ds, "domains", None)
        if domains is None:
            idx = _balanced(targets, per, cls.info.num_classes, rng, f"the {split} split of {dataset}")
        else:
            idx = np.sort(np.concatenate([
                np.flatnonzero(domains == d)[_balanced(targets[domains == d], per, cls.info.num_classes, rng,
                                                       f"source '{n}' of the {split} split of {dataset}")]
                for d, n in enumerate(ds.domain_names)
            ]))
        record[f"{split}_size"] = int(len(idx))
        if generated:
            name = ds._cache_name()
            arrays.update({f"x_{split}": ds.data[idx], f"y_{split}": targets[idx].astype(np.int64),
                           f"d_{split}": np.asarray(domains)[idx].astype(np.int64),
                           "domain_names": np.array(ds.domain_names)})
        else:
            _save(folder, f"{prefix}_{split}.npz", x=ds.data[idx], y=targets[idx].astype(np.int64))
    if generated:
        _save(folder, str(name), **arrays)
    tmp = folder / f".subset.{os.getpid()}.json"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, marker)
    return folder


def _save(folder: Path, name: str, **arrays: np.ndarray) -> None:
    tmp = folder / f".{os.getpid()}.{name}"
    if not tmp.name.endswith(".npz"):
        tmp = tmp.with_name(tmp.name + ".npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, folder / name)
