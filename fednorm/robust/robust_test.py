"""Robust aggregators and attacks against direct (numpy/scipy/loop) computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import torch

from fednorm.errors import ConfigError
from fednorm.methods import get_method
from fednorm.methods.base import ClientUpdates
from fednorm.robust import alie, alie_zmax, foe, get_aggregator, get_attack, median, nnm, sign_flip, trimmed_mean


def _rows(k=7, d=5, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).normal(size=(k, d)))


@pytest.mark.parametrize("k", [1, 2, 5, 6])
def test_median_is_numpy_median(k):
    x = _rows(k)
    np.testing.assert_allclose(median(x).numpy(), np.median(x.numpy(), axis=0), rtol=0, atol=1e-15)


@pytest.mark.parametrize("k,f", [(7, 0), (7, 2), (10, 3), (9, 4)])
def test_trimmed_mean_is_scipy_trim_mean(k, f):
    x = _rows(k)
    np.testing.assert_allclose(trimmed_mean(x, f=f).numpy(), scipy.stats.trim_mean(x.numpy(), f / k, axis=0), rtol=0, atol=1e-14)


def test_nnm_is_the_mean_of_each_rows_nearest_neighbours():
    x = _rows(8, 3, seed=1)
    f = 3
    xs = x.numpy()
    expected = []
    for i in range(8):
        d = [np.linalg.norm(xs[i] - xs[j]) for j in range(8)]
        nearest = sorted(range(8), key=lambda j: d[j])[: 8 - f]
        expected.append(xs[nearest].mean(0))
    np.testing.assert_allclose(nnm(x, f).numpy(), np.array(expected), rtol=0, atol=1e-14)


@pytest.mark.parametrize("rule,use_nnm", [("median", False), ("trimmed_mean", False), ("median", True), ("trimmed_mean", True)])
def test_tolerates_f_below_half_arbitrary_outliers(rule, use_nnm):
    """f < n/2 rows set to arbitrary huge values: the aggregate stays in the honest range."""
    n, f = 10, 4
    honest = _rows(n - f, 6, seed=2)
    bad = torch.full((f, 6), 1e9)
    bad[1] = -1e9
    bad[2, :3] = 7e8
    agg = get_aggregator(rule, f=f, nnm=use_nnm)(torch.cat([bad[:2], honest, bad[2:]]))
    assert (agg >= honest.min(0).values - 1e-12).all() and (agg <= honest.max(0).values + 1e-12).all()
    assert not (get_aggregator("mean")(torch.cat([honest, bad])) <= honest.max(0).values).all()


def test_nnm_median_is_the_honest_mean_whatever_a_far_attack_sends():
    """When every Byzantine row is farther from each honest row than any two honest rows are from
    each other, NNM mixes every honest row into the honest mean, and the median of n values of which
    n - f > n/2 are equal is that mean: the aggregate ignores the attack's magnitude. So FBN's
    robust rows under sign flip and FOE (both far on the statistics) ran bit for bit alike
    (REPRODUCTION.md section 2); ALIE, inside the honest spread, is not ignored."""
    n, f = 10, 3
    honest = _rows(n - f, 6, seed=4) + 5.0  # one sign per coordinate, as a channel's mean is
    outputs = {}
    for name, attack in (("sign_flip", sign_flip), ("foe", foe), ("alie", lambda h: alie(h, tau=None, num_byzantine=f))):
        bad = attack(honest).expand(f, -1)
        outputs[name] = get_aggregator("median", f=f, nnm=True)(torch.cat([honest[:4], bad, honest[4:]]))
    torch.testing.assert_close(outputs["sign_flip"], honest.mean(0), rtol=0, atol=1e-14)
    torch.testing.assert_close(outputs["foe"], honest.mean(0), rtol=0, atol=1e-14)
    assert (outputs["alie"] - honest.mean(0)).abs().max() > 1e-3


def test_mean_aggregator_is_the_weighted_mean_and_is_flagged():
    x, w = _rows(4), torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    agg = get_aggregator("mean")
    assert agg.is_mean and not get_aggregator("mean", nnm=True).is_mean
    torch.testing.assert_close(agg(x, w), (x * w[:, None]).sum(0) / 10, rtol=0, atol=1e-15)
    with pytest.raises(ConfigError, match="Did you mean"):
        get_aggregator("medain")


def test_attacks_produce_the_documented_vectors():
    h = _rows(7, 4, seed=3)
    hn = h.numpy()
    np.testing.assert_allclose(sign_flip(h).numpy(), -hn.mean(0), atol=1e-15)
    np.testing.assert_allclose(foe(h).numpy(), -2 * hn.mean(0), atol=1e-14)  # τ = 3
    np.testing.assert_allclose(foe(h, tau=0.5).numpy(), 0.5 * hn.mean(0), atol=1e-15)
    np.testing.assert_allclose(alie(h).numpy(), hn.mean(0) + 1.5 * hn.std(0, ddof=1), atol=1e-14)
    # Baruch et al.: n = 10, f = 3 -> s = 3, z = Φ^-1(0.7) ≈ 0.5244 (Baruch et al., 2019)
    assert alie_zmax(10, 3) == pytest.approx(0.5244, abs=1e-4)
    np.testing.assert_allclose(alie(h, tau=None, num_byzantine=3).numpy(), hn.mean(0) + alie_zmax(10, 3) * hn.std(0, ddof=1), atol=1e-14)


def _updates(method, glob, k=4):
    torch.manual_seed(0)
    states = {}
    for key in method.shared_keys:
        ref = glob[key]
        states[key] = torch.randn(k, *ref.shape, dtype=torch.float64) if ref.is_floating_point() else torch.full((k, *ref.shape), 5, dtype=ref.dtype)
    return ClientUpdates(list(range(k)), states, torch.tensor([10.0, 20, 30, 40], dtype=torch.float64), torch.zeros(k, dtype=torch.float64),
                         torch.ones(k, dtype=torch.int64))


@pytest.mark.parametrize("targets", ["stats", "updates", "both"])
def test_attack_appends_byzantine_rows_on_its_targets(targets):
    """SF on statistics: running means become −mean(honest); on updates: θ − mean(θ_i − θ)."""
    net = torch.nn.Sequential(torch.nn.Linear(2, 3).double(), torch.nn.BatchNorm1d(3).double())
    method = get_method("fedavg")
    method.setup(net)
    glob = {k: v.clone() for k, v in net.state_dict().items()}
    up = _updates(method, glob)
    out = get_attack("sign_flip", 2, targets, first_id=100)(up, glob, method)
    assert out.client_ids == [0, 1, 2, 3, 100, 101]
    for key, honest in up.states.items():
        assert torch.equal(out.states[key][:4], honest)
        byz = out.states[key][4:]
        if not honest.is_floating_point():
            expected = honest.max(0).values
        elif key == "1.running_mean" and targets != "updates":
            expected = -honest.mean(0)
        elif not key.endswith(("running_mean", "running_var")) and targets != "stats":
            expected = glob[key] - (honest - glob[key]).mean(0)
        else:
            expected = honest.mean(0)
        torch.testing.assert_close(byz, expected.expand_as(byz), rtol=0, atol=1e-14)
    assert torch.equal(out.num_examples[4:], torch.tensor([25.0, 25.0], dtype=torch.float64))
    assert torch.isnan(out.train_loss[4:]).all()


def test_attack_on_variances_is_optional_and_clamped():
    net = torch.nn.Sequential(torch.nn.BatchNorm1d(3).double())
    method = get_method("fedavg")
    method.setup(net)
    glob = {k: v.clone() for k, v in net.state_dict().items()}
    up = _updates(method, glob)
    up.states["0.running_var"] = up.states["0.running_var"].abs()
    plain = get_attack("foe", 1, "stats")(up, glob, method)
    torch.testing.assert_close(plain.states["0.running_var"][4], up.states["0.running_var"].mean(0))
    attacked = get_attack("foe", 1, "stats", {"variance": True})(up, glob, method)
    assert torch.equal(attacked.states["0.running_var"][4], torch.zeros(3, dtype=torch.float64))  # −2·mean < 0, clamped
    with pytest.raises(ConfigError, match="attack_args"):
        get_attack("sign_flip", 1, "stats", {"tau": 2})
    assert get_attack("none", 0) is None
    assert math.isfinite(alie_zmax(7, 2))
