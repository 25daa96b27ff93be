"""``domain_labels``: label shift within each domain (LN/FN paper, PACS), and its matched per-domain test splits."""

from __future__ import annotations

import numpy as np
import pytest

from fednorm.data.federated import build_federated_data
from fednorm.data.partition import label_histogram, partition, split_like_by_domain
from fednorm.errors import PartitionError


def _data(per=(60, 40, 50), classes=7, seed=0):
    """Labels and domains; every domain holds every class (in a shuffled order)."""
    rng = np.random.default_rng(seed)
    dom = np.repeat(np.arange(len(per)), per)
    labels = np.concatenate([rng.permutation(np.arange(n) % classes) for n in per])
    return labels, dom


def test_class_sets_are_disjoint_within_each_domain_and_cover_it():
    labels, dom = _data()
    parts = partition("domain_labels", labels, 9, seed=4, domains=dom, class_counts=[2, 2, 3])
    assert len(parts) == 9
    for d in range(3):
        mine = parts[3 * d:3 * d + 3]
        assert all(set(dom[p]) == {d} for p in mine)  # clients numbered domain by domain
        sets = [set(labels[p]) for p in mine]
        assert [len(s) for s in sets] == [2, 2, 3] and set.union(*sets) == set(range(7))
        np.testing.assert_array_equal(np.sort(np.concatenate(mine)), np.flatnonzero(dom == d))  # every sample, once
    again = partition("domain_labels", labels, 9, seed=4, domains=dom, class_counts=[2, 2, 3])
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    # each domain draws its own class order
    first_sets = [frozenset(labels[parts[3 * d]]) for d in range(3)]
    assert len(set(first_sets)) > 1


def test_dirichlet_within_each_domain_is_the_dirichlet_partition_of_that_domain():
    labels, dom = _data()
    parts = partition("domain_labels", labels, 6, seed=1, domains=dom, domain_names=["p", "a", "c"],
                      sources=["c", "p"], alpha=0.5, min_size=3)
    assert [set(dom[p]) for p in parts] == [{2}, {2}, {2}, {0}, {0}, {0}]
    assert all(len(p) >= 3 for p in parts)
    for k, d in enumerate((2, 0)):
        np.testing.assert_array_equal(np.sort(np.concatenate(parts[3 * k:3 * k + 3])), np.flatnonzero(dom == d))
    # a tiny alpha concentrates each class of a domain on one client; a huge one spreads it evenly
    skewed = partition("domain_labels", labels, 9, seed=1, domains=dom, alpha=0.01)
    even = partition("domain_labels", labels, 9, seed=1, domains=dom, alpha=1000.0)

    def share(ps):  # the part of each domain's class held by its largest holder among the domain's 3 clients
        h = label_histogram(labels, ps, 7)
        return sum(h[3 * k:3 * k + 3].max(axis=0).sum() for k in range(3)) / len(labels)

    assert share(skewed) > 0.9 and share(even) < 0.5


def test_bad_arguments_say_what_is_wrong():
    labels, dom = _data()
    with pytest.raises(PartitionError, match="add up to 6"):
        partition("domain_labels", labels, 9, seed=0, domains=dom, class_counts=[2, 2, 2])
    with pytest.raises(PartitionError, match="3 class sets for 2 clients"):
        partition("domain_labels", labels, 6, seed=0, domains=dom, class_counts=[2, 2, 3])
    with pytest.raises(PartitionError, match="multiple"):
        partition("domain_labels", labels, 7, seed=0, domains=dom, alpha=1.0)
    with pytest.raises(PartitionError, match="positive integers"):
        partition("domain_labels", labels, 9, seed=0, domains=dom, class_counts="223")


def test_test_splits_come_from_the_own_domain_with_the_own_label_mix():
    labels, dom = _data()
    parts = partition("domain_labels", labels, 9, seed=2, domains=dom, class_counts=[2, 2, 3])
    hist = label_histogram(labels, parts, 7)
    test_labels, test_dom = _data(per=(30, 20, 25), seed=5)
    tests = split_like_by_domain(test_labels, test_dom, [0, 0, 0, 1, 1, 1, 2, 2, 2], hist, seed=0)
    for c, t in enumerate(tests):
        assert set(test_dom[t]) == {c // 3}
        assert set(test_labels[t]) == set(labels[parts[c]])  # disjoint class sets: all of the domain's test images of those classes
    np.testing.assert_array_equal(np.sort(np.concatenate(tests)), np.arange(len(test_labels)))


def test_build_federated_data_gives_domain_label_clients_their_matched_tests(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for d, domain in enumerate(("photo", "sketch")):
        for c in range(4):
            folder = tmp_path / "pacs_like" / domain / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(10):
                img = (rng.integers(0, 30, (8, 8, 3)) + 50 * c + 20 * d).astype(np.uint8)
                Image.fromarray(img).save(folder / f"{i}.png")
    data = build_federated_data("image_folder", num_clients=4, partition_name="domain_labels", seed=3,
                                data_dir=str(tmp_path / "pacs_like"), dataset_args={"cache": False}, class_counts=[2, 2])
    assert data.client_domain == [0, 0, 1, 1]
    for c in range(4):
        train_classes = set(data.train_y[data.client_train[c]].tolist())
        assert len(train_classes) == 2
        assert set(data.test_y[data.client_test[c]].tolist()) == train_classes
        assert set(data.test_domain[data.client_test[c]].tolist()) == {c // 2}
