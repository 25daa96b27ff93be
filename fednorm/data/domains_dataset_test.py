"""The ``domains`` dataset (issue 19): domains from .npz files, image folders and registered datasets."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

from fednorm.data.datasets import load_dataset
from fednorm.data.federated import build_federated_data
from fednorm.data.readers import fit_images, natural_key, npz_part_files, resize_images, to_channels
from fednorm.errors import ConfigError, DatasetError, PartitionError


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDNORM_CACHE", str(tmp_path / "cache"))
    from fednorm.data import cache

    monkeypatch.setattr(cache, "_MEMO", {})


def write_folder(root: Path, classes=("cat", "dog", "owl"), per_class=10, size=(24, 24), colour=True, seed=0, shift=0):
    """``root/<class>/<i>.png`` images whose brightness depends on the class (and ``shift``)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c, name in enumerate(classes):
        folder = root / name
        folder.mkdir(parents=True)
        for i in range(per_class):
            shape = (*size, 3) if colour else size
            img = (rng.integers(0, 40, shape) + 60 * c + shift).clip(0, 255).astype(np.uint8)
            Image.fromarray(img).save(folder / f"{i}.png")


def arrays(n=30, size=20, classes=3, seed=0, grey=True):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    x = rng.integers(0, 40, (n, size, size) if grey else (n, size, size, 3)) + 60 * (y[:, None, None] if grey else y[:, None, None, None])
    return x.astype(np.uint8), y.astype(np.int64)


def test_folders_and_npz_become_one_dataset_at_the_chosen_size(tmp_path):
    write_folder(tmp_path / "scans", size=(24, 24))
    write_folder(tmp_path / "phone", size=(16, 12), colour=False, seed=1)
    x, y = arrays()
    np.savez(tmp_path / "arr.npz", x=x, y=y)
    opts = dict(domains={"scans": "scans", "phone": "phone", "arr": "arr.npz"}, image_size=20)
    train = load_dataset("domains", tmp_path, train=True, **opts)
    test = load_dataset("domains", tmp_path, train=False, **opts)
    assert train.domain_names == ["scans", "phone", "arr"] and train.classes == ["cat", "dog", "owl"]
    assert train.data.shape[1:] == (20, 20, 3) and train.info.in_channels == 3 and train.info.image_size == (20, 20)
    # each domain split 80/20 per class: 10 per class -> 8/2; the array's 10 per class -> 8/2
    assert train.domain_sizes() == {"scans": 24, "phone": 24, "arr": 24}
    assert test.domain_sizes() == {"scans": 6, "phone": 6, "arr": 6}
    # the grey array is copied to three equal channels and resized as resize_images does
    arr = train.data[train.domains == 2]
    assert np.array_equal(arr[..., 0], arr[..., 2])
    # brightness follows the class in every domain: the labels went with their images
    for d in range(3):
        means = [train.data[(train.domains == d) & (train.targets == c)].mean() for c in range(3)]
        assert means[0] < means[1] < means[2]


def test_decoded_folders_are_cached_and_a_changed_file_misses_the_cache(tmp_path, monkeypatch):
    from fednorm.data import cache

    write_folder(tmp_path / "a", per_class=3)
    load_dataset("domains", tmp_path, domains=["a"], image_size=8)
    entries = list((tmp_path / "cache" / "decoded").glob("a-*.npz"))
    assert len(entries) == 1
    monkeypatch.setattr(cache, "_MEMO", {})
    calls = []
    import fednorm.data.domains_dataset as dd

    real = dd.read_image_folder_domain
    monkeypatch.setattr(dd, "read_image_folder_domain", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = load_dataset("domains", tmp_path, domains=["a"], image_size=8)
    assert calls == []  # served from the disk cache
    from PIL import Image

    Image.fromarray(np.full((24, 24, 3), 255, np.uint8)).save(tmp_path / "a" / "cat" / "0.png")
    monkeypatch.setattr(cache, "_MEMO", {})
    changed = load_dataset("domains", tmp_path, domains=["a"], image_size=8)
    assert calls == [1] and not np.array_equal(changed.data, again.data)
    (tmp_path / "a" / "empty").mkdir()  # a new, empty class folder is seen, not hidden by the cache
    monkeypatch.setattr(cache, "_MEMO", {})
    with pytest.raises(DatasetError, match="holds no images"):
        load_dataset("domains", tmp_path, domains=["a"], image_size=8)


def test_npz_pieces_and_stored_splits(tmp_path):
    x, y = arrays(n=40)
    np.savez(tmp_path / "big_part0.npz", x=x[:25], y=y[:25])
    np.savez(tmp_path / "big_part1.npz", x=x[25:], y=y[25:])
    np.savez(tmp_path / "whole.npz", x=x, y=y)
    assert [p.name for p in npz_part_files(tmp_path / "big.npz")] == ["big_part0.npz", "big_part1.npz"]
    a = load_dataset("domains", tmp_path, domains={"p": "big.npz"})
    b = load_dataset("domains", tmp_path, domains={"p": "whole.npz"})
    assert np.array_equal(a.data, b.data) and np.array_equal(a.targets, b.targets)
    # stored splits are kept as they are
    np.savez(tmp_path / "split.npz", x_train=x[:30], y_train=y[:30], x_test=x[30:], y_test=y[30:])
    tr = load_dataset("domains", tmp_path, domains=["split.npz"])
    te = load_dataset("domains", tmp_path, train=False, domains=["split.npz"])
    assert np.array_equal(tr.data[..., 0], x[:30]) and np.array_equal(te.targets, y[30:])
    assert tr.domain_names == ["split"] and tr.info.in_channels == 1 and tr.info.num_classes == 3
    # <prefix>_train.npz / <prefix>_test.npz, the shared data's layout
    np.savez(tmp_path / "pre_train.npz", x=x[:30], y=y[:30])
    np.savez(tmp_path / "pre_test.npz", x=x[30:], y=y[30:])
    te2 = load_dataset("domains", tmp_path, train=False, domains=["pre"])
    assert np.array_equal(te2.data[..., 0], x[30:])


def test_registered_datasets_and_preset_domains_are_domains(tmp_path):
    x, y = arrays(n=20, size=28, classes=10)
    for split in ("train", "test"):
        np.savez(tmp_path / f"mnist_{split}.npz", x=x, y=y)
    ds = load_dataset("domains", tmp_path, domains=["digits", "digits5:mnist"], image_size=12, channels=1)
    assert ds.domain_names == ["digits", "mnist"] and ds.data.shape[1:] == (12, 12, 1)
    digits = load_dataset("digits")
    assert ds.domain_sizes()["digits"] == len(digits) and ds.info.num_classes == 10
    assert np.array_equal(ds.data[ds.domains == 0], resize_images(digits.data, (12, 12)))


def test_to_channels_matches_pil_and_resize_keeps_constant_images():
    from PIL import Image

    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (4, 5, 6, 3), dtype=np.uint8)
    grey = to_channels(rgb, 1)
    pil = np.stack([np.asarray(Image.fromarray(im).convert("L")) for im in rgb])
    assert np.abs(grey[..., 0].astype(int) - pil.astype(int)).max() <= 1  # PIL rounds in fixed point
    assert np.array_equal(to_channels(grey, 3)[..., 1], grey[..., 0])
    flat = np.full((2, 9, 7, 3), 77, np.uint8)
    assert np.array_equal(fit_images(flat, (20, 20), 3), np.full((2, 20, 20, 3), 77, np.uint8))
    assert sorted(["10", "2", "1"], key=natural_key) == ["1", "2", "10"]


# -- presets: any subset of Digits-5 -------------------------------------------------------


def _digits5_npz(root: Path, domains=("mnist", "usps"), n=30):
    for d in domains:
        size = {"mnist": 28, "usps": 16}.get(d, 32)
        x, y = arrays(n=n, size=size, classes=10, seed=zlib.crc32(d.encode()))
        for split in ("train", "test"):
            np.savez(root / f"{d}_{split}.npz", x=x, y=y)


def test_digits5_runs_with_any_subset_of_its_domains(tmp_path):
    _digits5_npz(tmp_path, ("mnist", "usps", "svhn"))
    with pytest.warns(UserWarning, match="no files for domain.*synth, mnistm"):
        data = build_federated_data("digits5", num_clients=3, partition_name="domains", seed=0, data_dir=str(tmp_path))
    assert data.domain_names == ["mnist", "svhn", "usps"] and data.train_x.shape[1:] == (3, 28, 28)
    two = build_federated_data("digits5", num_clients=2, partition_name="domains", seed=0, data_dir=str(tmp_path),
                               sources=["usps", "mnist"])
    assert [two.domain_names[d] for d in two.client_domain] == ["usps", "mnist"]
    sub = load_dataset("digits5", tmp_path, domains=["usps"], image_size=16)
    assert sub.domain_names == ["usps"] and sub.data.shape[1:] == (16, 16, 3)
    with pytest.raises(DatasetError, match="domain 'synth'.*partition_args.sources"):
        build_federated_data("digits5", num_clients=2, partition_name="domains", seed=0, data_dir=str(tmp_path),
                             sources=["mnist", "synth"])
    with pytest.raises(DatasetError, match="no train files for domain 'mnistm'"):
        load_dataset("digits5", tmp_path, domains=["mnist", "mnistm"])
    with pytest.raises(ConfigError, match="Valid values are"):
        load_dataset("digits5", tmp_path, domains=["mnist", "mnist_m"])


def test_digits5_domain_in_pieces(tmp_path):
    x, y = arrays(n=33, size=32, classes=10, grey=False)
    for k in range(11):  # part0 ... part10, concatenated in numeric order (part10 last)
        np.savez(tmp_path / f"svhn_train_part{k}.npz", x=x[3 * k : 3 * k + 3], y=y[3 * k : 3 * k + 3])
    np.savez(tmp_path / "svhn_test.npz", x=x[:5], y=y[:5])
    ds = load_dataset("digits5", tmp_path, domains=["svhn"])
    assert len(ds) == 33 and np.array_equal(ds.targets, y)


# -- every data problem: one DatasetError naming the file and the fix ------------------------


def test_missing_file(tmp_path):
    with pytest.raises(DatasetError, match=r"Domain 'nowhere/b.npz' was not found.*Fix the path"):
        load_dataset("domains", tmp_path, domains=["nowhere/b.npz"])


def test_wrong_shapes(tmp_path):
    np.savez(tmp_path / "flat.npz", x=np.zeros((10, 400), np.uint8), y=np.zeros(10, np.int64))
    with pytest.raises(DatasetError, match=r"flat.npz.*shape \(10, 400\).*N×H×W"):
        load_dataset("domains", tmp_path, domains=["flat.npz"])
    np.savez(tmp_path / "float.npz", x=np.zeros((10, 4, 4), np.float32), y=np.zeros(10, np.int64))
    with pytest.raises(DatasetError, match=r"float.npz.*float32.*astype\(np.uint8\)"):
        load_dataset("domains", tmp_path, domains=["float.npz"])
    np.savez(tmp_path / "short.npz", x=np.zeros((10, 4, 4), np.uint8), y=np.zeros(9, np.int64))
    with pytest.raises(DatasetError, match=r"short.npz.*10 images but 9 labels"):
        load_dataset("domains", tmp_path, domains=["short.npz"])


def test_labels_out_of_range(tmp_path):
    write_folder(tmp_path / "f", per_class=5)
    x, y = arrays(n=20, classes=5)
    np.savez(tmp_path / "five.npz", x=x, y=y)
    with pytest.raises(DatasetError, match=r"domain 'five' in .*five.npz lie in \[0, 4\].*3 classes.*relabel"):
        load_dataset("domains", tmp_path, domains=["f", "five.npz"], image_size=20)
    with pytest.raises(DatasetError, match="num_classes"):
        load_dataset("domains", tmp_path, domains=["five.npz"], num_classes=4)
    np.savez(tmp_path / "neg.npz", x=x, y=y - 1)
    with pytest.raises(DatasetError, match=r"neg.npz.*include -1"):
        load_dataset("domains", tmp_path, domains=["neg.npz"])


def test_corrupt_archive(tmp_path):
    x, y = arrays()
    np.savez(tmp_path / "ok.npz", x=x, y=y)
    data = (tmp_path / "ok.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match=r"cut.npz.*truncated or corrupt.*np.savez"):
        load_dataset("domains", tmp_path, domains=["cut.npz"])
    np.savez(tmp_path / "keys.npz", images=x, labels=y)
    with pytest.raises(DatasetError, match=r"keys.npz holds the arrays \['images', 'labels'\].*'x'"):
        load_dataset("domains", tmp_path, domains=["keys.npz"])


def test_empty_class_folder_and_bad_images(tmp_path):
    write_folder(tmp_path / "f", per_class=3)
    (tmp_path / "f" / "empty").mkdir()
    with pytest.raises(DatasetError, match=r"class folder .*f/empty holds no images.*remove the folder"):
        load_dataset("domains", tmp_path, domains=["f"])
    (tmp_path / "f" / "empty").rmdir()
    (tmp_path / "f" / "cat" / "bad.png").write_bytes(b"not a png")
    with pytest.raises(DatasetError, match=r"bad.png.*Replace or delete"):
        load_dataset("domains", tmp_path, domains=["f"])
    (tmp_path / "f" / "cat" / "bad.png").unlink()
    write_folder(tmp_path / "g", per_class=3, size=(10, 10))
    with pytest.raises(ConfigError, match=r"different image sizes.*image_size"):
        load_dataset("domains", tmp_path, domains=["f", "g"])


def test_domain_with_fewer_samples_than_the_partition_asks(tmp_path):
    x, y = arrays(n=30)
    np.savez(tmp_path / "big.npz", x=x, y=y)
    np.savez(tmp_path / "tiny.npz", x=x[:6], y=y[:6])
    with pytest.raises(PartitionError, match=r"smallest source has 6 \(source 'tiny'\).*add samples to domain 'tiny'.*tiny.npz"):
        build_federated_data("domains", num_clients=2, partition_name="domains", seed=0, data_dir=str(tmp_path),
                             dataset_args={"domains": ["big.npz", "tiny.npz"]}, per_client=10)


def test_other_datasets_refuse_dataset_args():
    with pytest.raises(ConfigError, match="dataset 'digits' takes no option 'image_size'"):
        load_dataset("digits", image_size=12)
    with pytest.raises(ConfigError, match="needs dataset_args.domains"):
        load_dataset("domains")


def test_office_caltech10_runs_with_two_of_its_domains_at_a_chosen_size(tmp_path):
    base = tmp_path / "office_caltech_10"
    write_folder(base / "amazon", classes=("bike", "mug", "not_a_class"), per_class=5)
    write_folder(base / "dslr", classes=("bike", "mug"), per_class=5, shift=30)
    with pytest.warns(UserWarning, match="caltech, webcam"):
        data = build_federated_data("office_caltech10", num_clients=2, partition_name="domains", seed=0, data_dir=str(tmp_path),
                                    dataset_args={"image_size": 16})
    assert data.domain_names == ["amazon", "dslr"] and data.train_x.shape[1:] == (3, 16, 16)
    assert data.info.num_classes == 10 and set(data.train_y.tolist()) == {1, 8}  # bike, mug; the extra folder is skipped
    only = load_dataset("office_caltech10", tmp_path, domains=["dslr"], image_size=8, channels=1)
    assert only.domain_names == ["dslr"] and only.data.shape[1:] == (8, 8, 1)
    with pytest.raises(DatasetError, match="no folder for domain 'webcam'"):
        load_dataset("office_caltech10", tmp_path, domains=["webcam"])


def test_pacs_reads_the_release_kfold_folders_in_its_domain_and_class_order(tmp_path):
    """The LN paper's PACS (Table 5): kfold/<domain>/<class>/, 224 x 224 by default, classes by name."""
    base = tmp_path / "PACS" / "kfold"
    write_folder(base / "sketch", classes=("person", "dog"), per_class=5, size=(12, 12))
    write_folder(base / "photo", classes=("dog", "house"), per_class=5, size=(12, 12), shift=20)
    train = load_dataset("pacs", tmp_path, cache=False)
    assert train.domain_names == ["photo", "sketch"]  # the benchmark's order, not the folders'
    assert train.classes == ["dog", "elephant", "giraffe", "guitar", "horse", "house", "person"]
    assert train.data.shape[1:] == (224, 224, 3) and train.info.num_classes == 7
    assert set(train.targets[train.domains == 0].tolist()) == {0, 5} and set(train.targets[train.domains == 1].tolist()) == {0, 6}
    # write_folder paints class folder k at brightness 60 k (+ shift): labels follow the folder names, not their order
    dark = train.data.reshape(len(train.data), -1).mean(axis=1)
    assert dark[(train.domains == 1) & (train.targets == 6)].mean() < dark[(train.domains == 1) & (train.targets == 0)].mean()


def test_a_source_that_is_not_in_the_benchmark_points_to_the_domains_dataset(tmp_path):
    _digits5_npz(tmp_path, ("mnist", "usps"))
    with pytest.raises(PartitionError, match=r"Unknown value 'mine' in sources.*'domains' dataset.*digits5:mnist"):
        build_federated_data("digits5", num_clients=3, partition_name="domains", seed=0, data_dir=str(tmp_path),
                             sources=["mnist", "usps", "mine"])


def test_one_domain_under_a_label_partition_keeps_label_matched_test_splits(tmp_path):
    x, y = arrays(n=300, classes=3)
    np.savez(tmp_path / "only.npz", x=x, y=y)
    data = build_federated_data("domains", num_clients=3, partition_name="classes", seed=0, data_dir=str(tmp_path),
                                dataset_args={"domains": ["only.npz"]}, classes_per_client=1)
    assert data.client_domain is None
    for c in range(3):  # each client holds one class and is tested on that class only
        assert len(set(data.train_y[data.client_train[c]].tolist())) == 1
        assert set(data.test_y[data.client_test[c]].tolist()) == set(data.train_y[data.client_train[c]].tolist())
