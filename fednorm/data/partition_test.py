"""Tests of fednorm.data.partition: invariants of every registered partitioner, the properties of
each scheme (skew, k classes, γ-similarity, quantity skew), per-client test splits, and a
hypothesis property test that valid inputs never crash or hang and invalid ones always raise
PartitionError."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fednorm.data.partition import (
    PARTITIONS,
    classes,
    describe,
    dirichlet,
    dirichlet_client,
    gamma,
    get_partition,
    iid,
    label_histogram,
    list_partitions,
    partition,
    quantity,
    split_like,
)
from fednorm.data.partition_base import _sample_dirichlet
from fednorm.data.partition_label import _client_class_proportions
from fednorm.errors import PartitionError, UnknownNameError

# Every knob of every scheme; partition() passes each function only the ones it accepts.
KNOBS = dict(alpha=0.5, classes_per_client=3, gamma=0.5, min_size=1)


def _balanced(num_classes: int = 10, per_class: int = 100, seed: int = 0) -> np.ndarray:
    """Balanced labels in random order (as a shuffled dataset would have them)."""
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class))


# Partitions of labels alone; 'domains' and 'domain_labels' (feature shift) need each sample's source and are
# tested in domains_test.py and partition_domain_label_test.py.
LABEL_PARTITIONS = list_partitions(exclude=["domains", "domain_labels"])


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    allidx = np.concatenate(parts)
    assert len(allidx) == n
    np.testing.assert_array_equal(np.sort(allidx), np.arange(n))


def _assert_well_formed(parts: list[np.ndarray], num_clients: int) -> None:
    assert isinstance(parts, list) and len(parts) == num_clients
    for p in parts:
        assert isinstance(p, np.ndarray) and p.dtype == np.int64 and p.ndim == 1
        assert np.all(np.diff(p) > 0), "indices must be sorted and unique"


def _tv_from_global(labels: np.ndarray, parts: list[np.ndarray]) -> float:
    """Mean over non-empty clients of the total-variation distance to the global label mix."""
    hist = label_histogram(labels, parts).astype(float)
    glob = hist.sum(0) / hist.sum()
    rows = hist[hist.sum(1) > 0]
    return float(np.mean(0.5 * np.abs(rows / rows.sum(1, keepdims=True) - glob).sum(1)))


# ------------------------------------------------------------------ every registered partitioner


class TestEveryPartitionSuccess:
    @pytest.mark.parametrize("name", LABEL_PARTITIONS)
    def test_every_index_exactly_once(self, name: str) -> None:
        labels = _balanced()
        parts = _quiet(partition, name, labels, 10, seed=1, **KNOBS)
        _assert_well_formed(parts, 10)
        _assert_exact_cover(parts, len(labels))

    @pytest.mark.parametrize("name", LABEL_PARTITIONS)
    def test_same_seed_same_output_different_seed_different(self, name: str) -> None:
        labels = _balanced()
        a = _quiet(partition, name, labels, 7, seed=3, **KNOBS)
        b = _quiet(partition, name, labels, 7, seed=3, **KNOBS)
        c = _quiet(partition, name, labels, 7, seed=4, **KNOBS)
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
        assert not all(np.array_equal(x, y) for x, y in zip(a, c))

    @pytest.mark.parametrize("name", LABEL_PARTITIONS)
    def test_global_rng_untouched(self, name: str) -> None:
        np.random.seed(123)
        before = np.random.get_state()[1].copy()
        _quiet(partition, name, _balanced(), 5, seed=0, **KNOBS)
        np.testing.assert_array_equal(np.random.get_state()[1], before)

    @pytest.mark.parametrize("name", LABEL_PARTITIONS)
    def test_single_client_gets_everything(self, name: str) -> None:
        labels = _balanced(num_classes=3, per_class=5)
        knobs = dict(KNOBS, classes_per_client=3)
        (only,) = _quiet(partition, name, labels, 1, seed=0, **knobs)
        np.testing.assert_array_equal(only, np.arange(len(labels)))

    @pytest.mark.parametrize("name", LABEL_PARTITIONS)
    def test_accepts_lists_and_unsorted_sparse_labels(self, name: str) -> None:
        labels = [7, 3, 3, 7, 9, 9, 3, 7, 9, 3, 7, 9]  # classes {3, 7, 9}, not 0..C-1
        parts = _quiet(partition, name, labels, 3, seed=0, **dict(KNOBS, classes_per_client=1))
        _assert_well_formed(parts, 3)
        _assert_exact_cover(parts, len(labels))


# ------------------------------------------------------------------ registry and dispatch


class TestDispatch:
    def test_registered_names(self) -> None:
        assert {"iid", "dirichlet", "dirichlet_client", "classes", "gamma", "quantity"} <= set(list_partitions())
        assert get_partition("Dirichlet") is dirichlet
        assert get_partition("IID") is iid
        assert list_partitions("di*") == ["dirichlet", "dirichlet_client"]

    def test_unknown_name_suggests(self) -> None:
        with pytest.raises(UnknownNameError, match="dirichlet"):
            partition("dirichelt", _balanced(), 2, seed=0, alpha=1.0)

    def test_irrelevant_knobs_are_ignored(self) -> None:
        labels = _balanced()
        a = partition("iid", labels, 4, seed=0, alpha=0.1, gamma=0.3, classes_per_client=2, min_size=3)
        b = iid(labels, 4, seed=0)
        assert all(np.array_equal(x, y) for x, y in zip(a, b))

    def test_none_means_default(self) -> None:
        labels = _balanced()
        a = partition("dirichlet", labels, 4, seed=0, alpha=1.0, min_size=None, max_retries=None)
        b = dirichlet(labels, 4, seed=0, alpha=1.0)
        assert all(np.array_equal(x, y) for x, y in zip(a, b))

    @pytest.mark.parametrize("name,param", [("dirichlet", "alpha"), ("dirichlet_client", "alpha"), ("classes", "classes_per_client"),
                                            ("gamma", "gamma"), ("quantity", "alpha")])
    def test_missing_required_param_raises(self, name: str, param: str) -> None:
        with pytest.raises(PartitionError, match=param):
            partition(name, _balanced(), 4, seed=0)

    def test_typo_knob_warns_with_suggestion(self) -> None:
        with pytest.warns(UserWarning, match="alpah.*Did you mean 'alpha'"):
            partition("dirichlet", _balanced(), 4, seed=0, alpha=1.0, alpah=3.0)


# ------------------------------------------------------------------ iid


def test_iid_sizes_differ_by_at_most_one() -> None:
    parts = iid(_balanced(per_class=101), 7, seed=0)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1010


# ------------------------------------------------------------------ dirichlet


class TestDirichletSuccess:
    def test_skew_grows_as_alpha_falls(self) -> None:
        labels = _balanced(per_class=500)
        tv = {a: np.mean([_tv_from_global(labels, dirichlet(labels, 10, alpha=a, seed=s)) for s in range(3)])
              for a in (100.0, 1.0, 0.1)}
        assert tv[100.0] < tv[1.0] < tv[0.1]
        assert tv[100.0] < 0.1 and tv[0.1] > 0.5

    @pytest.mark.parametrize("alpha", [1e-2, 1e-4])
    def test_tiny_alpha_terminates_and_keeps_min_size(self, alpha: float) -> None:
        labels = _balanced()
        with warnings.catch_warnings(record=True) as caught:  # terminates: the test finishes (no time is asserted)
            warnings.simplefilter("always")
            parts = dirichlet(labels, 100, alpha=alpha, seed=0, min_size=3)
        _assert_well_formed(parts, 100)
        _assert_exact_cover(parts, len(labels))
        assert min(len(p) for p in parts) >= 3
        assert len(caught) <= 11  # at most max_retries redraw warnings plus one repair warning
        assert all("min_size" in str(w.message) for w in caught)

    @pytest.mark.parametrize("alpha", [1e-2, 1e-4, 1e-8, 1.0, 1e3])
    def test_dirichlet_draws_are_finite_and_normalised(self, alpha: float) -> None:
        p = _sample_dirichlet(np.random.default_rng(0), alpha, (50, 100))
        assert np.all(np.isfinite(p)) and np.all(p >= 0)
        np.testing.assert_allclose(p.sum(1), 1.0)

    def test_tiny_alpha_puts_each_class_on_one_client(self) -> None:
        labels = _balanced()
        hist = label_histogram(labels, dirichlet(labels, 10, alpha=1e-4, seed=0, min_size=0))
        assert np.all((hist > 0).sum(0) == 1)

    def test_retries_then_repair_warn_with_advice(self) -> None:
        labels = _balanced()
        with pytest.warns(UserWarning) as record:
            parts = dirichlet(labels, 50, alpha=0.01, seed=0, min_size=5, max_retries=2)
        messages = [str(w.message) for w in record]
        assert len(messages) == 1  # one line for the whole partition, not one per draw (issue 24)
        assert "increase alpha" in messages[0] and "moved" in messages[0] and "no draw of 3" in messages[0]
        assert min(len(p) for p in parts) >= 5

    def test_a_redraw_that_succeeds_warns_once(self) -> None:
        labels = _balanced()
        for seed in range(50):  # find a seed whose first draw fails and a later one succeeds
            with warnings.catch_warnings(record=True) as record:
                warnings.simplefilter("always")
                dirichlet(labels, 20, alpha=0.3, seed=seed, min_size=3, max_retries=10)
            if record:
                break
        assert len(record) == 1 and "were redrawn" in str(record[0].message)

    def test_min_size_zero_allows_empty_clients_without_warning(self) -> None:
        labels = _balanced()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            parts = dirichlet(labels, 50, alpha=0.01, seed=0, min_size=0)
        assert min(len(p) for p in parts) == 0
        _assert_exact_cover(parts, len(labels))

    def test_min_size_exactly_feasible(self) -> None:
        labels = _balanced(per_class=10)  # 100 samples
        parts = _quiet(dirichlet, labels, 20, alpha=0.1, seed=0, min_size=5)
        assert [len(p) for p in parts] == [5] * 20


class TestDirichletFailure:
    def test_impossible_min_size_raises_naming_it(self) -> None:
        with pytest.raises(PartitionError, match=r"min_size=101.*num_clients=10"):
            dirichlet(_balanced(), 10, alpha=1.0, seed=0, min_size=101)

    @pytest.mark.parametrize("alpha", [0, -1.0, float("nan"), float("inf"), "0.5", None])
    def test_bad_alpha(self, alpha) -> None:
        with pytest.raises(PartitionError, match="alpha"):
            dirichlet(_balanced(), 10, alpha=alpha, seed=0)


# ------------------------------------------------------------------ dirichlet_client (Hsu et al.)


class TestDirichletClient:
    def test_equal_sizes_every_sample_once(self) -> None:
        labels = _balanced(per_class=101)  # 1010 samples over 7 clients: sizes 145 or 144
        parts = dirichlet_client(labels, 7, alpha=0.1, seed=0)
        _assert_well_formed(parts, 7)
        _assert_exact_cover(parts, len(labels))
        assert sorted(len(p) for p in parts) == [144] * 5 + [145] * 2

    def test_proportions_are_dirichlet_alpha_times_the_prior(self) -> None:
        prior = np.array([0.7, 0.1, 0.1, 0.1])  # Dir(5·p): mean p, Var q_c = p_c (1 - p_c) / 6
        q = _client_class_proportions(np.random.default_rng(0), 5.0, prior, 20000)
        np.testing.assert_allclose(q.sum(1), 1.0)
        np.testing.assert_allclose(q.mean(0), prior, atol=0.005)
        np.testing.assert_allclose(q.var(0), prior * (1 - prior) / 6, rtol=0.05)

    def test_each_client_mix_follows_its_own_draw(self) -> None:
        labels = _balanced(per_class=1000)  # 50 clients of 200 samples; q_i ~ Dir(1, ..., 1)
        parts = dirichlet_client(labels, 50, alpha=10.0, seed=3)
        q = _client_class_proportions(np.random.default_rng(3), 10.0, np.full(10, 0.1), 50)
        hist = label_histogram(labels, parts).astype(float)
        mix = hist / hist.sum(1, keepdims=True)
        tv = 0.5 * np.abs(mix[:, None, :] - q[None, :, :]).sum(-1)  # [client, draw]
        own, other = np.diag(tv).mean(), tv[~np.eye(50, dtype=bool)].mean()
        assert own < 0.15 and own < other / 3, (own, other)

    def test_large_alpha_is_close_to_iid_small_alpha_is_skewed(self) -> None:
        labels = _balanced(per_class=1000)
        tv = {a: np.mean([_tv_from_global(labels, dirichlet_client(labels, 10, alpha=a, seed=s)) for s in range(3)])
              for a in (1e4, 10.0, 1.0, 0.1)}
        iid_tv = np.mean([_tv_from_global(labels, iid(labels, 10, seed=s)) for s in range(3)])
        assert tv[1e4] < iid_tv + 0.02 and tv[1e4] < 0.05
        assert tv[1e4] < tv[10.0] < tv[1.0] and tv[0.1] > 0.4

    def test_deterministic_given_the_seed(self) -> None:
        labels = _balanced()
        a, b = dirichlet_client(labels, 6, alpha=0.5, seed=11), dirichlet_client(labels, 6, alpha=0.5, seed=11)
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
        c = dirichlet_client(labels, 6, alpha=0.5, seed=12)
        assert not all(np.array_equal(x, y) for x, y in zip(a, c))

    def test_tiny_alpha_and_unbalanced_classes_keep_equal_sizes(self) -> None:
        labels = np.random.default_rng(0).permutation(np.repeat(np.arange(5), [500, 200, 100, 20, 3]))
        parts = dirichlet_client(labels, 9, alpha=1e-6, seed=0)
        _assert_exact_cover(parts, len(labels))
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1  # the rare classes run out early; clients refill from the rest

    @pytest.mark.parametrize("alpha", [0, -1.0, float("nan"), float("inf"), "0.5", None])
    def test_bad_alpha(self, alpha) -> None:
        with pytest.raises(PartitionError, match="alpha"):
            dirichlet_client(_balanced(), 10, alpha=alpha, seed=0)


# ------------------------------------------------------------------ classes


class TestClassesSuccess:
    @pytest.mark.parametrize("k", range(1, 11))
    def test_each_client_has_exactly_k_classes(self, k: int) -> None:
        labels = _balanced()
        hist = label_histogram(labels, classes(labels, 10, classes_per_client=k, seed=k))
        assert np.all((hist > 0).sum(1) == k)

    def test_sequential_k2_five_clients_is_fedtan_split(self) -> None:
        labels = _balanced()
        parts = classes(labels, 5, classes_per_client=2, seed=0, mode="sequential")
        for c, p in enumerate(parts):
            np.testing.assert_array_equal(p, np.flatnonzero(np.isin(labels, [2 * c, 2 * c + 1])))

    def test_k1_ten_clients_one_whole_class_each(self) -> None:
        labels = _balanced()
        hist = label_histogram(labels, classes(labels, 10, classes_per_client=1, seed=0))
        assert np.all((hist > 0).sum(1) == 1)
        assert sorted(hist.max(1)) == [100] * 10
        assert sorted(hist.argmax(1)) == list(range(10))

    def test_ring_mode_is_fedtan_suppl_d(self) -> None:
        # FedTAN Suppl. D, k = 4 (classes 1..10 in the paper, 0..9 here): client c holds {2c..2c+3} mod 10.
        labels = _balanced()
        hist = label_histogram(labels, classes(labels, 5, classes_per_client=4, seed=0, mode="ring"))
        for c in range(5):
            assert set(np.flatnonzero(hist[c])) == {(2 * c + m) % 10 for m in range(4)}
        assert np.all(hist[hist > 0] == 50)  # each class held by k/2 = 2 clients, equal chunks

    def test_sequential_cuts_classes_in_dataset_order(self) -> None:
        labels = np.repeat(np.arange(2), 10)
        parts = classes(labels, 4, classes_per_client=1, seed=0, mode="sequential")
        # client 0 -> class 0, client 1 -> class 1, client 2 -> class 0, client 3 -> class 1
        np.testing.assert_array_equal(parts[0], np.arange(0, 5))
        np.testing.assert_array_equal(parts[2], np.arange(5, 10))

    def test_random_mode_depends_on_seed_sequential_does_not(self) -> None:
        labels = _balanced()
        seq = [classes(labels, 5, classes_per_client=2, seed=s, mode="sequential") for s in (0, 1)]
        assert all(np.array_equal(a, b) for a, b in zip(*seq))
        rnd = [classes(labels, 5, classes_per_client=2, seed=s) for s in (0, 1)]
        assert not all(np.array_equal(a, b) for a, b in zip(*rnd))

    def test_unheld_classes_are_dropped_with_warning(self) -> None:
        labels = _balanced()
        with pytest.warns(UserWarning, match="held by no client"):
            parts = classes(labels, 3, classes_per_client=2, seed=0)
        hist = label_histogram(labels, parts, 10)
        held = hist.sum(0) > 0
        assert held.sum() == 6 and np.all(hist.sum(0)[held] == 100)
        assert len(np.concatenate(parts)) == 600


class TestClassesFailure:
    @pytest.mark.parametrize("k", [0, 11, -1, 2.0, None])
    def test_bad_k(self, k) -> None:
        with pytest.raises(PartitionError, match="classes_per_client"):
            classes(_balanced(), 5, classes_per_client=k, seed=0)

    def test_bad_mode(self) -> None:
        with pytest.raises(PartitionError, match="Unknown value 'first' for argument mode"):
            classes(_balanced(), 5, classes_per_client=2, seed=0, mode="first")  # type: ignore[arg-type]


# ------------------------------------------------------------------ gamma


class TestGammaSuccess:
    def test_gamma_one_is_near_uniform(self) -> None:
        labels = _balanced(per_class=1000)
        hist = label_histogram(labels, gamma(labels, 10, gamma=1.0, seed=0))
        props = hist / hist.sum(1, keepdims=True)
        assert np.abs(props - 0.1).max() < 0.04

    def test_gamma_zero_one_class_each(self) -> None:
        labels = _balanced()
        hist = label_histogram(labels, gamma(labels, 10, gamma=0.0, seed=0))
        assert np.all((hist > 0).sum(1) == 1)
        assert sorted(hist.argmax(1)) == list(range(10))

    def test_skew_grows_as_gamma_falls_and_sizes_equal(self) -> None:
        labels = _balanced(per_class=500)
        tv = []
        for g in (1.0, 0.5, 0.1, 0.0):
            parts = gamma(labels, 10, gamma=g, seed=0)
            sizes = [len(p) for p in parts]
            assert max(sizes) - min(sizes) <= 2
            tv.append(_tv_from_global(labels, parts))
        assert tv == sorted(tv) and tv[0] < 0.05 and tv[-1] == pytest.approx(0.9)

    @pytest.mark.parametrize("g", [-0.1, 1.5, float("nan"), "0.5"])
    def test_bad_gamma(self, g) -> None:
        with pytest.raises(PartitionError, match="gamma"):
            gamma(_balanced(), 10, gamma=g, seed=0)


# ------------------------------------------------------------------ quantity


class TestQuantitySuccess:
    def test_label_mix_near_global_and_sizes_vary(self) -> None:
        labels = _balanced(per_class=1000)
        parts = quantity(labels, 10, alpha=0.5, seed=0, min_size=200)
        sizes = np.array([len(p) for p in parts])
        assert sizes.min() >= 200 and sizes.sum() == len(labels)
        assert sizes.std() / sizes.mean() > 0.2
        hist = label_histogram(labels, parts).astype(float)
        props = hist / hist.sum(1, keepdims=True)
        assert np.abs(props - 0.1).max() < 0.06

    def test_tiny_alpha_keeps_min_size_without_retries(self) -> None:
        labels = _balanced()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            parts = quantity(labels, 100, alpha=1e-4, seed=0, min_size=7)
        assert min(len(p) for p in parts) >= 7
        _assert_exact_cover(parts, len(labels))

    def test_impossible_min_size_raises(self) -> None:
        with pytest.raises(PartitionError, match="min_size"):
            quantity(_balanced(), 10, alpha=1.0, seed=0, min_size=101)


# ------------------------------------------------------------------ common argument validation


@pytest.mark.parametrize(
    "kwargs,arg",
    [
        (dict(labels=np.zeros((4, 2), int)), "labels"),
        (dict(labels=np.array([0.0, 1.0, 1.0])), "labels"),
        (dict(labels=np.array([0, -1, 1])), "labels"),
        (dict(labels=np.array([], int)), "num_clients"),
        (dict(num_clients=0), "num_clients"),
        (dict(num_clients=-3), "num_clients"),
        (dict(num_clients=1001), "num_clients"),
        (dict(num_clients=2.0), "num_clients"),
        (dict(num_clients=True), "num_clients"),
        (dict(seed=-1), "seed"),
        (dict(seed=0.5), "seed"),
    ],
)
@pytest.mark.parametrize("name", ["iid", "dirichlet", "dirichlet_client", "classes", "gamma", "quantity"])
def test_invalid_common_arguments_raise_partition_error(name: str, kwargs: dict, arg: str) -> None:
    call = dict(labels=_balanced(), num_clients=5, seed=0)
    call.update(kwargs)
    with pytest.raises(PartitionError, match=arg):
        partition(name, call.pop("labels"), call.pop("num_clients"), seed=call.pop("seed"), **KNOBS)


# ------------------------------------------------------------------ reports and test splits


def test_label_histogram_shape_and_counts() -> None:
    labels = np.array([0, 1, 1, 2, 2, 2])
    hist = label_histogram(labels, [np.array([0, 1]), np.array([2, 3, 4, 5]), np.array([], int)])
    assert hist.dtype == np.int64
    np.testing.assert_array_equal(hist, [[1, 1, 0], [0, 1, 3], [0, 0, 0]])
    assert label_histogram(labels, [np.arange(6)], num_classes=5).shape == (1, 5)
    with pytest.raises(PartitionError, match="num_classes"):
        label_histogram(labels, [np.arange(6)], num_classes=2)
    with pytest.raises(PartitionError, match="outside"):
        label_histogram(labels, [np.array([6])])


class TestSplitLike:
    def _setup(self, seed: int = 0):
        train = _balanced(per_class=500, seed=seed)
        test = _balanced(per_class=100, seed=seed + 1)
        parts = _quiet(dirichlet, train, 10, alpha=0.3, seed=seed)
        return train, test, label_histogram(train, parts, 10)

    def test_disjoint_and_covers_held_classes(self) -> None:
        _, test, hist = self._setup()
        tparts = split_like(test, hist, seed=0)
        _assert_well_formed(tparts, 10)
        _assert_exact_cover(tparts, len(test))  # every class is held by someone

    def test_proportions_match_training_within_rounding(self) -> None:
        train, test, hist = self._setup()
        thist = label_histogram(test, split_like(test, hist, seed=0), 10)
        expected = hist / hist.sum(0, keepdims=True) * np.bincount(test)  # share of class c's test set
        assert np.abs(thist - expected).max() < 1.0
        assert np.all(thist[hist == 0] == 0)

    def test_unheld_classes_are_left_out(self) -> None:
        train = _balanced()
        parts = _quiet(classes, train, 2, classes_per_client=3, seed=0)
        hist = label_histogram(train, parts, 10)
        test = _balanced(num_classes=12, per_class=20)  # includes classes 10, 11 unseen in training
        tparts = split_like(test, hist, seed=0)
        held = np.flatnonzero(hist.sum(0) > 0)
        np.testing.assert_array_equal(np.sort(np.concatenate(tparts)), np.flatnonzero(np.isin(test, held)))

    def test_equal_shares_are_not_biased_to_low_client_ids(self) -> None:
        hist = np.ones((2, 50), dtype=np.int64)  # 50 classes, each held equally by 2 clients
        test = np.repeat(np.arange(50), 3)  # odd class sizes: one client gets the extra sample
        sizes = [len(p) for p in split_like(test, hist, seed=0)]
        assert sum(sizes) == 150 and abs(sizes[0] - sizes[1]) < 20

    def test_seeded(self) -> None:
        _, test, hist = self._setup()
        a, b, c = (split_like(test, hist, seed=s) for s in (0, 0, 1))
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
        assert not all(np.array_equal(x, y) for x, y in zip(a, c))

    def test_bad_hist_raises(self) -> None:
        with pytest.raises(PartitionError, match="train_hist"):
            split_like(np.arange(3), np.ones(3, int), seed=0)
        with pytest.raises(PartitionError, match="train_hist"):
            split_like(np.arange(3), -np.ones((2, 3), int), seed=0)


def test_describe_table_and_truncation() -> None:
    text = describe(np.array([[3, 0], [1, 2]]))
    lines = text.splitlines()
    assert lines[0].split() == ["client", "c0", "c1", "|", "n", "k"]
    assert lines[1].split() == ["0", "3", "0", "|", "3", "1"]
    assert lines[-1].split() == ["total", "4", "2", "|", "6", "2"]
    big = describe(np.ones((100, 50), dtype=np.int64), max_clients=5, max_classes=4)
    rows = big.splitlines()
    assert len(rows) == 1 + 5 + 1 + 1 and "..." in rows[0] and rows[-2].split()[0] == "..."
    assert rows[-1].split()[-2:] == ["5000", "50"]


# ------------------------------------------------------------------ property tests


@st.composite
def _valid_call(draw):
    num_classes = draw(st.integers(1, 8))
    labels = np.array(draw(st.lists(st.integers(0, num_classes - 1), min_size=1, max_size=150)), dtype=np.int64)
    n = len(labels)
    num_clients = draw(st.integers(1, min(n, 30)))
    present = len(np.unique(labels))
    params = dict(
        alpha=draw(st.floats(-4, 3).map(lambda e: 10.0**e)),
        classes_per_client=draw(st.integers(1, present)),
        gamma=draw(st.floats(0, 1)),
        min_size=draw(st.integers(0, n // num_clients)),
        max_retries=draw(st.integers(0, 3)),
        mode=draw(st.sampled_from(["random", "sequential", "ring"])),
    )
    name = draw(st.sampled_from(LABEL_PARTITIONS))
    return name, labels, num_clients, draw(st.integers(0, 2**32)), params


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_valid_call())
def test_property_valid_inputs_keep_invariants(call) -> None:
    name, labels, num_clients, seed, params = call
    parts = _quiet(partition, name, labels, num_clients, seed=seed, **params)
    _assert_well_formed(parts, num_clients)
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx), "a sample was given to two clients"
    if name == "classes":
        covered = np.zeros(len(labels), bool)
        covered[allidx] = True
        for c in np.unique(labels):  # a class is either fully handed out or dropped
            assert covered[labels == c].all() or not covered[labels == c].any()
        hist = label_histogram(labels, parts)
        assert np.all((hist > 0).sum(1) <= params["classes_per_client"])
        if num_clients * params["classes_per_client"] >= len(np.unique(labels)):
            _assert_exact_cover(parts, len(labels))
    else:
        _assert_exact_cover(parts, len(labels))
    if name in ("dirichlet", "quantity"):
        assert min(len(p) for p in parts) >= params["min_size"]


_CORRUPTIONS = [
    ("num_clients", 0), ("num_clients", -2), ("num_clients", "many"), ("num_clients", 1.5),
    ("num_clients", "too_many"), ("seed", -1), ("seed", 2.5), ("seed", "0"),
    ("labels", "2d"), ("labels", "negative"), ("labels", "float"), ("labels", "empty"),
    ("alpha", 0.0), ("alpha", -1.0), ("alpha", float("nan")), ("alpha", float("inf")), ("alpha", "x"),
    ("min_size", "impossible"), ("min_size", -1), ("min_size", 1.5),
    ("classes_per_client", 0), ("classes_per_client", "too_many"), ("classes_per_client", 1.5),
    ("mode", "bogus"), ("gamma", -0.01), ("gamma", 1.01), ("gamma", float("nan")),
    ("max_retries", -1),
]
# Which partitioners read which parameter (the corruption must reach the function to be tested).
_READS = {
    "alpha": {"dirichlet", "dirichlet_client", "quantity"}, "min_size": {"dirichlet", "quantity"}, "max_retries": {"dirichlet"},
    "classes_per_client": {"classes"}, "mode": {"classes"}, "gamma": {"gamma"},
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_valid_call(), st.sampled_from(_CORRUPTIONS), st.data())
def test_property_invalid_inputs_raise_partition_error(call, corruption, data) -> None:
    name, labels, num_clients, seed, params = call
    arg, bad = corruption
    if arg in _READS:
        name = data.draw(st.sampled_from(sorted(_READS[arg])))
    if arg == "num_clients":
        num_clients = len(labels) + 1 if bad == "too_many" else bad
    elif arg == "seed":
        seed = bad
    elif arg == "labels":
        labels = {"2d": labels.reshape(1, -1), "negative": labels - labels.max() - 1,
                  "float": labels + 0.5, "empty": labels[:0]}[bad]
    elif bad == "impossible":
        params[arg] = len(labels) // num_clients + 1
    elif bad == "too_many":
        params[arg] = len(np.unique(labels)) + 1
    else:
        params[arg] = bad
    with pytest.raises(PartitionError):
        _quiet(partition, name, labels, num_clients, seed=seed, **params)


def test_registry_instance() -> None:
    assert PARTITIONS.kind == "partition" and len(PARTITIONS) >= 5
