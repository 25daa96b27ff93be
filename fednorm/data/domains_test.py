"""Multi-source datasets, the domains partition and per-source test splits."""

import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from fednorm.data.datasets import load_dataset
from fednorm.data.digits_domains import blend_mnistm, generate_digits_domains
from fednorm.data.federated import build_federated_data
from fednorm.data.partition import domains as domains_partition
from fednorm.data.partition import partition, split_by_domain
from fednorm.errors import DatasetError, PartitionError


SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _dom(sizes):
    return np.repeat(np.arange(len(sizes)), sizes)


def test_domains_partition_keeps_sources_apart_with_equal_sizes():
    dom = _dom([50, 30, 80])
    labels = np.arange(len(dom)) % 10
    parts = partition("domains", labels, 6, seed=3, domains=dom, clients_per_domain=2)
    assert [len(p) for p in parts] == [15] * 6  # smallest source (30) split in 2
    for c, p in enumerate(parts):
        assert set(dom[p]) == {c // 2}  # client c holds source c // 2 only
    flat = np.concatenate(parts)
    assert len(np.unique(flat)) == len(flat)  # disjoint
    again = partition("domains", labels, 6, seed=3, domains=dom, clients_per_domain=2)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = partition("domains", labels, 6, seed=4, domains=dom, clients_per_domain=2)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))


def test_domains_partition_sizes_sources_and_errors():
    dom = _dom([100, 40, 70])
    labels = np.zeros(len(dom), dtype=np.int64)
    parts = domains_partition(labels, 2, seed=0, domains=dom, domain_names=["a", "b", "c"], sources=["c", "a"], fraction=0.1)
    assert [len(p) for p in parts] == [7, 7]  # floor(0.1 * 70), the smallest *selected* source
    assert set(dom[parts[0]]) == {2} and set(dom[parts[1]]) == {0}
    assert [len(p) for p in domains_partition(labels, 3, seed=0, domains=dom, per_client=40)] == [40] * 3
    with pytest.raises(PartitionError, match="multiple"):
        domains_partition(labels, 4, seed=0, domains=dom)
    with pytest.raises(PartitionError, match="smallest source has 40"):
        domains_partition(labels, 3, seed=0, domains=dom, per_client=41)
    with pytest.raises(PartitionError, match="Valid values are"):
        domains_partition(labels, 1, seed=0, domains=dom, domain_names=["a", "b", "c"], sources=["z"])


def test_unequal_sources_keep_their_own_sizes():
    """equal=False (FedBN's ABIDE sites, App. E.6): each source whole, or its fraction, cut into near-equal clients."""
    dom = _dom([101, 40, 70])
    labels = np.arange(len(dom)) % 10
    parts = domains_partition(labels, 3, seed=2, domains=dom, equal=False)
    assert [len(p) for p in parts] == [101, 40, 70]
    for c, p in enumerate(parts):
        np.testing.assert_array_equal(p, np.flatnonzero(dom == c))  # every sample of its own source, sorted
    two = domains_partition(labels, 6, seed=2, domains=dom, equal=False, clients_per_domain=2)
    assert [len(p) for p in two] == [51, 50, 20, 20, 35, 35]
    assert [set(dom[p]) for p in two] == [{0}, {0}, {1}, {1}, {2}, {2}]
    assert len(np.unique(np.concatenate(two))) == len(dom)  # disjoint, and together every sample
    tenth = domains_partition(labels, 3, seed=2, domains=dom, equal=False, fraction=0.1)
    assert [len(p) for p in tenth] == [10, 4, 7]  # floor(0.1 * n) of each source
    (pooled,) = domains_partition(labels, 1, seed=2, domains=dom, equal=False, fraction=0.1, pooled=True)
    np.testing.assert_array_equal(pooled, np.sort(np.concatenate(tenth)))
    with pytest.raises(PartitionError, match="leave per_client out"):
        domains_partition(labels, 3, seed=0, domains=dom, equal=False, per_client=10)
    with pytest.raises(PartitionError, match="fewer than clients_per_domain"):
        domains_partition(labels, 6, seed=0, domains=dom, domain_names=["a", "b", "c"], equal=False, fraction=0.02,
                          clients_per_domain=2)
    with pytest.raises(PartitionError, match="equal must be"):
        domains_partition(labels, 3, seed=0, domains=dom, equal="no")


def test_pooled_gives_one_client_exactly_the_one_client_per_source_split():
    """FedBN Table 12's centralized run pools the clients' data: the same samples, one client."""
    dom = _dom([100, 40, 70])
    labels = np.arange(len(dom)) % 10
    split = domains_partition(labels, 3, seed=5, domains=dom, per_client=30)
    (pooled,) = domains_partition(labels, 1, seed=5, domains=dom, per_client=30, pooled=True)
    np.testing.assert_array_equal(pooled, np.sort(np.concatenate(split)))
    assert sorted(np.bincount(dom[pooled])) == [30, 30, 30]
    (two,) = domains_partition(labels, 1, seed=0, domains=dom, domain_names=["a", "b", "c"], sources=["c", "a"],
                               pooled=True)
    assert set(dom[two]) == {0, 2} and len(two) == 2 * 70  # default: the smallest selected source's size each
    with pytest.raises(PartitionError, match="num_clients to 1"):
        domains_partition(labels, 3, seed=0, domains=dom, pooled=True)
    with pytest.raises(PartitionError, match="pooled"):
        domains_partition(labels, 1, seed=0, domains=dom, pooled="yes")


def test_split_by_domain_gives_each_client_its_own_sources_test_set():
    test_dom = _dom([9, 5, 4])
    parts = split_by_domain(test_dom, [1, 0, 0], seed=0)
    assert np.array_equal(parts[0], np.flatnonzero(test_dom == 1))  # sole client of source 1: all of it
    assert set(test_dom[np.concatenate(parts[1:])]) == {0}
    assert sorted(np.concatenate(parts[1:])) == list(np.flatnonzero(test_dom == 0))  # shared, disjoint, complete
    assert {len(parts[1]), len(parts[2])} == {4, 5}


def _write_folder(root, domains=("art", "photo", "sketch"), classes=("cat", "dog"), per_class=10, size=12):
    from PIL import Image

    rng = np.random.default_rng(0)
    for d, dname in enumerate(domains):
        for c, cname in enumerate(classes):
            folder = root / dname / cname
            folder.mkdir(parents=True)
            for i in range(per_class):
                img = rng.integers(0, 50, size=(size, size, 3)) + 60 * d + 40 * c
                Image.fromarray(img.astype(np.uint8)).save(folder / f"{i}.png")


def test_image_folder_domains_give_one_source_per_client_and_own_test_sets(tmp_path):
    _write_folder(tmp_path)
    train = load_dataset("image_folder", tmp_path, train=True)
    test = load_dataset("image_folder", tmp_path, train=False)
    assert train.domain_names == ["art", "photo", "sketch"] and train.classes == ["cat", "dog"]
    assert train.data.shape[1:] == (64, 64, 3) and train.domain_sizes() == {"art": 16, "photo": 16, "sketch": 16}
    assert test.domain_sizes() == {"art": 4, "photo": 4, "sketch": 4}  # stratified 80/20 per source
    data = build_federated_data("image_folder", num_clients=2, partition_name="domains", seed=0, data_dir=str(tmp_path),
                                sources=["sketch", "art"], per_client=10)
    assert data.client_domain == [2, 0] and data.domain_names == ["art", "photo", "sketch"]
    assert len(data.train_x) == 20  # only the samples clients hold are converted
    assert [len(t) for t in data.client_test] == [4, 4] and len(data.test_x) == 8  # held-out 'photo' is not tested
    # each client's test images are its own source's: their mean brightness identifies the source
    for c, d in enumerate(data.client_domain):
        own = torch.as_tensor(normalize_mean(test, d))
        assert torch.allclose(data.test_x[data.client_test[c]].mean(), own, atol=1e-5)


def test_a_pooled_client_is_scored_on_each_held_sources_test_set(tmp_path):
    """One client holding two sources: it is tested on both sources' test sets (not the left-out
    one), each test sample keeps its source, and the run records one accuracy per source."""
    from fednorm.config import ExperimentConfig
    from fednorm.engine.simulator import Simulation

    _write_folder(tmp_path)
    data = build_federated_data("image_folder", num_clients=1, partition_name="domains", seed=0, data_dir=str(tmp_path),
                                sources=["sketch", "art"], per_client=10, pooled=True)
    assert data.client_domain is None and len(data.client_train[0]) == 20
    assert sorted(data.test_domain.tolist()) == [0] * 4 + [2] * 4  # 'photo' (1) left out
    assert data.client_test[0].tolist() == list(range(8))
    sim = Simulation(ExperimentConfig(dataset="image_folder", data_dir=str(tmp_path), partition="domains",
                                      partition_args={"sources": ["sketch", "art"], "per_client": 10, "pooled": True},
                                      num_clients=1, model="mlp", norm="none", method="fedavg", rounds=1, local_steps=1,
                                      batch_size=8, threads=1, checkpoint_every=0))
    res = sim.evaluate()
    assert set(res["domain_accuracies"]) == {"art", "sketch"}
    model = sim.global_model()
    with torch.no_grad():
        right = (model.eval()(sim.data.test_x).argmax(1) == sim.data.test_y)
    for d, name in ((0, "art"), (2, "sketch")):
        assert res["domain_accuracies"][name] == float(right[sim.data.test_domain == d].double().mean())
    assert res["test_accuracy"] == pytest.approx(sum(res["domain_accuracies"].values()) / 2)  # 4 test images each


def normalize_mean(ds, d):
    x = ds.data[ds.domains == d].astype(np.float64) / 255.0
    return float(((x - 0.5) / 0.5).mean())


def _svhn_mat(path, n, rng, key_label=10):
    from scipy.io import savemat

    x = rng.integers(0, 255, size=(32, 32, 3, n), dtype=np.uint8)
    y = np.arange(n).reshape(-1, 1) % 10
    y[y == 0] = key_label
    savemat(path, {"X": x, "y": y})
    return x


def test_digits5_reads_upstream_formats(tmp_path, monkeypatch):
    from PIL import Image

    monkeypatch.setenv("FEDNORM_CACHE", str(tmp_path / "cache"))  # decoded domains go here, not to ~/.cache

    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("test", 6)):
        np.savez(tmp_path / f"mnist_{split}.npz", x=rng.integers(0, 255, (n, 28, 28, 1), dtype=np.uint8), y=np.arange(n) % 10)
        np.savez(tmp_path / f"usps_{split}.npz", x=rng.integers(0, 255, (n, 16, 16, 1), dtype=np.uint8), y=np.arange(n) % 10)
        svhn = _svhn_mat(tmp_path / f"{split}_32x32.mat", n, rng)
        _svhn_mat(tmp_path / f"synth_{split}_32x32.mat", n, rng)
        folder = tmp_path / "mnist_m" / f"mnist_m_{split}"
        folder.mkdir(parents=True)
        lines = []
        for i in range(n):
            Image.fromarray(rng.integers(0, 255, (28, 28, 3), dtype=np.uint8)).save(folder / f"{i:08d}.png")
            lines.append(f"{i:08d}.png {i % 10}")
        (tmp_path / "mnist_m" / f"mnist_m_{split}_labels.txt").write_text("\n".join(lines) + "\n")
    ds = load_dataset("digits5", tmp_path, train=False)
    assert ds.data.shape == (30, 28, 28, 3) and ds.domain_names == ["mnist", "svhn", "usps", "synth", "mnistm"]
    svhn_y = ds.targets[ds.domains == 1]
    assert np.array_equal(svhn_y, np.arange(6) % 10)  # label 10 means digit 0
    # the 32x32 SVHN image resized to 28x28: its mean is kept closely
    assert abs(ds.data[ds.domains == 1][1].mean() - svhn[..., 1].mean()) < 3
    (tmp_path / "test_32x32.mat").write_bytes(b"not a mat file")
    with pytest.raises(DatasetError, match="test_32x32.mat"):
        load_dataset("digits5", tmp_path, train=False)


def test_digits5_reads_fedbn_pickles(tmp_path):
    import pickle

    rng = np.random.default_rng(1)
    for folder, shape in (("MNIST", (28, 28)), ("SVHN", (32, 32, 3)), ("USPS", (16, 16)), ("SynthDigits", (32, 32, 3)), ("MNIST_M", (28, 28, 3))):
        (tmp_path / folder / "partitions").mkdir(parents=True)
        for part in range(2):
            with open(tmp_path / folder / "partitions" / f"train_part{part}.pkl", "wb") as f:
                pickle.dump((rng.integers(0, 255, (5, *shape), dtype=np.uint8), np.arange(5) + part), f)
        with open(tmp_path / folder / "test.pkl", "wb") as f:
            pickle.dump((rng.integers(0, 255, (3, *shape), dtype=np.uint8), np.arange(3)), f)
    ds = load_dataset("digits5", tmp_path, train=True)
    assert ds.data.shape == (50, 28, 28, 3) and list(ds.domain_sizes().values()) == [10] * 5
    assert np.array_equal(ds.targets[:10], np.r_[np.arange(5), np.arange(5) + 1])
    with open(tmp_path / "SVHN" / "test.pkl", "wb") as f:  # a pickle that would run code is refused
        pickle.dump(print, f)
    with pytest.raises(DatasetError, match="test.pkl"):
        load_dataset("digits5", tmp_path, train=False)


def _fake_sources(name, train):
    rng = np.random.default_rng(zlib.crc32(f"{name}{train}".encode()))
    n = {"mnist": 400 if train else 100, "usps": 60, "cifar10": 20}[name]
    shape = {"mnist": (28, 28, 1), "usps": (16, 16, 1), "cifar10": (32, 32, 3)}[name]
    x = rng.integers(0, 255, (n, *shape), dtype=np.uint8)
    return x, np.arange(n) % 10


def test_generated_domains_are_seeded_equal_sized_and_28x28x3():
    a = generate_digits_domains(_fake_sources, seed=0, train_per_domain=40, test_per_domain=10, fonts=[])
    b = generate_digits_domains(_fake_sources, seed=0, train_per_domain=40, test_per_domain=10, fonts=[])
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert a["x_train"].shape == (200, 28, 28, 3) and a["x_test"].shape == (50, 28, 28, 3)
    assert np.array_equal(np.bincount(a["d_train"]), [40] * 5) and np.array_equal(np.bincount(a["d_test"]), [10] * 5)
    c = generate_digits_domains(_fake_sources, seed=1, train_per_domain=40, test_per_domain=10, fonts=[])
    assert not np.array_equal(a["x_train"], c["x_train"])


def test_mnistm_blend_is_abs_difference_with_a_background_crop():
    rng = np.random.default_rng(0)
    bg = rng.integers(0, 255, (3, 32, 32, 3), dtype=np.uint8)
    digits = rng.integers(0, 255, (5, 28, 28, 1), dtype=np.uint8)
    out = blend_mnistm(digits, bg, seed=0)
    zero = blend_mnistm(np.zeros_like(digits), bg, seed=0)  # same crops (same seed): the patches themselves
    assert np.array_equal(out, np.abs(zero.astype(int) - digits.astype(int)).astype(np.uint8))
    crops = {bg[i, y : y + 28, x : x + 28].tobytes() for i in range(3) for y in range(5) for x in range(5)}
    assert all(z.tobytes() in crops for z in zero)


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"{SHARED_DATA} is absent")
def test_digits_domains_from_shared_data():
    ds = load_dataset("digits_domains", SHARED_DATA, train=False)
    assert ds.data.shape == (9300, 28, 28, 3) and set(ds.domain_sizes().values()) == {1860}
    assert np.array_equal(np.bincount(ds.targets, minlength=10) > 100, [True] * 10)
