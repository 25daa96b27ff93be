"""The two-client Gaussian task of FedBN's Appendix F: the draws have the specified moments, the
labels follow the rule, the draw is seeded, and the federation gives each client one source."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fednorm.data import build_federated_data, dataset_to_tensors, load_dataset
from fednorm.data.gaussians import DIM, bayes_accuracy, covariances, generate_gaussians


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def test_covariances_are_the_specified_ones() -> None:
    s1, s2 = covariances(0.5)
    assert np.array_equal(s1, np.eye(DIM))  # Appendix F: Σ1 is the identity
    assert np.allclose(np.diag(s2), 1.0) and np.allclose(s2[~np.eye(DIM, dtype=bool)], 0.5)  # our Σ2
    assert np.all(np.linalg.eigvalsh(s2) > 0)
    assert np.array_equal(covariances(0.0)[1], np.eye(DIM))  # rho = 0: no feature shift
    with pytest.raises(ValueError, match="rho"):
        covariances(-0.2)  # below -1/9: not positive definite


@pytest.mark.parametrize("source", [0, 1])
def test_large_draw_has_the_specified_means_and_covariances(source: int) -> None:
    n = 40_000
    x, y, d = generate_gaussians(train=True, per_class=n, seed=7)
    x = x.reshape(len(x), DIM).astype(np.float64)
    sigma = covariances(0.5)[source]
    for label, mean in ((0, -1.0), (1, 1.0)):
        xs = x[(d == source) & (y == label)]
        assert len(xs) == n
        # each coordinate's mean has standard error 1/sqrt(n) = 0.005
        assert np.allclose(xs.mean(0), mean, atol=0.025)
        # each covariance entry has standard error at most sqrt(2/n) = 0.007
        assert np.allclose(np.cov(xs, rowvar=False), sigma, atol=0.04)


def test_labels_follow_the_rule_at_the_bayes_rate() -> None:
    """1 is an eigenvector of both covariances, so sign(1ᵀx) is the Bayes classifier of each source;
    its accuracy on a large draw is Φ(d/2) with d² = Δᵀ Σ⁻¹ Δ, here worked out by hand:
    d² = 4·10 for Σ1 = I and 4·10/(1 + 9·0.5) for Σ2."""
    n = 100_000
    x, y, d = generate_gaussians(train=False, per_class=n, seed=3)
    predicted = (x.reshape(len(x), DIM).sum(1) > 0).astype(np.int64)
    for source, d2 in ((0, 40.0), (1, 40.0 / 5.5)):
        expected = _phi(math.sqrt(d2) / 2)
        acc = float((predicted[d == source] == y[d == source]).mean())
        se = math.sqrt(expected * (1 - expected) / (2 * n))
        assert abs(acc - expected) < 4 * se + 1e-4
        assert bayes_accuracy(covariances(0.5)[source]) == pytest.approx(expected, rel=1e-12)
    assert np.array_equal(np.bincount(y[d == 0]), [n, n]) and np.array_equal(np.bincount(y[d == 1]), [n, n])


def test_draw_is_seeded_and_splits_are_independent() -> None:
    a = generate_gaussians(train=True, per_class=50, seed=1)
    b = generate_gaussians(train=True, per_class=50, seed=1)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert not np.array_equal(a[0], generate_gaussians(train=True, per_class=50, seed=2)[0])
    assert not np.array_equal(a[0], generate_gaussians(train=False, per_class=50, seed=1)[0])
    assert a[0].dtype == np.float32 and a[0].shape == (200, 1, 1, DIM)


def test_dataset_and_federation_give_each_client_one_source_unstandardised() -> None:
    ds = load_dataset("gaussians", train=True, train_per_class=30, rho=0.3)
    assert ds.domain_sizes() == {"diagonal": 60, "full": 60} and ds.data.dtype == np.float32
    x, _ = dataset_to_tensors(ds)
    assert torch.equal(x.flatten(1), torch.from_numpy(ds.data.reshape(len(ds), DIM)))  # mean 0, std 1: raw values
    x2, _ = dataset_to_tensors(ds, mean=[1.0] * DIM, std=[2.0] * DIM)
    assert torch.allclose(x2, (x - 1.0) / 2.0)
    data = build_federated_data("gaussians", num_clients=2, partition_name="domains", seed=1,
                                dataset_args={"train_per_class": 30, "test_per_class": 10})
    assert data.client_domain == [0, 1]
    for k in range(2):
        assert len(data.client_train[k]) == 60 and len(data.client_test[k]) == 20
        assert bool((data.test_domain[data.client_test[k]] == k).all())
    with pytest.raises(ValueError, match="train_per_class"):
        load_dataset("gaussians", train_per_class=0)
