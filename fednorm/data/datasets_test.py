"""Tests for fednorm.data.datasets.

Each loader reads small fake files written in tmp_path in the real upstream format (IDX,
gzipped IDX, CIFAR pickles, USPS LIBSVM bz2, npz), and the parsed arrays must equal what
was written. Tests on the shared benchmark data skip when ``../shared/data`` is absent.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fednorm.data.datasets import (
    CIFAR10,
    CIFAR100,
    DATASETS,
    USPS,
    DatasetInfo,
    Digits,
    FashionMNIST,
    ImageDataset,
    MNIST,
    dataset_to_tensors,
    default_root,
    get_dataset_info,
    list_datasets,
    load_dataset,
    read_idx,
)
from fednorm.data.base import _stratified_split
from fednorm.errors import DatasetError, UnknownNameError

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
FASHION_SYSTEM = Path("/usr/share/datasets/fashion-mnist")


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _flip_one_byte(path: Path, offset: int | None = None) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2 if offset is None else offset] ^= 0x01
    path.write_bytes(bytes(raw))


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _fake_images(n: int, h: int, w: int, c: int, seed: int = 0) -> np.ndarray:
    return _rng(seed).integers(0, 256, size=(n, h, w, c), dtype=np.uint8)


def _fake_labels(n: int, num_classes: int = 10, seed: int = 1) -> np.ndarray:
    return _rng(seed).integers(0, num_classes, size=n).astype(np.int64)


def _channel_stats(data: np.ndarray) -> np.ndarray:
    """Exact per-channel mean and population std in [0, 1] units, via 256-bin histograms
    (much faster than float conversion on 50000 CIFAR images)."""
    levels = np.arange(256, dtype=np.float64) / 255
    stats = []
    for c in range(data.shape[-1]):
        hist = np.bincount(data[..., c].ravel(), minlength=256).astype(np.float64)
        p = hist / hist.sum()
        mean = p @ levels
        stats.append((mean, np.sqrt(p @ (levels - mean) ** 2)))
    return np.array(stats).T  # row 0: means, row 1: stds


def _write_npz(path: Path, x: np.ndarray, y: np.ndarray, **extra: np.ndarray) -> Path:
    np.savez_compressed(path, x=x, y=y, **extra)
    return path


# -- registry and metadata --------------------------------------------------------------------


EXPECTED = {"digits", "mnist", "fashion_mnist", "usps", "cifar10", "cifar100"}


def test_registry_lists_every_dataset() -> None:
    assert EXPECTED <= set(list_datasets())
    assert list_datasets(include="cifar*") == ["cifar10", "cifar100"]
    assert "mnist" not in list_datasets(exclude="*mnist")


@pytest.mark.parametrize("name", list_datasets(exclude=["image_folder", "domains", "tiny_imagenet"]))  # their classes are found at load
def test_info_is_consistent(name: str) -> None:
    cls = DATASETS.get_builder(name)
    info = get_dataset_info(name)
    assert isinstance(info, DatasetInfo) and info.name == name
    assert len(cls.classes) == info.num_classes == len(set(cls.classes))
    assert len(info.mean) == len(info.std) == info.in_channels
    if cls.sample_dtype is np.uint8:  # pixel statistics in [0, 1] units; float features have their own units
        assert all(0 < s <= 0.5 for s in info.std) and all(0 < m < 1 for m in info.mean)  # 0.5: FedBN's digits
    else:
        assert all(s > 0 for s in info.std)
    assert info.augment == name.startswith("cifar")


def test_lookup_ignores_case_and_dashes() -> None:
    assert get_dataset_info("Fashion-MNIST").name == "fashion_mnist"
    with pytest.raises(UnknownNameError, match="mnist"):
        get_dataset_info("mnits")


def test_info_is_frozen() -> None:
    with pytest.raises(AttributeError):
        get_dataset_info("mnist").num_classes = 3  # type: ignore[misc]


def test_cifar10_std_is_the_true_std_not_the_copied_figure() -> None:
    assert get_dataset_info("cifar10").std == (0.2470, 0.2435, 0.2616)


def test_default_root_prefers_env_then_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FEDNORM_DATA", str(tmp_path / "env"))
    assert default_root() == tmp_path / "env"
    monkeypatch.delenv("FEDNORM_DATA")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_root() == tmp_path / "home" / ".cache" / "fednorm"


def test_root_none_reads_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    x, y = _fake_images(4, 16, 16, 1), _fake_labels(4)
    _write_npz(tmp_path / "usps_test.npz", x, y)
    monkeypatch.setenv("FEDNORM_DATA", str(tmp_path))
    ds = load_dataset("usps", train=False)
    assert ds.root == tmp_path
    np.testing.assert_array_equal(ds.data, x)


def test_missing_dataset_error_names_path_and_advice(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as info:
        MNIST(tmp_path)
    message = str(info.value)
    assert message.startswith(f"Dataset not found or corrupted at {tmp_path}.")
    assert "download=True" in message and "mnist_train.npz" in message
    assert isinstance(info.value, RuntimeError)


# -- digits -----------------------------------------------------------------------------------


class TestDigits:
    def test_shapes_and_counts(self) -> None:
        train, test = load_dataset("digits"), load_dataset("digits", train=False)
        assert train.root is None
        assert (len(train), len(test)) == (1438, 359)
        for ds in (train, test):
            assert ds.data.dtype == np.uint8 and ds.data.shape[1:] == (8, 8, 1)
            assert ds.targets.dtype == np.int64 and ds.data.flags.c_contiguous
        counts = np.bincount(train.targets) + np.bincount(test.targets)
        np.testing.assert_array_equal(counts, [178, 182, 177, 183, 181, 182, 181, 179, 174, 180])
        assert train.data.max() == 255 and train.data.min() == 0

    def test_split_is_disjoint_stratified_and_covers_all(self) -> None:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        train_idx, test_idx = _stratified_split(bunch.target, Digits.test_fraction, Digits.split_seed)
        assert np.intersect1d(train_idx, test_idx).size == 0
        np.testing.assert_array_equal(np.sort(np.concatenate([train_idx, test_idx])), np.arange(1797))
        for c, n in enumerate(np.bincount(bunch.target)):
            assert np.sum(bunch.target[test_idx] == c) == int(np.floor(0.2 * n + 0.5))
        # The dataset holds exactly those samples, pixels mapped by round(v * 255 / 16).
        expected = np.rint(bunch.images[test_idx] * 255 / 16).astype(np.uint8)[..., None]
        test = Digits(train=False)
        np.testing.assert_array_equal(test.data, expected)
        np.testing.assert_array_equal(test.targets, bunch.target[test_idx])

    def test_split_is_reproducible(self) -> None:
        a, b = Digits(train=True), Digits(train=True)
        np.testing.assert_array_equal(a.data, b.data)
        np.testing.assert_array_equal(a.targets, b.targets)

    def test_mean_std_constants_match_train_split(self) -> None:
        x = Digits(train=True).data.astype(np.float64) / 255
        np.testing.assert_allclose(Digits.info.mean, [x.mean()], atol=5e-5)
        np.testing.assert_allclose(Digits.info.std, [x.std()], atol=5e-5)
        np.testing.assert_allclose(_channel_stats(Digits(train=True).data), [[x.mean()], [x.std()]], atol=1e-12)

    def test_dataset_to_tensors(self) -> None:
        ds = Digits(train=True)
        x, y = dataset_to_tensors(ds)
        assert x.shape == (1438, 1, 8, 8) and x.dtype == torch.float32
        assert y.dtype == torch.int64 and torch.equal(y, torch.from_numpy(ds.targets))
        ref = (ds.data.astype(np.float64).transpose(0, 3, 1, 2) / 255 - ds.info.mean[0]) / ds.info.std[0]
        torch.testing.assert_close(x.double(), torch.from_numpy(ref), atol=1e-5, rtol=1e-6)
        assert abs(x.mean().item()) < 1e-3 and abs(x.std().item() - 1) < 1e-3
        y[0] = 99  # the tensors do not alias the dataset
        assert ds.targets[0] != 99

    def test_getitem_and_repr(self) -> None:
        ds = Digits(train=False)
        image, label = ds[3]
        assert image.shape == (8, 8, 1) and label == int(ds.targets[3])
        assert "Number of datapoints: 359" in repr(ds)


# -- MNIST / Fashion-MNIST (IDX) ---------------------------------------------------------------


def _idx_bytes(arr: np.ndarray) -> bytes:
    assert arr.dtype == np.uint8
    return bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()


def _write_idx(folder: Path, stem: str, arr: np.ndarray, gz: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (stem + (".gz" if gz else ""))
    raw = _idx_bytes(arr)
    path.write_bytes(gzip.compress(raw, mtime=0) if gz else raw)
    return path


def _write_mnist_split(folder: Path, train: bool, n: int, gz: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    prefix = "train" if train else "t10k"
    x = _fake_images(n, 28, 28, 1, seed)
    y = _fake_labels(n, seed=seed + 1)
    _write_idx(folder, f"{prefix}-images-idx3-ubyte", x[..., 0], gz)
    _write_idx(folder, f"{prefix}-labels-idx1-ubyte", y.astype(np.uint8), gz)
    return x, y


def _use_md5s_of(monkeypatch: pytest.MonkeyPatch, cls: type, folder: Path) -> None:
    """Point ``cls.resources`` at the fake files' md5s, as if they were upstream's."""
    resources = [(name, _md5(folder / name) if (folder / name).exists() else md5) for name, md5 in cls.resources]
    monkeypatch.setattr(cls, "resources", resources)


class TestMNIST:
    def test_raw_idx_in_torchvision_layout(self, tmp_path: Path) -> None:
        x, y = _write_mnist_split(tmp_path / "MNIST" / "raw", train=True, n=5, gz=False)
        ds = MNIST(tmp_path)
        assert ds.source.layout == "idx"
        np.testing.assert_array_equal(ds.data, x)
        np.testing.assert_array_equal(ds.targets, y)
        assert ds.data.dtype == np.uint8 and ds.targets.dtype == np.int64

    @pytest.mark.parametrize("subfolder", ["", "mnist", "MNIST/raw"])
    def test_gz_idx_verified_against_md5(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, subfolder: str) -> None:
        folder = tmp_path / subfolder
        x, y = _write_mnist_split(folder, train=False, n=3, gz=True)
        _use_md5s_of(monkeypatch, MNIST, folder)
        ds = load_dataset("mnist", tmp_path, train=False)
        np.testing.assert_array_equal(ds.data, x)
        np.testing.assert_array_equal(ds.targets, y)

    def test_gz_with_one_changed_byte_fails_md5(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        folder = tmp_path / "mnist"
        _write_mnist_split(folder, train=True, n=3, gz=True)
        _use_md5s_of(monkeypatch, MNIST, folder)
        MNIST(tmp_path)  # verifies before the change
        _flip_one_byte(folder / "train-images-idx3-ubyte.gz", offset=-20)
        with pytest.raises(DatasetError, match="train-images-idx3-ubyte.gz failed its md5 check"):
            MNIST(tmp_path)

    def test_real_upstream_md5_rejects_fake_gz(self, tmp_path: Path) -> None:
        _write_mnist_split(tmp_path, train=True, n=2, gz=True)
        with pytest.raises(DatasetError, match="md5"):
            MNIST(tmp_path)

    def test_truncated_idx_names_the_file(self, tmp_path: Path) -> None:
        folder = tmp_path / "mnist"
        _write_mnist_split(folder, train=True, n=4, gz=False)
        path = folder / "train-images-idx3-ubyte"
        path.write_bytes(path.read_bytes()[:-5])
        with pytest.raises(DatasetError, match="truncated") as info:
            MNIST(tmp_path)
        assert str(path) in str(info.value)

    def test_truncated_gz_names_the_file(self, tmp_path: Path) -> None:
        folder = tmp_path / "mnist"
        _write_mnist_split(folder, train=True, n=4, gz=True)
        path = folder / "train-labels-idx1-ubyte.gz"
        path.write_bytes(path.read_bytes()[:-6])
        with pytest.raises(DatasetError) as info:  # gzip data is read lazily: fails in read_idx
            read_idx(path)
        assert str(path) in str(info.value)

    def test_bad_magic_and_rank(self, tmp_path: Path) -> None:
        bad = tmp_path / "bad"
        bad.write_bytes(b"\x01\x02\x08\x01" + struct.pack(">I", 0))
        with pytest.raises(DatasetError, match="magic"):
            read_idx(bad)
        labels = _write_idx(tmp_path, "labels", np.zeros(3, np.uint8), gz=False)
        with pytest.raises(DatasetError, match="3-D"):
            read_idx(labels, ndim=3)

    def test_trailing_bytes_rejected(self, tmp_path: Path) -> None:
        path = _write_idx(tmp_path, "labels", np.arange(4, dtype=np.uint8), gz=False)
        path.write_bytes(path.read_bytes() + b"\x00")
        with pytest.raises(DatasetError, match="longer"):
            read_idx(path)

    def test_label_out_of_range(self, tmp_path: Path) -> None:
        folder = tmp_path / "mnist"
        _write_mnist_split(folder, train=True, n=3, gz=False)
        _write_idx(folder, "train-labels-idx1-ubyte", np.array([1, 10, 2], np.uint8), gz=False)
        with pytest.raises(DatasetError, match=r"\[0, 10\)") as info:
            MNIST(tmp_path)
        assert "train-labels-idx1-ubyte" in str(info.value)

    def test_count_mismatch(self, tmp_path: Path) -> None:
        folder = tmp_path / "mnist"
        _write_mnist_split(folder, train=True, n=3, gz=False)
        _write_idx(folder, "train-labels-idx1-ubyte", np.array([1, 2], np.uint8), gz=False)
        with pytest.raises(DatasetError, match="3 images but"):
            MNIST(tmp_path)

    def test_npz_layout(self, tmp_path: Path) -> None:
        x, y = _fake_images(6, 28, 28, 1), _fake_labels(6)
        _write_npz(tmp_path / "mnist_train.npz", x, y)
        ds = MNIST(tmp_path)
        assert ds.source.layout == "npz_split"
        np.testing.assert_array_equal(ds.data, x)
        np.testing.assert_array_equal(ds.targets, y)

    def test_npz_truncated_names_the_file(self, tmp_path: Path) -> None:
        path = _write_npz(tmp_path / "mnist_test.npz", _fake_images(6, 28, 28, 1), _fake_labels(6))
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        with pytest.raises(DatasetError) as info:
            MNIST(tmp_path, train=False)
        assert str(path) in str(info.value)

    def test_npz_missing_key_and_bad_labels(self, tmp_path: Path) -> None:
        np.savez(tmp_path / "mnist_train.npz", x=_fake_images(2, 28, 28, 1))
        with pytest.raises(DatasetError, match="'y'"):
            MNIST(tmp_path)
        _write_npz(tmp_path / "mnist_train.npz", _fake_images(2, 28, 28, 1), np.array([0, -1]))
        with pytest.raises(DatasetError, match="mnist_train.npz"):
            MNIST(tmp_path)

    def test_npz_wrong_image_shape(self, tmp_path: Path) -> None:
        _write_npz(tmp_path / "mnist_train.npz", _fake_images(2, 16, 16, 1), _fake_labels(2))
        with pytest.raises(DatasetError, match="N×28×28×1"):
            MNIST(tmp_path)

    def test_download_from_file_mirror(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        remote = tmp_path / "remote"
        x_tr, y_tr = _write_mnist_split(remote, train=True, n=4, gz=True, seed=0)
        x_te, y_te = _write_mnist_split(remote, train=False, n=2, gz=True, seed=5)
        _use_md5s_of(monkeypatch, MNIST, remote)
        monkeypatch.setattr(MNIST, "mirrors", [(tmp_path / "dead").as_uri() + "/", remote.as_uri() + "/"])
        root = tmp_path / "root"
        train = MNIST(root, download=True)
        test = MNIST(root, train=False, download=True)  # idempotent: nothing fetched twice
        assert sorted(p.name for p in (root / "MNIST" / "raw").iterdir()) == sorted(n for n, _ in MNIST.resources)
        np.testing.assert_array_equal(train.data, x_tr)
        np.testing.assert_array_equal(test.targets, y_te)

    def test_download_failure_is_a_dataset_error(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(MNIST, "mirrors", [(tmp_path / "dead").as_uri() + "/"])
        with pytest.raises(DatasetError, match="train-images-idx3-ubyte.gz"):
            MNIST(tmp_path / "root", download=True)


class TestFashionMNIST:
    def test_torchvision_layout_and_classes(self, tmp_path: Path) -> None:
        x, y = _write_mnist_split(tmp_path / "FashionMNIST" / "raw", train=True, n=3, gz=False)
        ds = load_dataset("fashion_mnist", tmp_path)
        np.testing.assert_array_equal(ds.data, x)
        assert ds.classes[9] == "Ankle boot" and ds.info.name == "fashion_mnist"

    def test_not_found_in_mnist_folders(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        _write_mnist_split(tmp_path / "MNIST" / "raw", train=True, n=3, gz=False)
        monkeypatch.setattr(FashionMNIST, "system_folders", ())  # ignore an installed system copy
        with pytest.raises(DatasetError, match="FashionMNIST"):
            FashionMNIST(tmp_path)

    def test_system_folder_accepts_any_names_without_md5(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        system = tmp_path / "usr-share"
        system.mkdir()
        x = _fake_images(3, 28, 28, 1)
        y = _fake_labels(3)
        (system / "t10k-images.idx3-ubyte.gz").write_bytes(gzip.compress(_idx_bytes(x[..., 0])))
        (system / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(_idx_bytes(y.astype(np.uint8))))
        monkeypatch.setattr(FashionMNIST, "system_folders", (system,))
        ds = FashionMNIST(tmp_path / "empty-root", train=False)
        np.testing.assert_array_equal(ds.data, x)
        np.testing.assert_array_equal(ds.targets, y)

    def test_npz_prefix(self, tmp_path: Path) -> None:
        x, y = _fake_images(2, 28, 28, 1), _fake_labels(2)
        _write_npz(tmp_path / "fashion_mnist_test.npz", x, y)
        _write_npz(tmp_path / "mnist_test.npz", x[::-1], y[::-1])
        np.testing.assert_array_equal(FashionMNIST(tmp_path, train=False).data, x)

    @pytest.mark.skipif(not FASHION_SYSTEM.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
    def test_debian_package(self, tmp_path: Path) -> None:
        train, test = FashionMNIST(tmp_path, train=True), FashionMNIST(tmp_path, train=False)
        assert (len(train), len(test)) == (60000, 10000)
        np.testing.assert_array_equal(np.bincount(train.targets), [6000] * 10)
        np.testing.assert_allclose(_channel_stats(train.data), [train.info.mean, train.info.std], atol=5e-5)


# -- USPS (LIBSVM bz2) -----------------------------------------------------------------------------


def _write_usps(path: Path, values: np.ndarray, labels: np.ndarray, sparse_row: int | None = None) -> None:
    lines = []
    for i, (row, label) in enumerate(zip(values, labels)):
        pairs = [f"{j + 1}:{v:.6f}" for j, v in enumerate(row) if not (i == sparse_row and v == 0)]
        lines.append(f"{label + 1} " + " ".join(pairs))
    path.write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))


class TestUSPS:
    def _fake(self, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        values = np.round(_rng(seed).uniform(-1, 1, size=(n, 256)), 6)
        values[:, :3] = [-1.0, 1.0, 0.0]  # the extremes map to 0 and 255
        return values, _fake_labels(n, seed=seed + 1)

    @staticmethod
    def _expected(values: np.ndarray) -> np.ndarray:
        # torchvision's conversion, in float32, truncating.
        return ((values.astype(np.float32) + 1) / 2 * 255).astype(np.uint8).reshape(-1, 16, 16, 1)

    def test_libsvm_bz2_roundtrip(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        values, labels = self._fake(5)
        values[2, 10:20] = 0.0
        _write_usps(tmp_path / "usps.bz2", values, labels, sparse_row=2)  # row 2 omits its zeros
        _use_md5s_of(monkeypatch, USPS, tmp_path)
        ds = load_dataset("usps", tmp_path)
        assert ds.source.layout == "libsvm"
        np.testing.assert_array_equal(ds.data, self._expected(values))
        np.testing.assert_array_equal(ds.targets, labels)
        assert ds.data[0, 0, 0, 0] == 0 and ds.data[0, 0, 1, 0] == 255 and ds.data[0, 0, 2, 0] == 127

    def test_test_split_in_subfolder(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        values, labels = self._fake(3, seed=4)
        (tmp_path / "usps").mkdir()
        _write_usps(tmp_path / "usps" / "usps.t.bz2", values, labels)
        _use_md5s_of(monkeypatch, USPS, tmp_path / "usps")
        ds = USPS(tmp_path, train=False)
        np.testing.assert_array_equal(ds.targets, labels)

    def test_one_changed_byte_fails_md5(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        _write_usps(tmp_path / "usps.bz2", *self._fake(3))
        _use_md5s_of(monkeypatch, USPS, tmp_path)
        _flip_one_byte(tmp_path / "usps.bz2")
        with pytest.raises(DatasetError, match="usps.bz2 failed its md5 check"):
            USPS(tmp_path)

    def test_label_out_of_range(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        values, labels = self._fake(3)
        labels[1] = 10  # written as 11
        _write_usps(tmp_path / "usps.bz2", values, labels)
        _use_md5s_of(monkeypatch, USPS, tmp_path)
        with pytest.raises(DatasetError, match=r"usps.bz2.*\[0, 10\)"):
            USPS(tmp_path)

    def test_malformed_line(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        (tmp_path / "usps.bz2").write_bytes(bz2.compress(b"3 1:0.5 2:oops\n"))
        _use_md5s_of(monkeypatch, USPS, tmp_path)
        with pytest.raises(DatasetError, match="LIBSVM"):
            USPS(tmp_path)

    def test_npz_layout(self, tmp_path: Path) -> None:
        x, y = _fake_images(4, 16, 16, 1), _fake_labels(4)
        _write_npz(tmp_path / "usps_train.npz", x, y, x_raw_milli=np.zeros((4, 16, 16), np.int16))
        ds = USPS(tmp_path)
        np.testing.assert_array_equal(ds.data, x)
        np.testing.assert_array_equal(ds.targets, y)

    def test_npz_without_channel_axis(self, tmp_path: Path) -> None:
        x, y = _fake_images(4, 16, 16, 1), _fake_labels(4)
        _write_npz(tmp_path / "usps_train.npz", x[..., 0], y)
        np.testing.assert_array_equal(USPS(tmp_path).data, x)


# -- CIFAR (python pickles, npz) -------------------------------------------------------------------


def _cifar_rows(x: np.ndarray) -> np.ndarray:
    """Upstream row layout: N×3072, channel-major (R plane, G plane, B plane)."""
    return x.transpose(0, 3, 1, 2).reshape(len(x), -1)


def _write_cifar_batch(path: Path, x: np.ndarray, y: np.ndarray, label_key: str, bytes_keys: bool) -> None:
    entry = {"data": _cifar_rows(x), label_key: [int(v) for v in y], "batch_label": "fake"}
    if bytes_keys:  # how Python 2's cPickle files look when read without encoding
        entry = {k.encode(): v for k, v in entry.items()}
    path.write_bytes(pickle.dumps(entry, protocol=2))


def _write_cifar10(folder: Path, per_batch: int = 2) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    names = [n for n, _ in CIFAR10.train_list + CIFAR10.test_list]
    for i, name in enumerate(names):
        x, y = _fake_images(per_batch, 32, 32, 3, seed=i), _fake_labels(per_batch, seed=i + 10)
        _write_cifar_batch(folder / name, x, y, "labels", bytes_keys=i % 2 == 0)
        written[name] = (x, y)
    return written


def _use_cifar_md5s(monkeypatch: pytest.MonkeyPatch, cls: type, folder: Path) -> None:
    for attr in ("train_list", "test_list"):
        monkeypatch.setattr(cls, attr, [(n, _md5(folder / n)) for n, _ in getattr(cls, attr)])


class TestCIFAR:
    def test_cifar10_pickles_roundtrip(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        folder = tmp_path / "cifar-10-batches-py"
        written = _write_cifar10(folder)
        _use_cifar_md5s(monkeypatch, CIFAR10, folder)
        train, test = load_dataset("cifar10", tmp_path), load_dataset("cifar10", tmp_path, train=False)
        batches = [written[f"data_batch_{i}"] for i in range(1, 6)]
        np.testing.assert_array_equal(train.data, np.concatenate([x for x, _ in batches]))
        np.testing.assert_array_equal(train.targets, np.concatenate([y for _, y in batches]))
        np.testing.assert_array_equal(test.data, written["test_batch"][0])
        assert train.data.flags.c_contiguous and train.data.shape == (10, 32, 32, 3)

    def test_upstream_md5_rejects_fake_batches(self, tmp_path: Path) -> None:
        _write_cifar10(tmp_path / "cifar-10-batches-py")
        with pytest.raises(DatasetError, match="data_batch_1 failed its md5 check"):
            CIFAR10(tmp_path)

    def test_one_changed_byte_fails_md5(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        folder = tmp_path / "cifar-10-batches-py"
        _write_cifar10(folder)
        _use_cifar_md5s(monkeypatch, CIFAR10, folder)
        _flip_one_byte(folder / "test_batch", offset=-40)
        with pytest.raises(DatasetError, match="test_batch failed its md5 check"):
            CIFAR10(tmp_path, train=False)

    def test_pickle_with_foreign_globals_is_refused(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        folder = tmp_path / "cifar-10-batches-py"
        _write_cifar10(folder)

        class Evil:
            def __reduce__(self):  # would run a command with a plain pickle.load
                import os

                return (os.getcwd, ())

        (folder / "test_batch").write_bytes(pickle.dumps({"data": Evil(), "labels": []}))
        _use_cifar_md5s(monkeypatch, CIFAR10, folder)
        with pytest.raises(DatasetError, match="not allowed"):
            CIFAR10(tmp_path, train=False)

    def test_truncated_pickle_names_the_file(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        folder = tmp_path / "cifar-10-batches-py"
        _write_cifar10(folder)
        path = folder / "test_batch"
        path.write_bytes(path.read_bytes()[:-100])
        _use_cifar_md5s(monkeypatch, CIFAR10, folder)
        with pytest.raises(DatasetError, match="test_batch"):
            CIFAR10(tmp_path, train=False)

    def test_cifar100_fine_labels_and_range(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        folder = tmp_path / "cifar-100-python"
        folder.mkdir()
        x, y = _fake_images(4, 32, 32, 3), np.array([0, 99, 42, 7])
        _write_cifar_batch(folder / "train", x, y, "fine_labels", bytes_keys=False)
        _write_cifar_batch(folder / "test", x[:2], np.array([3, 100]), "fine_labels", bytes_keys=True)
        _use_cifar_md5s(monkeypatch, CIFAR100, folder)
        ds = load_dataset("cifar100", tmp_path)
        np.testing.assert_array_equal(ds.data, x)
        np.testing.assert_array_equal(ds.targets, y)
        assert len(ds.classes) == 100 and ds.classes[0] == "apple" and ds.classes[-1] == "worm"
        with pytest.raises(DatasetError, match=r"test.*\[0, 100\)"):
            CIFAR100(tmp_path, train=False)

    def test_npz_parts_concatenated_in_sorted_order(self, tmp_path: Path) -> None:
        parts = [(_fake_images(3, 32, 32, 3, seed=s), _fake_labels(3, seed=s + 5)) for s in range(3)]
        for i in (2, 0, 1):  # written out of order
            _write_npz(tmp_path / f"cifar10_train_part{i}.npz", *parts[i])
        _write_npz(tmp_path / "cifar100_train.npz", *parts[0])  # not a CIFAR-10 part
        ds = CIFAR10(tmp_path)
        assert [p.name for p in ds.source.paths] == [f"cifar10_train_part{i}.npz" for i in range(3)]
        np.testing.assert_array_equal(ds.data, np.concatenate([x for x, _ in parts]))
        np.testing.assert_array_equal(ds.targets, np.concatenate([y for _, y in parts]))

    def test_npz_test_prefers_exact_name_then_largest(self, tmp_path: Path) -> None:
        small = (_fake_images(2, 32, 32, 3, seed=1), _fake_labels(2))
        large = (_fake_images(5, 32, 32, 3, seed=2), _fake_labels(5))
        _write_npz(tmp_path / "cifar10_test_a_small.npz", *small)
        _write_npz(tmp_path / "cifar10_test_b_large.npz", *large)
        np.testing.assert_array_equal(CIFAR10(tmp_path, train=False).data, large[0])
        exact = (_fake_images(1, 32, 32, 3, seed=3), _fake_labels(1))
        _write_npz(tmp_path / "cifar10_test.npz", *exact)
        np.testing.assert_array_equal(CIFAR10(tmp_path, train=False).data, exact[0])

    def test_npz_parts_with_mismatched_shapes(self, tmp_path: Path) -> None:
        _write_npz(tmp_path / "cifar10_train_0.npz", _fake_images(1, 32, 32, 3), _fake_labels(1))
        _write_npz(tmp_path / "cifar10_train_1.npz", _fake_images(1, 28, 28, 3), _fake_labels(1))
        with pytest.raises(DatasetError, match="different image shapes"):
            CIFAR10(tmp_path)

    def test_download_and_extract_official_tarball(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        staging = tmp_path / "staging" / "cifar-10-batches-py"
        written = _write_cifar10(staging, per_batch=1)
        _use_cifar_md5s(monkeypatch, CIFAR10, staging)
        remote = tmp_path / "remote"
        remote.mkdir()
        with tarfile.open(remote / "cifar-10-python.tar.gz", "w:gz") as tar:
            tar.add(staging, arcname="cifar-10-batches-py")
        monkeypatch.setattr(CIFAR10, "resources", [("cifar-10-python.tar.gz", _md5(remote / "cifar-10-python.tar.gz"))])
        monkeypatch.setattr(CIFAR10, "mirrors", [remote.as_uri() + "/"])
        root = tmp_path / "root"
        ds = CIFAR10(root, train=False, download=True)
        np.testing.assert_array_equal(ds.data, written["test_batch"][0])
        assert (root / "cifar-10-python.tar.gz").is_file()
        ds.download()  # idempotent once the files verify
        assert len(CIFAR10(root, download=True)) == 5


def test_dataset_error_for_wrong_dtype(tmp_path: Path) -> None:
    _write_npz(tmp_path / "cifar10_test.npz", np.zeros((2, 32, 32, 3), np.float32), _fake_labels(2))
    with pytest.raises(DatasetError, match="uint8"):
        CIFAR10(tmp_path, train=False)


def test_subclass_contract() -> None:
    assert issubclass(FashionMNIST, MNIST) and issubclass(CIFAR100, CIFAR10)
    for name in list_datasets():
        assert issubclass(DATASETS.get_builder(name), ImageDataset)


# -- shared benchmark data (skipped on machines without ../shared/data) ----------------------------

needs_shared = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"{SHARED_DATA} is absent")


@needs_shared
class TestSharedData:
    def test_cifar10(self) -> None:
        train = load_dataset("cifar10", SHARED_DATA)
        assert train.data.shape == (50000, 32, 32, 3)
        np.testing.assert_array_equal(np.bincount(train.targets), [5000] * 10)
        mean, std = _channel_stats(train.data)
        np.testing.assert_allclose(train.info.mean, mean, atol=5e-5)
        np.testing.assert_allclose(train.info.std, std, atol=5e-5)
        test = load_dataset("cifar10", SHARED_DATA, train=False)
        assert len(test) == 10000  # the complete (JPEG) copy, not the 1000-image subset
        np.testing.assert_array_equal(np.bincount(test.targets), [1000] * 10)

    def test_mnist(self) -> None:
        train, test = MNIST(SHARED_DATA), MNIST(SHARED_DATA, train=False)
        assert (len(train), len(test)) == (60000, 10000)
        np.testing.assert_allclose(_channel_stats(train.data), [[0.1307], [0.3081]], atol=5e-5)

    def test_usps(self) -> None:
        train, test = USPS(SHARED_DATA), USPS(SHARED_DATA, train=False)
        assert (len(train), len(test)) == (7291, 2007)
        np.testing.assert_allclose(_channel_stats(train.data), [USPS.info.mean, USPS.info.std], atol=5e-5)
