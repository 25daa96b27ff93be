"""ABIDE I site files (FedBN Table 1): sliding-window connectomes, the per-site layout, subject-wise splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fednorm.data.abide import ABIDE, ABIDE_SITES, grouped_split, sliding_connectomes
from fednorm.data.datasets import dataset_to_tensors, load_dataset
from fednorm.data.federated import build_federated_data
from fednorm.errors import ConfigError, DatasetError


def write_fake_abide(root: Path, subjects: dict[str, int], *, windows: int = 3, features: int = 12, seed: int = 0) -> dict[str, dict]:
    """``root/abide/<site>.npz`` with ``subjects[site]`` subjects of ``windows`` rows each.

    Row features: column 0 is the label (1 = autism, 0 = control), column 1 the site's index,
    column 2 the subject's number; the rest random in [−1, 1]. Subjects alternate labels.
    Returns each site's arrays, for the caller to compare with.
    """
    rng = np.random.default_rng(seed)
    folder = root / "abide"
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for i, (site, n) in enumerate(subjects.items()):
        subject = np.repeat(np.arange(n), windows)
        y = (subject % 2).astype(np.int64)
        x = rng.uniform(-1, 1, (len(y), features))
        x[:, 0], x[:, 1], x[:, 2] = y, i, subject
        np.savez(folder / f"{site}.npz", x=x.astype(np.float32), y=y, subject=subject)
        out[site] = {"x": x.astype(np.float32), "y": y, "subject": subject}
    return out


SIZES = {"nyu": 10, "usm": 6, "um": 8, "ucla": 7}  # every site keeps test subjects of both labels


def test_sliding_connectomes_are_each_windows_correlation_matrix():
    rng = np.random.default_rng(1)
    series = rng.normal(size=(40, 6))
    rows = sliding_connectomes(series, window=32, stride=1)
    assert rows.shape == (40 - 32 + 1, 15) and rows.dtype == np.float32  # T − 31 windows (FedBN Table 10), 6·5/2 pairs
    iu = np.triu_indices(6, 1)
    for w in (0, 4, 8):
        np.testing.assert_allclose(rows[w], np.corrcoef(series[w:w + 32].T)[iu], rtol=1e-5, atol=1e-6)
    strided = sliding_connectomes(series, window=10, stride=7)
    assert len(strided) == (40 - 10) // 7 + 1
    np.testing.assert_allclose(strided[2], np.corrcoef(series[14:24].T)[iu], rtol=1e-5, atol=1e-6)
    series[5:15, 3] = 2.0  # a constant ROI in the first windows of 10
    with pytest.raises(ValueError, match="ROI 3 is constant"):
        sliding_connectomes(series, window=10)
    with pytest.raises(ValueError, match="fewer than one window"):
        sliding_connectomes(series[:20], window=32)


def test_grouped_split_keeps_subjects_whole_and_is_stratified():
    groups = np.repeat(np.arange(20), 4)
    labels = (groups % 2).astype(np.int64)
    tr, te = grouped_split(labels, groups, 0.2, seed=3)
    assert not set(groups[tr]) & set(groups[te]) and len(tr) + len(te) == 80
    assert sorted(np.unique(groups[te]) % 2) == [0, 0, 1, 1]  # 2 of each label's 10 subjects
    again = grouped_split(labels, groups, 0.2, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip((tr, te), again))
    labels[0] = 1 - labels[0]
    with pytest.raises(DatasetError, match="one diagnosis"):
        grouped_split(labels, groups, 0.2, seed=3)


def test_sites_load_as_domains_with_their_labels_and_subject_wise_split(tmp_path):
    written = write_fake_abide(tmp_path, SIZES)
    train = load_dataset("abide", tmp_path, train=True)
    test = load_dataset("abide", tmp_path, train=False)
    assert train.data.dtype == np.float32 and train.data.shape[1:] == (1, 1, 12) and train.info.in_channels == 12
    assert train.domain_names == list(ABIDE_SITES)
    for split in (train, test):
        rows = split.data[:, 0, 0]
        np.testing.assert_array_equal(rows[:, 0].astype(np.int64), split.targets)  # each row keeps its own label
        np.testing.assert_array_equal(rows[:, 1].astype(np.int64), split.domains)  # and its own site
    for d, site in enumerate(ABIDE_SITES):
        tr_subj = set(train.data[train.domains == d, 0, 0, 2].astype(int))
        te_subj = set(test.data[test.domains == d, 0, 0, 2].astype(int))
        assert not tr_subj & te_subj and tr_subj | te_subj == set(range(SIZES[site]))  # whole subjects on one side
        n_test = sum(int(np.floor(k * 0.2 + 0.5)) for k in (SIZES[site] - SIZES[site] // 2, SIZES[site] // 2))
        assert len(te_subj) == n_test
    # the rows are the file's, untouched
    nyu = written["nyu"]
    got = np.concatenate([train.data[train.domains == 0], test.data[test.domains == 0]])[:, 0, 0]
    order = np.lexsort(got.T[::-1])
    np.testing.assert_array_equal(got[order], nyu["x"][np.lexsort(nyu["x"].T[::-1])])
    # no standardisation: the tensors are the connectomes, one feature a channel
    x, y = dataset_to_tensors(train)
    np.testing.assert_array_equal(x.numpy(), train.data.transpose(0, 3, 1, 2))


def test_a_stored_split_is_used_as_it_is_and_sites_select_clients(tmp_path):
    write_fake_abide(tmp_path, SIZES)
    rng = np.random.default_rng(0)
    xs = {k: rng.uniform(-1, 1, (n, 12)).astype(np.float32) for k, n in (("x_train", 7), ("x_test", 3))}
    np.savez(tmp_path / "abide" / "ucla.npz", y_train=np.array([0, 1] * 3 + [1]), y_test=np.array([1, 0, 0]), **xs)
    ds = ABIDE(tmp_path, train=False, sites=["ucla", "nyu"])
    assert ds.domain_names == ["ucla", "nyu"]
    np.testing.assert_array_equal(ds.data[ds.domains == 0, 0, 0], xs["x_test"])
    np.testing.assert_array_equal(ds.targets[ds.domains == 0], [1, 0, 0])


def test_bad_or_missing_files_name_the_problem(tmp_path):
    with pytest.raises(DatasetError, match="nyu.npz, usm.npz, um.npz, ucla.npz") as info:
        load_dataset("abide", tmp_path)
    assert "docs/data.md" in str(info.value)
    write_fake_abide(tmp_path, SIZES)
    folder = tmp_path / "abide"
    np.savez(folder / "um.npz", x=np.zeros((4, 12), np.float32), y=np.array([0, 1, 2, 1]))
    with pytest.raises(DatasetError, match="um.npz: labels"):
        ABIDE(tmp_path)
    x = np.zeros((4, 12), np.float32)
    x[1, 3] = np.nan
    np.savez(folder / "um.npz", x=x, y=np.array([0, 1, 0, 1]))
    with pytest.raises(DatasetError, match="NaN"):
        ABIDE(tmp_path)
    np.savez(folder / "um.npz", x=np.zeros((4, 13), np.float32), y=np.array([0, 1, 0, 1]))
    with pytest.raises(DatasetError, match="different lengths"):
        ABIDE(tmp_path)
    np.savez(folder / "um.npz", features=np.zeros((4, 12), np.float32))
    with pytest.raises(DatasetError, match="holds \\['features'\\]"):
        ABIDE(tmp_path)
    with pytest.raises(ConfigError, match="twice"):
        ABIDE(tmp_path, sites=["nyu", "NYU"])
    with pytest.raises(DatasetError, match="cannot be downloaded"):
        ABIDE(tmp_path / "empty", download=True)


def test_one_client_per_site_with_the_sites_own_sizes_and_test_sets(tmp_path):
    """FedBN's ABIDE setting: four clients, each all of its site's training rows, tested on its site."""
    write_fake_abide(tmp_path, SIZES)
    data = build_federated_data("abide", num_clients=4, partition_name="domains", seed=1, data_dir=str(tmp_path),
                                equal=False)
    train = ABIDE(tmp_path)
    test = ABIDE(tmp_path, train=False)
    assert [len(p) for p in data.client_train] == [int((train.domains == d).sum()) for d in range(4)]
    assert [len(p) for p in data.client_test] == [int((test.domains == d).sum()) for d in range(4)]
    assert data.client_domain == [0, 1, 2, 3] and data.train_x.shape[1:] == (12, 1, 1)
    for c in range(4):
        assert set(data.train_x[data.client_train[c], 1, 0, 0].int().tolist()) == {c}
        assert set(data.test_x[data.client_test[c], 1, 0, 0].int().tolist()) == {c}
