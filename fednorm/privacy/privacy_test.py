"""Client-level DP: the noise scale, clipping bounds, the accountant against Opacus called
directly, equivalences and refusals."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fednorm.config import load_config
from fednorm.errors import ConfigError
from fednorm.methods.base import ClientUpdates
from fednorm.methods.fedavg import FedAvg
from fednorm.privacy import PUBLIC_COUNT, ClientLevelDP


def _method() -> tuple[FedAvg, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).double()
    method = FedAvg()
    method.setup(model)
    return method, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _updates(global_state: dict[str, torch.Tensor], k: int, scale: float, seed: int = 0) -> ClientUpdates:
    g = torch.Generator().manual_seed(seed)
    states = {key: (v.expand(k, *v.shape).clone() if not v.is_floating_point()
                    else v + scale * torch.randn(k, *v.shape, generator=g, dtype=v.dtype)) for key, v in global_state.items()}
    states["1.num_batches_tracked"] += 7
    return ClientUpdates(list(range(k)), states, torch.arange(1.0, k + 1, dtype=torch.float64),
                         torch.zeros(k), torch.ones(k))


def _update_keys() -> list[str]:
    return ["0.weight", "0.bias", "1.weight", "1.bias"]


def test_noise_std_is_sigma_times_clip_and_sigma_times_statistics_sensitivity() -> None:
    method, glob = _method()
    sigma, clip, bound = 0.5, 2.0, 3.0
    dp = ClientLevelDP(sigma, clip, bound, seed=1)
    ups = _updates(glob, 4000, scale=0.0)  # no update: what arrives is the noise alone
    for k in ("1.running_mean", "1.running_var"):
        ups.states[k].zero_()
    out = dp(ups, glob, method, server_round=1)
    noise = torch.cat([(out.states[k] - glob[k]).reshape(len(ups), -1) for k in _update_keys()], dim=1)
    assert abs(float(noise.std()) / (sigma * clip) - 1) < 0.02 and abs(float(noise.mean())) < 0.01
    # statistics: 4 means and 4 variances, activations bounded by B: S = sqrt(4 B^2 + 4 B^4)
    s = math.sqrt(4 * bound**2 + 4 * bound**4)
    means = out.states["1.running_mean"]
    assert abs(float(means.std()) / (sigma * s) - 1) < 0.02
    assert dp.noise_multiplier == pytest.approx(sigma / math.sqrt(2))


def test_clipping_bounds_every_upload_and_leaves_small_ones_exact() -> None:
    method, glob = _method()
    dp = ClientLevelDP(0.0, 1.0, 2.0)
    ups = _updates(glob, 50, scale=3.0)
    out = dp(ups, glob, method, server_round=1)
    for row in range(len(ups)):
        delta = torch.cat([(out.states[k][row] - glob[k]).reshape(-1) for k in _update_keys()])
        assert float(delta.norm()) <= 1.0 + 1e-12
        assert float(out.states["1.running_mean"][row].abs().max()) <= 2.0
        assert 0 <= float(out.states["1.running_var"][row].min()) and float(out.states["1.running_var"][row].max()) <= 4.0
    assert torch.equal(out.states["1.num_batches_tracked"], glob["1.num_batches_tracked"].expand(50))  # no size leak
    assert torch.equal(out.num_examples, torch.ones(50, dtype=torch.float64))  # uniform weights
    small = _updates(glob, 5, scale=1e-3)
    kept = dp(small, glob, method, server_round=1)
    for k in _update_keys():
        torch.testing.assert_close(kept.states[k], small.states[k], rtol=0, atol=1e-15)


def test_epsilon_equals_opacus_rdp_called_directly() -> None:
    pytest.importorskip("opacus")
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    from fednorm.api import run

    sigma, delta = 1.3, 1e-5
    res = run(dict(method="fedavg", norm="bn", num_clients=3, rounds=3, local_steps=1, dp_clip=1.0, dp_noise=sigma,
                   dp_delta=delta, threads=1), write=False, progress=False)
    orders = RDPAccountant.DEFAULT_ALPHAS
    for h in res.history:  # every client uploads weights and statistics each round: multiplier sigma/sqrt(2)
        rdp = compute_rdp(q=1.0, noise_multiplier=sigma / math.sqrt(2), steps=h["round"], orders=orders)
        eps, _ = get_privacy_spent(orders=orders, rdp=rdp, delta=delta)
        assert h["dp/epsilon"] == pytest.approx(float(eps), rel=1e-12)
    # HBN: 3 round uploads (weights + statistics) and 4 statistics-only answers (the initial pass
    # and one evaluation re-sync per round) compose.
    res = run(dict(method="hbn", norm="hbn", num_clients=3, rounds=3, local_steps=1, dp_clip=1.0, dp_noise=sigma,
                   dp_delta=delta, threads=1), write=False, progress=False)
    rdp = compute_rdp(q=1.0, noise_multiplier=sigma / math.sqrt(2), steps=3, orders=orders) + \
        compute_rdp(q=1.0, noise_multiplier=sigma, steps=4, orders=orders)
    eps, _ = get_privacy_spent(orders=orders, rdp=rdp, delta=delta)
    assert res.history[-1]["dp/epsilon"] == pytest.approx(float(eps), rel=1e-12)


def test_without_noise_and_with_loose_bounds_dp_is_uniform_fedavg() -> None:
    from fednorm.api import run

    common = dict(method="fedavg", norm="bn", num_clients=3, rounds=2, local_steps=2, threads=1, dtype="float64")
    plain = run(dict(common, method_args={"weighting": "uniform"}), write=False, progress=False).simulation.global_state
    dp = run(dict(common, dp_clip=1e9, dp_stats_bound=1e6), write=False, progress=False).simulation.global_state
    for k, v in plain.items():
        if v.is_floating_point():
            torch.testing.assert_close(dp[k], v, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method, norm, why", [("fedtan", "bn", "layer-wise exchanges"), ("fbn", "fbn", "counts")])
def test_methods_outside_the_mechanism_are_refused(method: str, norm: str, why: str) -> None:
    from fednorm.engine.simulator import Simulation

    with pytest.raises(ConfigError, match=why):
        Simulation(load_config(overrides=dict(method=method, norm=norm, num_clients=2, rounds=1, dp_clip=1.0)))


def test_noise_needs_a_clip() -> None:
    with pytest.raises(ConfigError, match="dp_noise needs dp_clip"):
        load_config(overrides={"dp_noise": 1.0})


def test_hbn_statistics_answers_are_bounded_and_carry_a_public_count() -> None:
    dp = ClientLevelDP(0.0, 1.0, 2.0)
    answers = {0: {"hbn.l.count": torch.tensor(17.0, dtype=torch.float64), "hbn.l.mean": torch.tensor([5.0, -1.0], dtype=torch.float64),
                   "hbn.l.var": torch.tensor([9.0, 0.5], dtype=torch.float64)}}
    out = dp.privatize_answers(answers, 1, "statistics")[0]
    assert out["hbn.l.count"].item() == PUBLIC_COUNT
    assert out["hbn.l.mean"].tolist() == [2.0, -1.0] and out["hbn.l.var"].tolist() == [4.0, 0.5]
    assert dp.queries == {0: 1}
