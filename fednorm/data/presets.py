"""Presets of the ``domains`` dataset: benchmarks whose domain names and file layouts are fixed.

A preset is a :class:`~fednorm.data.domains_dataset.DomainsDataset` that knows where each of its
domains lives. Any subset of its domains runs: with ``dataset_args: {domains: [mnist, usps]}``
only those are read, and without it every domain whose files are present is used (a warning
names the absent ones; a ``sources`` entry that names one is a data error saying which files
to add). ``image_size`` and ``channels`` default to the benchmark's and may be changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError, DatasetError
from .cache import cached_arrays, fingerprint
from .base import DatasetInfo, register_dataset
from .digits5 import DIGITS5_ADVICE, DIGITS5_DOMAINS, DIGITS5_FOLDERS, digits5_locate, digits5_read
from .domains_dataset import DomainsDataset
from .readers import IMAGE_SUFFIXES, DomainArrays, decode_images, natural_key, stratified_split

__all__ = ["Digits5", "ImageFolderDomains", "ImageFolder", "OfficeCaltech10", "DomainNet", "PACS"]

_HALF = (0.5, 0.5, 0.5)


def _subset(name: str, requested: Any, valid: list[str]) -> list[str] | None:
    """The preset domains asked for in ``dataset_args.domains`` (names), or None for all."""
    if requested is None:
        return None
    if isinstance(requested, str):
        requested = [requested]
    if not isinstance(requested, (list, tuple)) or not all(isinstance(d, str) for d in requested) or not requested:
        raise ConfigError(f"dataset_args.domains for '{name}' is a list of its domain names ({', '.join(valid)}), got {requested!r}")
    out = []
    for d in requested:
        if d.lower() not in valid:
            raise ConfigError(f"Unknown value {d!r} in dataset_args.domains. Valid values are {{{', '.join(valid)}}}")
        if d.lower() in out:
            raise ConfigError(f"dataset_args.domains lists {d!r} twice")
        out.append(d.lower())
    return out


@register_dataset("digits5")
class Digits5(DomainsDataset):
    """The real Digits-5 domains (FedBN's benchmark): MNIST, SVHN, USPS, SynthDigits, MNIST-M.

    Each domain is searched in ``root`` (and ``root/digits5``, ``root/Digits``), first in
    FedBN's released layout — ``<Domain>/partitions/train_part{0..9}.pkl`` and
    ``<Domain>/test.pkl``, each a pickled ``(images, labels)`` pair, with ``<Domain>`` one of
    ``MNIST``, ``SVHN``, ``USPS``, ``SynthDigits``, ``MNIST_M`` (only numpy arrays are
    unpickled) — then in the upstream formats:

    * any domain: ``<domain>_{train,test}.npz`` (``x``, ``y``), or its pieces ``<domain>_train*.npz``;
    * SVHN: ``train_32x32.mat`` / ``test_32x32.mat`` (label 10 is digit 0);
    * SynthDigits: ``synth_train_32x32.mat`` / ``synth_test_32x32.mat`` (SVHN's format);
    * MNIST-M: ``mnist_m/mnist_m_{train,test}/*.png`` + ``mnist_m_{train,test}_labels.txt``;
    * MNIST and USPS: whatever :class:`MNIST` / :class:`USPS` read (IDX, libsvm, npz).

    Images become 28×28×3 by default (bilinear resize, grey replicated; ``image_size`` and
    ``channels`` change that), normalised with 0.5/0.5 as FedBN. Any subset of the domains
    runs (module docstring). [code≠here] With upstream files, the sources' own train/test
    splits are used; FedBN's preprocessing pools them and re-splits 80/20, so test-set sizes
    differ from the paper's. Equal training sizes per client come from the ``domains``
    partition (``per_client``).
    """

    info = DatasetInfo(name="digits5", num_classes=10, in_channels=3, image_size=(28, 28), mean=_HALF, std=_HALF)
    classes = [str(i) for i in range(10)]
    preset_domains: ClassVar[list[str] | None] = list(DIGITS5_DOMAINS)
    domain_names = list(DIGITS5_DOMAINS)
    fedbn_folders: ClassVar[dict[str, str]] = dict(DIGITS5_FOLDERS)
    default_image_size = 28
    default_channels = 3

    def _domain_specs(self) -> dict[str, Any]:
        assert self.root is not None
        wanted = _subset(self.info.name, self.requested, list(DIGITS5_DOMAINS))
        specs: dict[str, Any] = {}
        for d in wanted or DIGITS5_DOMAINS:
            where = (digits5_locate(self.root, d, True), digits5_locate(self.root, d, False))
            if where[0] is None or where[1] is None:
                split = "train" if where[0] is None else "test"
                advice = f"no {split} files for domain '{d}' under {self.root}. {DIGITS5_ADVICE}"
                if wanted is not None:
                    raise DatasetError(f"digits5: {advice}")
                self.missing_domains[d] = advice
                continue
            specs[d] = where
        if not specs:
            raise DatasetError(f"Dataset not found or corrupted at {self.root}: no files for any Digits-5 domain. {DIGITS5_ADVICE}")
        return specs

    def _read(self, name: str, spec: Any) -> DomainArrays:
        assert self.root is not None
        root: Path = self.root
        (layout_tr, paths_tr), (layout_te, paths_te) = spec

        def build() -> dict:
            x_tr, y_tr = digits5_read(root, name, True, layout_tr, paths_tr)
            x_te, y_te = digits5_read(root, name, False, layout_te, paths_te)
            return {"x_train": x_tr, "y_train": y_tr, "x_test": x_te, "y_test": y_te}

        key = fingerprint([*paths_tr, *paths_te], {"preset": "digits5", "domain": name, "layouts": [layout_tr, layout_te]})
        z = cached_arrays(f"digits5_{name}", key, build, use_disk=self.use_cache and layout_tr == "mnistm_png")
        return DomainArrays(z["x_train"], z["y_train"], z["x_test"], z["y_test"], None, f"{paths_tr[0]}, {paths_te[0]}")


# -- image folders: Office-Caltech10, DomainNet, any <domain>/<class>/ tree -------------------


def _ci_child(folder: Path, name: str) -> Path | None:
    """The child of ``folder`` called ``name``, ignoring case."""
    exact = folder / name
    if exact.is_dir():
        return exact
    for p in folder.iterdir() if folder.is_dir() else ():
        if p.is_dir() and p.name.lower() == name.lower():
            return p
    return None


def _folder_split_files(base: Path, folder: Path, domain: str, classes: list[str], train: bool,
                        test_fraction: float, split_seed: int) -> list[tuple[Path, int]]:
    """``(image, label)`` of one split of ``folder`` (class folders not in ``classes`` are skipped):
    ``folder/{train,test}/<class>/*`` if present, else DomainNet's ``base/<domain>_{train,test}.txt``
    lists, else a stratified split of ``folder/<class>/*``."""
    split = "train" if train else "test"
    cls_index = {c.lower(): i for i, c in enumerate(classes)}

    def scan(root: Path) -> list[tuple[Path, int]]:
        out = []
        for cdir in sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: natural_key(p.name)):
            c = cls_index.get(cdir.name.lower())
            if c is not None:
                out += [(f, c) for f in sorted(cdir.iterdir()) if f.suffix.lower() in IMAGE_SUFFIXES]
        return out

    if (folder / split).is_dir():
        return scan(folder / split)
    listing = base / f"{domain}_{split}.txt"
    if listing.is_file():
        out = []
        for line in listing.read_text().splitlines():
            if line.strip():
                rel = line.split()[0]
                c = cls_index.get(Path(rel).parent.name.lower())
                if c is not None:
                    out.append((base / rel, c))
        return out
    files = scan(folder)
    labels = np.array([c for _, c in files], dtype=np.int64)
    if len(labels) == 0:
        return []
    tr, te = stratified_split(labels, test_fraction, split_seed)
    return [files[i] for i in (tr if train else te)]


class ImageFolderDomains(DomainsDataset):
    """Images in ``root[/base_folder]/<domain>/<class>/*`` (Office-Caltech10 and DomainNet layout).

    Every image is decoded to ``channels`` (default RGB) and resized to ``image_size`` (bilinear)
    once, at load, and cached. Splits: ``<domain>/{train,test}/<class>/*`` when those folders
    exist; else DomainNet's ``<domain>_{train,test}.txt`` lists (``domain/class/file label`` per
    line) when present; else a deterministic stratified 80/20 split of each domain (seed 0, like
    ``digits``). ``domain_names``/``classes`` are fixed by subclasses (class folders outside
    them are skipped); the generic ``image_folder`` takes every domain folder and the union of
    class folders. Any subset of a preset's domains runs (module docstring).
    """

    base_folders: ClassVar[tuple[str, ...]] = ()
    default_image_size = 64
    default_channels = 3
    fixed_domains: ClassVar[list[str] | None] = None
    fixed_classes: ClassVar[list[str] | None] = None
    info = DatasetInfo(name="image_folder", num_classes=1, in_channels=3, image_size=(64, 64), mean=_HALF, std=_HALF)

    def _base(self) -> Path | None:
        assert self.root is not None
        for b in (*(self.root / f for f in self.base_folders), self.root):
            if b.is_dir() and (self.fixed_domains is None or any(_ci_child(b, d) for d in self.fixed_domains)):
                return b
        return None

    def _advice(self) -> str:
        folders = " or ".join(str(self.root / f) for f in (*self.base_folders, "")) if self.root else "--data-dir"
        return f"Put the images as <domain>/<class>/*.jpg under {folders}."

    def _domain_specs(self) -> dict[str, Any]:
        base = self._base()
        if base is None:
            want = ", ".join(self.fixed_domains or ["<domain>"])
            raise DatasetError(f"Dataset not found or corrupted at {self.root}: no folder with domain subfolders {want}. {self._advice()}")
        valid = self.fixed_domains or sorted((p.name for p in base.iterdir() if p.is_dir()), key=natural_key)
        wanted = _subset(self.info.name, self.requested, [d.lower() for d in valid])
        specs: dict[str, Any] = {}
        for d in valid:
            if wanted is not None and d.lower() not in wanted:
                continue
            folder = _ci_child(base, d)
            if folder is None:
                if wanted is not None:
                    raise DatasetError(f"{self.info.name}: no folder for domain '{d}' in {base}. {self._advice()}")
                self.missing_domains[d.lower()] = f"no folder {base / d}. {self._advice()}"
                continue
            specs[d] = (base, folder)
        if self.fixed_classes is None and self.class_names is None:
            names: set[str] = set()
            for _, folder in specs.values():
                root = folder / "train" if (folder / "train").is_dir() else folder
                names |= {p.name for p in root.iterdir() if p.is_dir()}
            self.class_names = sorted(names, key=natural_key)
            self._classes_why = "the class folders"
        if not specs or not self.class_names:
            raise DatasetError(f"{base} holds no <domain>/<class>/ image folders. {self._advice()}")
        return specs

    def _read(self, name: str, spec: Any) -> DomainArrays:
        base, folder = spec
        classes = list(self.class_names or [])
        opts = dict(test_fraction=self.test_fraction, split_seed=self.split_seed)
        files = {t: _folder_split_files(base, folder, name, classes, t, **opts) for t in (True, False)}
        mode = {1: "L", 3: "RGB"}.get(self.channels or 3)

        def build() -> dict:
            out = {}
            for t, split in ((True, "train"), (False, "test")):
                out[f"x_{split}"] = decode_images([f for f, _ in files[t]], folder, mode=mode, size=self.image_size)
                out[f"y_{split}"] = np.array([c for _, c in files[t]], dtype=np.int64)
            return out

        if not files[True]:
            raise DatasetError(f"{folder} holds no training images of the classes {', '.join(classes)}. {self._advice()}")
        key = fingerprint([folder], {"preset": self.info.name, "size": self.image_size, "mode": mode, "classes": classes, **opts})
        z = cached_arrays(f"{self.info.name}_{name}", key, build, use_disk=self.use_cache)
        return DomainArrays(z["x_train"], z["y_train"], z["x_test"], z["y_test"], classes, str(folder))


@register_dataset("image_folder")
class ImageFolder(ImageFolderDomains):
    """Any ``root/<domain>/<class>/*`` tree, 64×64 by default (see :class:`ImageFolderDomains`)."""

    info = DatasetInfo(name="image_folder", num_classes=1, in_channels=3, image_size=(64, 64), mean=_HALF, std=_HALF)


@register_dataset("office_caltech10")
class OfficeCaltech10(ImageFolderDomains):
    """Office-Caltech10 (Li et al., 2021, Sec. 5.2): amazon, caltech, dslr, webcam; the 10 shared
    classes; 256×256 by default as FedBN's AlexNet input; no mean/std normalisation in FedBN's code
    (here 0.5/0.5)."""

    base_folders = ("office_caltech_10", "office_caltech10", "OfficeCaltech10")
    default_image_size = 256
    fixed_domains = ["amazon", "caltech", "dslr", "webcam"]
    fixed_classes = ["back_pack", "bike", "calculator", "headphones", "keyboard",
                     "laptop_computer", "monitor", "mouse", "mug", "projector"]  # fmt: skip
    classes = fixed_classes
    preset_domains = fixed_domains
    info = DatasetInfo(name="office_caltech10", num_classes=10, in_channels=3, image_size=(256, 256), mean=_HALF, std=_HALF)


@register_dataset("domainnet")
class DomainNet(ImageFolderDomains):
    """DomainNet with FedBN's top-10 classes (Li et al., 2021, Sec. 5.2); 256×256 by default. Uses
    DomainNet's ``<domain>_{train,test}.txt`` lists when they are in the folder."""

    base_folders = ("domainnet", "DomainNet")
    default_image_size = 256
    fixed_domains = ["clipart", "infograph", "painting", "quickdraw", "real", "sketch"]
    fixed_classes = ["bird", "feather", "headphones", "ice_cream", "teapot", "tiger", "whale", "windmill", "wine_glass", "zebra"]
    classes = fixed_classes
    preset_domains = fixed_domains
    info = DatasetInfo(name="domainnet", num_classes=10, in_channels=3, image_size=(256, 256), mean=_HALF, std=_HALF)


@register_dataset("pacs")
class PACS(ImageFolderDomains):
    """PACS (Li et al., 2017): photo, art_painting, cartoon, sketch; 7 classes; the LN/FN paper's
    label-and-domain-shift benchmark (Zhang et al., 2024, Table 5). The release's 227×227 images
    (``kfold/<domain>/<class>/*``) are resized to 224×224 by default, the size the LN code trains
    at (``RandomResizedCrop(224)``)."""

    base_folders = ("PACS/kfold", "pacs/kfold", "kfold", "PACS", "pacs", "pacs_data")
    default_image_size = 224
    fixed_domains = ["photo", "art_painting", "cartoon", "sketch"]
    fixed_classes = ["dog", "elephant", "giraffe", "guitar", "horse", "house", "person"]
    classes = fixed_classes
    preset_domains = fixed_domains
    info = DatasetInfo(name="pacs", num_classes=7, in_channels=3, image_size=(224, 224), mean=_HALF, std=_HALF)
