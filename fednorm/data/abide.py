"""ABIDE I connectomes of four sites, one file per site: FedBN's medical feature-shift benchmark.

FedBN (Li et al., 2021, Table 1 and App. D.4) trains a 3-layer MLP on 5,995-dimensional brain
connectomes of four ABIDE I sites (NYU, USM, UM, UCLA; autism spectrum disorder against typical
controls), one client per site. The connectomes are computed from the preprocessed ROI time
series (CPAC pipeline, Harvard-Oxford atlas) over sliding windows of 32 frames with stride 1, so a
subject of T frames gives T − 31 samples (App. D.4, Table 10: 176 → 145, 296 → 265, 236 → 205,
116 → 85). The authors' ABIDE code is not released, so fednorm reads a simple layout a user
produces (docs/data.md, "ABIDE I")::

    <data-dir>/abide/nyu.npz  usm.npz  um.npz  ucla.npz      (or <data-dir>/ABIDE/, or <data-dir>/)

each holding ``x`` (float, ``N×F``: one connectome a row, F = 5,995 in the paper) and ``y``
(1 = autism, 0 = control), optionally ``subject`` (``N`` ids: the rows of one subject's windows
share one), or the split itself as ``x_train``/``y_train``/``x_test``/``y_test``.
:func:`sliding_connectomes` turns one subject's ROI series into such rows.

Samples are ``float32`` arrays ``N×1×1×F`` (one feature a channel), so a model sees ``F`` inputs;
no input standardisation (mean 0, std 1): connectomes are correlations already in [−1, 1].
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np

from ..errors import ConfigError, DatasetError
from .base import DatasetInfo, MultiDomainDataset, _Found, register_dataset

__all__ = ["ABIDE", "ABIDE_SITES", "sliding_connectomes", "grouped_split"]

ABIDE_SITES = ("nyu", "usm", "um", "ucla")
PAPER_FEATURES = 5995  # 110 · 109 / 2: the strict upper triangle of a 110-ROI correlation matrix


def sliding_connectomes(series: Any, window: int = 32, stride: int = 1) -> np.ndarray:
    """The connectome of every window of one subject's ROI time series (FedBN App. D.4).

    Args:
        series: ``T×R`` array, ``T`` frames of ``R`` ROI signals.
        window: frames per window (default: 32, FedBN's).
        stride: frames between window starts (default: 1, FedBN's).

    Returns:
        float32 ``W×R(R−1)/2`` with ``W = (T − window) // stride + 1``: row ``w`` is the strict upper
        triangle (row-major, ``np.triu_indices(R, 1)``) of the Pearson correlation matrix of frames
        ``w·stride … w·stride + window − 1``.

    Raises:
        ValueError: a series shorter than one window, or an ROI constant within a window
            (its correlation is undefined: drop that ROI first).
    """
    x = np.asarray(series, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"series must be T×R (frames × ROIs), got shape {x.shape}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise ValueError(f"window must be an integer >= 2, got {window!r}")
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ValueError(f"stride must be a positive integer, got {stride!r}")
    t, r = x.shape
    if t < window:
        raise ValueError(f"series has {t} frames, fewer than one window of {window}")
    wins = np.lib.stride_tricks.sliding_window_view(x, window, axis=0)[::stride]  # [W, R, window]
    centred = wins - wins.mean(axis=2, keepdims=True)
    norm = np.sqrt((centred**2).sum(axis=2))  # [W, R]
    if (norm == 0).any():
        w, roi = np.argwhere(norm == 0)[0]
        raise ValueError(f"ROI {roi} is constant in the window starting at frame {w * stride}: drop it before computing connectomes")
    z = centred / norm[..., None]
    corr = np.einsum("wif,wjf->wij", z, z)
    iu = np.triu_indices(r, 1)
    return corr[:, iu[0], iu[1]].astype(np.float32)


def grouped_split(labels: np.ndarray, groups: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train/test row indices with every group (subject) on one side, stratified by label.

    Per label, the groups of that label are permuted by ``np.random.default_rng(seed)`` and the
    first ``floor(n_groups · test_fraction + 0.5)`` go to the test split, so the windows of one
    subject never straddle the split. Both index arrays are sorted.
    """
    rng = np.random.default_rng(seed)
    uniq, inverse = np.unique(groups, return_inverse=True)
    group_label = np.full(len(uniq), -1, dtype=np.int64)
    for g in range(len(uniq)):
        lab = np.unique(labels[inverse == g])
        if len(lab) != 1:
            raise DatasetError(f"subject {uniq[g]!r} has rows with labels {lab.tolist()}; a subject has one diagnosis")
        group_label[g] = lab[0]
    test_groups = []
    for c in np.unique(group_label):
        members = rng.permutation(np.flatnonzero(group_label == c))
        test_groups.append(members[: int(np.floor(len(members) * test_fraction + 0.5))])
    test = np.isin(inverse, np.concatenate(test_groups))
    return np.flatnonzero(~test), np.flatnonzero(test)


def _read_site(path: Path, test_fraction: float, split_seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_test, y_test)`` of one site file (module docstring)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"Could not read {path}: {exc}. The file is truncated or corrupt.") from exc
    split_keys, whole_keys = {"x_train", "y_train", "x_test", "y_test"}, {"x", "y"}
    if split_keys <= set(arrays):
        parts = [(arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"])]
    elif whole_keys <= set(arrays):
        x, y = arrays["x"], arrays["y"]
        groups = arrays.get("subject", np.arange(len(y)))
        if len(groups) != len(y):
            raise DatasetError(f"{path}: 'subject' has {len(groups)} entries for {len(y)} rows")
        tr, te = grouped_split(np.asarray(y).astype(np.int64, copy=False), np.asarray(groups), test_fraction, split_seed)
        parts = [(x[tr], y[tr]), (x[te], y[te])]
    else:
        raise DatasetError(
            f"{path} holds {sorted(arrays)}; an ABIDE site file holds 'x' (float N×F connectomes) and 'y' (1 = autism, "
            "0 = control), optionally 'subject', or x_train/y_train/x_test/y_test"
        )
    out = []
    for x, y in parts:
        x, y = np.asarray(x), np.asarray(y)
        if x.ndim != 2 or not np.issubdtype(x.dtype, np.floating):
            raise DatasetError(f"{path}: connectomes must be a float N×F array, got {x.dtype} of shape {x.shape}")
        if not np.isfinite(x).all():
            raise DatasetError(f"{path}: connectomes hold NaN or inf (a constant ROI in some window?)")
        if y.ndim != 1 or len(y) != len(x) or not np.issubdtype(y.dtype, np.integer) or (len(y) and not np.isin(y, (0, 1)).all()):
            raise DatasetError(f"{path}: labels must be {len(x)} integers in {{0, 1}} (1 = autism, 0 = control)")
        out += [x.astype(np.float32), y.astype(np.int64)]
    return out[0], out[1], out[2], out[3]


@register_dataset("abide")
class ABIDE(MultiDomainDataset):
    """ABIDE I connectomes, one domain (client) per site (module docstring for the files).

    Args:
        root: the data folder; the site files are looked up in ``root/abide``, ``root/ABIDE``, then ``root``.
        train: the training split if True, else the test split.
        download: not available (ABIDE's terms ask users to fetch it themselves); raises if the files are absent.
        sites: the sites to read, in client order (default: FedBN's four, ``nyu, usm, um, ucla``).
        test_fraction: test share of a site stored without a split (default: 0.2), by subject when
            the file has ``subject``.
        split_seed: seed of that split (default: 0).

    Attributes as :class:`MultiDomainDataset`; ``data`` is float32 ``N×1×1×F``.
    """

    sample_dtype: ClassVar[type] = np.float32
    base_folders: ClassVar[tuple[str, ...]] = ("abide", "ABIDE", "")
    classes = ["control", "autism"]
    domain_names = list(ABIDE_SITES)
    info = DatasetInfo(name="abide", num_classes=2, in_channels=PAPER_FEATURES, image_size=(1, 1),
                       mean=(0.0,) * PAPER_FEATURES, std=(1.0,) * PAPER_FEATURES)

    def __init__(self, root: str | os.PathLike | None = None, train: bool = True, download: bool = False, *,
                 sites: Sequence[str] | None = None, test_fraction: float = 0.2, split_seed: int = 0) -> None:
        if sites is None:
            sites = ABIDE_SITES
        if isinstance(sites, str) or not sites or not all(isinstance(s, str) for s in sites):
            raise ConfigError(f"dataset_args.sites must be a list of site names, e.g. [nyu, usm, um, ucla], got {sites!r}")
        if len({s.lower() for s in sites}) != len(sites):
            raise ConfigError(f"dataset_args.sites lists a site twice: {list(sites)}")
        if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) or not 0 < test_fraction < 1:
            raise ConfigError(f"dataset_args.test_fraction must lie in (0, 1), got {test_fraction!r}")
        self.sites = [s.lower() for s in sites]
        self.test_fraction = float(test_fraction)
        self.split_seed = int(split_seed)
        super().__init__(root, train, download)

    def download(self) -> None:
        if self._check_integrity():
            return
        raise DatasetError(f"ABIDE cannot be downloaded by fednorm. {self._advice()}")

    def _site_file(self, site: str) -> Path | None:
        assert self.root is not None
        for folder in self.base_folders:
            path = self.root / folder / f"{site}.npz"
            if path.is_file():
                return path
        return None

    def _locate(self) -> tuple[_Found | None, list[str]]:
        paths = {s: self._site_file(s) for s in self.sites}
        missing = [s for s, p in paths.items() if p is None]
        if missing:
            return None, [f"no site file {', '.join(f'{s}.npz' for s in missing)}"]
        return _Found("npz", tuple(p for p in paths.values() if p is not None)), []

    def _load_domains(self, found: _Found) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        xs, ys, ds = [], [], []
        features = set()
        for d, path in enumerate(found.paths):
            x_tr, y_tr, x_te, y_te = _read_site(path, self.test_fraction, self.split_seed)
            x, y = (x_tr, y_tr) if self.train else (x_te, y_te)
            features |= {x_tr.shape[1], x_te.shape[1]}
            xs.append(x)
            ys.append(y)
            ds.append(np.full(len(y), d, dtype=np.int64))
        if len(features) != 1:
            raise DatasetError(f"the site files {', '.join(map(str, found.paths))} hold connectomes of different lengths {sorted(features)}")
        (f,) = features
        self.domain_names = list(self.sites)
        if f != type(self).info.in_channels:  # another atlas: the vectors' own length
            self.info = DatasetInfo(name="abide", num_classes=2, in_channels=f, image_size=(1, 1), mean=(0.0,) * f, std=(1.0,) * f)
        x = np.concatenate(xs).reshape(-1, 1, 1, f)
        return x, np.concatenate(ys), np.concatenate(ds)

    def _advice(self) -> str:
        where = " or ".join(str(self.root / f) if f else str(self.root) for f in self.base_folders) if self.root else "--data-dir"
        return (f"Put one file per site, {', '.join(f'{s}.npz' for s in self.sites)}, in {where}: each with 'x' (float N×F "
                "connectomes), 'y' (1 = autism, 0 = control) and optionally 'subject' (docs/data.md, 'ABIDE I').")
