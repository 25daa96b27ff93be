"""The ``domains`` dataset: any set of domains, each an ``.npz``, an image folder or a registered dataset.

A researcher who brings their own domains lists them in the config::

    dataset: domains
    dataset_args:
      image_size: 20          # every domain is resized to 20×20 on load (bilinear)
      channels: 3             # grey is copied to RGB (1: RGB becomes grey)
      domains:
        mnist: digits5:mnist  # one domain of a registered multi-domain dataset
        usps: usps            # a registered dataset
        scans: my/scans       # an image folder: my/scans/<class>/*.png (or my/scans/{train,test}/<class>/*)
        phone: my/phone.npz   # x (uint8 N×H×W[×C]) and y, or x_train/y_train/x_test/y_test;
                              # my/phone_part0.npz, _part1.npz, ... when stored in pieces
    partition: domains

Each domain keeps its own train/test split (folders ``train``/``test``, or an archive's
``x_train``/``x_test``); a domain without one is split stratified 80/20 (``test_fraction``,
seeded by ``split_seed``). Labels are class indices: an image folder's classes are its class
subfolders in natural order (``2`` before ``10``), shared by name across folder domains;
``classes`` fixes names and order. Decoded, resized arrays are cached
(:mod:`fednorm.data.cache`). Pixels are normalised with mean = std = 0.5 per channel, as
FedBN's code does for its domains.

:class:`DomainsDataset` is also the base of the presets (``digits5``): a preset fixes the
domain names and how each is found, and any subset of them runs when only its files are there.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from ..errors import ConfigError, DatasetError
from .cache import cached_arrays, fingerprint
from .base import DATASETS, DatasetInfo, MultiDomainDataset, _Found, _npz_split_files, register_dataset
from .datasets import load_dataset
from .readers import DomainArrays, fit_images, natural_key, npz_part_files, read_image_folder_domain, read_npz_domain

__all__ = ["DomainsDataset", "resolve_domain_spec"]

_HALF = (0.5, 0.5, 0.5)
_FORMATS = (
    "an .npz file (x, y), an image folder (<class>/*.png), or a dataset name (`fednorm list datasets`), "
    "optionally 'name:domain' for one domain of a multi-domain dataset such as digits5:svhn"
)


def _size(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"dataset_args: image_size must be an integer or [height, width], got {value!r}")
    if isinstance(value, int):
        value = (value, value)
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise ConfigError(f"dataset_args: image_size must be an integer or [height, width], got {value!r}")
    if min(value) < 1 or max(value) > 4096:
        raise ConfigError(f"dataset_args: image_size must lie in [1, 4096], got {value!r}")
    return int(value[0]), int(value[1])


def _split_name(name: str) -> str:
    """A domain's default name from its file: ``phone_part0.npz`` → ``phone``."""
    stem = Path(name).name
    for suffix in (".npz",):
        stem = stem[: -len(suffix)] if stem.endswith(suffix) else stem
    for tail in ("_part0", "_train", "_test"):
        stem = stem[: -len(tail)] if stem.endswith(tail) else stem
    return stem.replace(":", "_") or "domain"


def resolve_domain_spec(spec: str, root: Path | None) -> tuple[str, Any]:
    """What a domain entry names: ``("npz", paths)``, ``("npz_splits", (train_paths, test_paths))``,
    ``("folder", path)`` or ``("dataset", (name, domain or None))``.

    A relative path is looked up in ``root`` (the data folder) first, then in the working directory.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"dataset_args: a domain must be a path or a dataset name (a string), got {spec!r}")
    raw = Path(spec).expanduser()
    candidates = [raw] if raw.is_absolute() else [*([root / raw] if root is not None else []), Path.cwd() / raw]
    for cand in candidates:
        if cand.is_dir():
            return "folder", cand
        parts = npz_part_files(cand if cand.suffix == ".npz" else cand.with_name(cand.name + ".npz"))
        if parts:
            return "npz", parts
        prefix = cand.name[:-4] if cand.suffix == ".npz" else cand.name
        if cand.parent.is_dir():
            train, test = _npz_split_files(cand.parent, prefix, True), _npz_split_files(cand.parent, prefix, False)
            if train and test:
                return "npz_splits", (train, test)
            if train or test:
                have, lack = ("train", "test") if train else ("test", "train")
                raise DatasetError(
                    f"Domain '{spec}': found {prefix}_{have}*.npz in {cand.parent} but no {prefix}_{lack}*.npz; "
                    f"add it, or store both splits in one file ({prefix}.npz with x_train, y_train, x_test, y_test)."
                )
    if ":" in spec and spec in DATASETS:  # a prefixed dataset, e.g. hf:<path>
        return "dataset", (spec, None)
    name, _, domain = spec.partition(":")
    if name in DATASETS and name.lower() != "domains":
        return "dataset", (name, domain or None)
    looked = ", ".join(str(c) for c in candidates)
    stem = raw.name[:-4] if raw.name.endswith(".npz") else raw.name
    raise DatasetError(
        f"Domain '{spec}' was not found: no file or folder {looked} (nor {stem}_part0.npz / "
        f"{stem}_train.npz there), and it is not a registered dataset. Fix the path, or give {_FORMATS}."
    )


@register_dataset("domains")
class DomainsDataset(MultiDomainDataset):
    """Any set of domains, one image size and channel count (see the module docstring).

    Args:
        root: the data folder; relative domain paths and registered datasets are looked up there.
        train: the training split if True, else the test split.
        download: passed on to registered datasets.
        domains: ``{name: spec}`` or a list of specs (names taken from the files); a spec is
            a path to an ``.npz`` (or its ``_partN`` pieces, or ``<prefix>`` of
            ``<prefix>_train.npz``/``_test.npz``), an image folder, or a registered dataset
            name (``name:domain`` for one domain of a multi-domain dataset). For a preset: a
            list of its domain names (default: those whose files are present).
        image_size: ``H`` or ``(H, W)`` of every image (default: the domains' common size).
        channels: 1 or 3 (default: 3 if any domain has colour, else 1).
        classes: class names in label order (default: the folders' class names, else ``0..K-1``).
        num_classes: the number of classes when no domain names them (default: largest label + 1).
        test_fraction: test share of a domain stored without a split (default: 0.2).
        split_seed: seed of that stratified split (default: 0).
        cache: keep decoded arrays in the cache folder (default: True).
    """

    info = DatasetInfo(name="domains", num_classes=1, in_channels=3, image_size=(28, 28), mean=_HALF, std=_HALF)
    default_image_size: ClassVar[int | None] = None
    default_channels: ClassVar[int | None] = None
    preset_domains: ClassVar[list[str] | None] = None  # a preset's fixed domain names

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        train: bool = True,
        download: bool = False,
        *,
        domains: Mapping[str, str] | Sequence[str] | None = None,
        image_size: int | Sequence[int] | None = None,
        channels: int | None = None,
        classes: Sequence[str] | None = None,
        num_classes: int | None = None,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        cache: bool = True,
    ) -> None:
        self.image_size = _size(image_size if image_size is not None else self.default_image_size)
        channels = channels if channels is not None else self.default_channels
        if channels is not None and (isinstance(channels, bool) or channels not in (1, 3)):
            raise ConfigError(f"dataset_args: channels must be 1 or 3, got {channels!r}")
        self.channels = channels
        if classes is not None and (isinstance(classes, str) or not all(isinstance(c, (str, int)) for c in classes) or not classes):
            raise ConfigError(f"dataset_args: classes must be a non-empty list of class names, got {classes!r}")
        preset_classes = list(type(self).classes) if self.preset_domains is not None and type(self).classes else None
        self.class_names = [str(c) for c in classes] if classes is not None else preset_classes
        self._classes_why = "dataset_args.classes" if classes is not None else f"{self.info.name}'s classes"
        if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1):
            raise ConfigError(f"dataset_args: num_classes must be a positive integer, got {num_classes!r}")
        self.num_classes_opt = num_classes
        if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) or not 0 < test_fraction < 1:
            raise ConfigError(f"dataset_args: test_fraction must lie in (0, 1), got {test_fraction!r}")
        self.test_fraction = float(test_fraction)
        self.split_seed = int(split_seed)
        self.use_cache = bool(cache)
        self.download_sources = download
        self.requested = domains
        self.missing_domains: dict[str, str] = {}  # preset domains without files: name -> advice
        self.domain_where: dict[str, str] = {}
        super().__init__(root, train, download=False)

    # -- which domains -------------------------------------------------------------------

    def _domain_specs(self) -> dict[str, Any]:
        """``{name: spec}`` of the domains to load, in order (presets override)."""
        req = self.requested
        if req is None:
            raise ConfigError(
                "dataset 'domains' needs dataset_args.domains, e.g. {domains: {a: path/to/a, b: b.npz, c: mnist}}: "
                f"each domain is {_FORMATS}"
            )
        if isinstance(req, Mapping):
            specs = {str(k): v for k, v in req.items()}
        elif isinstance(req, (list, tuple)):
            specs = {}
            for spec in req:
                name = _split_name(str(spec)) if not (isinstance(spec, str) and ":" in spec and spec.split(":")[0] in DATASETS) else spec.split(":", 1)[1]
                if name in specs:
                    raise ConfigError(f"dataset_args.domains: two domains would be called '{name}'; name them: {{{name}_a: ..., {name}_b: ...}}")
                specs[name] = spec
        else:
            raise ConfigError(f"dataset_args.domains must be a mapping {{name: path}} or a list of paths, got {req!r}")
        if not specs:
            raise ConfigError("dataset_args.domains is empty; list at least one domain")
        return specs

    def _read(self, name: str, spec: Any) -> DomainArrays:
        """One domain's arrays at their stored size (cached)."""
        kind, what = resolve_domain_spec(spec, self.root)
        if kind == "dataset":
            ds_name, domain = what
            return self._read_registered(ds_name, domain)
        paths = [what] if kind == "folder" else list(what) if kind == "npz" else [*what[0], *what[1]]
        options = {"kind": kind, "size": self.image_size, "channels": self.channels, "classes": self.class_names,
                   "test_fraction": self.test_fraction, "split_seed": self.split_seed}

        def build() -> dict[str, np.ndarray]:
            if kind == "folder":
                arr = read_image_folder_domain(what, size=self.image_size, channels=self.channels, classes=self.class_names,
                                               test_fraction=self.test_fraction, split_seed=self.split_seed)
            elif kind == "npz":
                arr = read_npz_domain(what, test_fraction=self.test_fraction, split_seed=self.split_seed)
            else:
                tr = read_npz_domain(what[0], test_fraction=self.test_fraction, split_seed=self.split_seed, split=False)
                te = read_npz_domain(what[1], test_fraction=self.test_fraction, split_seed=self.split_seed, split=False)
                merge = lambda a: (np.concatenate([a.x_train, a.x_test]), np.concatenate([a.y_train, a.y_test]))  # noqa: E731
                (xtr, ytr), (xte, yte) = merge(tr), merge(te)
                arr = DomainArrays(xtr, ytr, xte, yte, None, f"{tr.where}, {te.where}")
            out = {"x_train": arr.x_train, "y_train": arr.y_train, "x_test": arr.x_test, "y_test": arr.y_test,
                   "where": np.array(arr.where)}
            if arr.classes is not None:
                out["classes"] = np.array(arr.classes)
            return out

        try:
            key = fingerprint(paths, options)
        except OSError as exc:
            raise DatasetError(f"Could not read domain '{name}' at {spec}: {exc}") from exc
        z = cached_arrays(name, key, build, use_disk=self.use_cache and kind == "folder")
        classes = [str(c) for c in z["classes"]] if "classes" in z else None
        return DomainArrays(z["x_train"], z["y_train"], z["x_test"], z["y_test"], classes, str(z["where"]))

    def _read_registered(self, name: str, domain: str | None) -> DomainArrays:
        root = self.root
        if domain is not None:
            builder = DATASETS.get_builder(name)
            if not issubclass(builder, DomainsDataset):
                raise ConfigError(f"dataset_args.domains: '{name}:{domain}' selects a domain, but '{name}' has no domains")
            parts = [builder(root, train=t, domains=[domain]) for t in (True, False)]
        else:
            try:
                parts = [load_dataset(name, root, train=t, download=self.download_sources) for t in (True, False)]
            except DatasetError as exc:
                raise DatasetError(f"Domain '{name}': {exc}") from exc
        tr, te = parts
        where = ", ".join(str(p) for p in tr.source.paths) or name
        return DomainArrays(tr.data, tr.targets, te.data, te.targets, list(tr.classes) or None, where)

    # -- loading -------------------------------------------------------------------------

    def _locate(self) -> tuple[_Found | None, list[str]]:
        specs = self._domain_specs()
        arrays = {name: self._read(name, spec) for name, spec in specs.items()}
        if not arrays:
            return None, ["no domain has files"]
        self._combine(arrays)
        return _Found("domains", tuple(Path(a.where.split(", ")[0]) for a in arrays.values())), []

    def _combine(self, arrays: dict[str, DomainArrays]) -> None:
        """One size, channel count and class list for all domains; sets ``info`` and the arrays."""
        sizes = {tuple(a.x_train.shape[1:3]) for a in arrays.values()} | {tuple(a.x_test.shape[1:3]) for a in arrays.values() if len(a.x_test)}
        size = self.image_size
        if size is None:
            if len(sizes) > 1:
                listed = ", ".join(f"{n} {a.x_train.shape[1]}×{a.x_train.shape[2]}" for n, a in arrays.items())
                raise ConfigError(f"the domains have different image sizes ({listed}); set dataset_args.image_size, e.g. {{image_size: 28}}")
            size = next(iter(sizes))
        channels = self.channels or (3 if any(a.x_train.shape[-1] == 3 for a in arrays.values()) else 1)
        # classes: the folders' names (shared by name), else the option, else label indices
        named = [a.classes for a in arrays.values() if a.classes is not None]
        folder_names = None
        if self.class_names is not None:
            classes = list(self.class_names)
            why = self._classes_why
        elif any(named) and all(len(c) == len(named[0]) for c in named) and all(c == named[0] for c in named):
            classes = list(named[0])
            why = "the class folders"
        elif named:
            folder_names = sorted({c for cs in named for c in cs}, key=natural_key)
            classes = folder_names
            why = "the class folders"
        else:
            classes = None
            why = ""
        if classes is None:
            top = max(int(max(a.y_train.max(initial=0), a.y_test.max(initial=0))) for a in arrays.values())
            k = self.num_classes_opt or top + 1
            classes = [str(i) for i in range(k)]
            why = "dataset_args.num_classes" if self.num_classes_opt else ""
        elif self.num_classes_opt is not None and self.num_classes_opt != len(classes):
            raise ConfigError(f"dataset_args.num_classes={self.num_classes_opt} but {why} give {len(classes)} classes")
        k = len(classes)
        xs: dict[str, list[np.ndarray]] = {"train": [], "test": []}
        ys: dict[str, list[np.ndarray]] = {"train": [], "test": []}
        for name, a in arrays.items():
            y_tr, y_te = a.y_train, a.y_test
            if folder_names is not None and a.classes is not None:  # folders with different class sets
                remap = np.array([folder_names.index(c) for c in a.classes], dtype=np.int64)
                y_tr, y_te = remap[y_tr], remap[y_te]
            for y in (y_tr, y_te):
                if len(y) and (y.min() < 0 or y.max() >= k):
                    reason = f" ({why})" if why else ""
                    raise DatasetError(
                        f"Labels of domain '{name}' in {a.where} lie in [{int(y.min())}, {int(y.max())}], but the domains "
                        f"have {k} classes{reason}. Fix: relabel them to 0..{k - 1}, or set dataset_args.num_classes "
                        f"(or classes) to cover them."
                    )
            xs["train"].append(fit_images(a.x_train, size, channels))
            xs["test"].append(fit_images(a.x_test, size, channels))
            ys["train"].append(y_tr)
            ys["test"].append(y_te)
            self.domain_where[name] = a.where
        self.domain_names = list(arrays)
        self.classes = classes
        self.info = DatasetInfo(name=type(self).info.name, num_classes=k, in_channels=channels, image_size=size,
                                mean=(0.5,) * channels, std=(0.5,) * channels)
        split = "train" if self.train else "test"
        self._parts = (xs[split], ys[split])

    def _load_domains(self, found: _Found) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        xs, ys = self._parts
        del self._parts
        doms = [np.full(len(y), i, dtype=np.int64) for i, y in enumerate(ys)]
        return np.concatenate(xs), np.concatenate(ys), np.concatenate(doms)


def warn_missing(dataset: Any, sources: Any) -> None:
    """Before partitioning a preset with absent domains: a data error if ``sources`` asks for one,
    else one warning naming what runs without them."""
    missing = getattr(dataset, "missing_domains", None)
    if not missing:
        return
    wanted = [sources] if isinstance(sources, str) else list(sources) if isinstance(sources, (list, tuple)) else []
    asked = [s for s in wanted if isinstance(s, str) and s.lower() in missing]
    if asked:
        d = asked[0].lower()
        raise DatasetError(f"{dataset.info.name}: no files for domain '{d}', which partition_args.sources asks for. {missing[d]}")
    if sources is None:
        warnings.warn(
            f"{dataset.info.name}: no files for domain(s) {', '.join(missing)}; running on {', '.join(dataset.domain_names)}",
            stacklevel=2,
        )
