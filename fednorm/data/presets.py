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

from ..errors import ConfigError, DatasetError
from .cache import cached_arrays, fingerprint
from .datasets import DatasetInfo, register_dataset
from .domains import DIGITS5_ADVICE, DIGITS5_DOMAINS, DIGITS5_FOLDERS, digits5_locate, digits5_read
from .domains_dataset import DomainsDataset
from .readers import DomainArrays

__all__ = ["Digits5"]

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
