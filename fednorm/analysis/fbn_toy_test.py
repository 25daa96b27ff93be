"""FBN's 2-D toy against an independent computation of every scheme (plain tensor algebra, no
BatchNorm layer), and its exact special cases."""

from __future__ import annotations

import math

import pytest
import torch

from fednorm.analysis.fbn_toy import class_means, draw_round, error_table, run_toy

EPS = 1e-5
BETA = 0.1


def _norm(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    return (x - mean) / torch.sqrt(var + EPS)


def _reference(gamma: float, rounds: int, switch: int, seed: int, n: int = 10, m: int = 30) -> dict[str, list[float]]:
    """Every scheme by hand: batch statistics are biased (1/K), running variances take the
    unbiased one (K/(K−1)); FBN's shared statistics are centralized BN's running statistics (FBN
    App. A, F3), FixBN's the mean of the clients' running statistics, frozen after ``switch``."""
    gen = torch.Generator().manual_seed(seed)
    means = class_means(n)
    c_mean, c_var = torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)  # centralized running = FBN shared
    f_mean, f_var = c_mean.clone(), c_var.clone()  # FixBN's averaged running statistics
    errors: dict[str, list[float]] = {"fbn": [], "fixbn": [], "naive": []}
    for r in range(1, rounds + 1):
        x, _ = draw_round(gen, gamma, means, m)
        union = x.reshape(-1, 2)
        u_mean, u_var = union.mean(0), union.var(0, unbiased=False)
        ref = _norm(x, u_mean, u_var)
        l_mean, l_var = x.mean(1, keepdim=True), x.var(1, unbiased=False, keepdim=True)
        naive = _norm(x, l_mean, l_var)
        fbn = _norm(x, c_mean, c_var)
        fix = naive if r <= switch else _norm(x, f_mean, f_var)
        if r <= switch:
            f_mean = ((1 - BETA) * f_mean + BETA * l_mean.squeeze(1)).mean(0)
            f_var = ((1 - BETA) * f_var + BETA * l_var.squeeze(1) * m / (m - 1)).mean(0)
        big_k = n * m
        c_mean, c_var = (1 - BETA) * c_mean + BETA * u_mean, (1 - BETA) * c_var + BETA * u_var * big_k / (big_k - 1)
        for key, z in (("fbn", fbn), ("fixbn", fix), ("naive", naive)):
            errors[key].append(float((z - ref).norm(dim=-1).mean()))
    return errors


@pytest.mark.parametrize("gamma", [0.0, 0.3, 1.0])
def test_every_scheme_matches_the_independent_computation(gamma: float) -> None:
    rounds, switch = 12, 5
    result = run_toy(gamma, rounds=rounds, switch_round=switch, seed=4)
    expected = _reference(gamma, rounds, switch, seed=4)
    for key in ("fbn", "fixbn", "naive"):
        assert result.errors[key] == pytest.approx(expected[key], rel=1e-9, abs=1e-12), key


def test_fbn_shared_statistics_equal_centralized_running_statistics() -> None:
    result = run_toy(0.0, rounds=30, seed=1)
    fbn_mean, fbn_var = result.running["fbn"]
    c_mean, c_var = result.running["centralized"]
    assert fbn_mean == pytest.approx(c_mean, abs=1e-12) and fbn_var == pytest.approx(c_var, rel=1e-12)
    # at γ = 0 the union's variance per coordinate is 10²/2 + 1 = 51; FixBN's averaged one is the within-client 1
    assert all(30 < v < 60 for v in c_var) and all(0.5 < v < 1.5 for v in result.running["fixbn"][1])


def test_one_client_naive_and_fixbn_before_the_switch_are_centralized_bn() -> None:
    result = run_toy(0.0, rounds=6, num_clients=1, switch_round=6, seed=2)
    assert max(result.errors["naive"]) == 0.0 and max(result.errors["fixbn"]) == 0.0
    assert result.errors["fbn"][0] > 0  # FBN normalises with the (0, 1) initial statistics in round 1


def test_gamma_similarity_draw_and_means() -> None:
    means = class_means(10)
    assert torch.allclose(means.norm(dim=1), torch.full((10,), 10.0, dtype=torch.float64))
    assert torch.allclose(means[0], torch.tensor([10.0, 0.0], dtype=torch.float64))
    gen = torch.Generator().manual_seed(0)
    _, cls = draw_round(gen, 0.0, means, points=50)
    assert torch.equal(cls, torch.arange(10).unsqueeze(1).expand(10, 50))  # γ = 0: one class per client
    _, cls = draw_round(gen, 1.0, means, points=2000)
    own = (cls == torch.arange(10).unsqueeze(1)).double().mean().item()
    assert own == pytest.approx(0.1, abs=0.02)  # γ = 1: uniformly random classes


def test_error_table_reports_seeds_and_the_heterogeneity_ordering() -> None:
    table = error_table([1.0, 0.0], seeds=[0, 1], rounds=100)  # the paper's 100: FBN's warm-up from (0, 1) fades
    low, high = table["rows"]
    assert len(low["fbn"]["per_seed"]) == 2 and low["fbn"]["std"] >= 0
    # at γ = 0 naive BN and FixBN are far from centralized, FBN close (the paper's Fig. 2c)
    assert high["naive"]["mean"] > 5 * high["fbn"]["mean"] and high["fixbn"]["mean"] > high["naive"]["mean"]
    assert math.isclose(low["fbn"]["mean"], sum(low["fbn"]["per_seed"]) / 2)
