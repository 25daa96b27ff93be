"""FedBN's cos-regression toy against direct sums, the population loss in closed form and finite
differences, and Figs. 1-2's claims as properties under both readings of the label."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fednorm.analysis.fedbn_toy import (
    CLIENT_STDS,
    NOISE_STD,
    W_GRID,
    W_TRUE,
    basin,
    claims,
    client_table,
    curvature,
    draw_clients,
    error,
    main,
)

WS = W_GRID[::4]  # step 0.004: fast enough for the claim tests


def _population_error(w: float, a: float, sigma: float, noise: float) -> float:
    """``E(cos(a·x) + ε − cos(w·x))²`` for ``x ~ N(0, σ²)``, from ``E cos(c·x) = exp(−c²σ²/2)``."""
    e = lambda c: math.exp(-c * c * sigma * sigma / 2)  # noqa: E731
    return 1 + e(2 * a) / 2 + e(2 * w) / 2 - e(a - w) - e(a + w) + noise**2


def test_error_at_a_point_is_the_direct_sum() -> None:
    data = draw_clients(3, "literal", points=50)
    x, y = data.x[1], data.y[1]
    for w, g in ((0.5, 1.0), (3.7, 2.2), (11.0, 0.3)):
        direct = sum((y[i] - math.cos(w * x[i] / g)) ** 2 for i in range(len(x))) / len(x)
        assert float(error(x, y, w, g)) == pytest.approx(direct, rel=1e-12)


def test_without_bn_the_surface_is_f_w_and_it_depends_on_w_over_gamma_only() -> None:
    data = draw_clients(0, "feature_shift", points=200)
    x, y = data.x[0], data.y[0]
    ws = np.array([0.001, 1.0, 2.5, 7.0])
    np.testing.assert_allclose(error(x, y, ws), [np.mean((y - np.cos(w * x)) ** 2) for w in ws], rtol=1e-12)
    np.testing.assert_allclose(error(x, y, 3 * ws, 3.0), error(x, y, ws, 1.0), rtol=1e-10)
    grid = error(x, y, ws[None, :], np.array([1.0, 2.0])[:, None])
    assert grid.shape == (2, 4) and np.allclose(grid[1], error(x, y, ws, 2.0))


@pytest.mark.parametrize("reading", ["feature_shift", "literal"])
def test_large_sample_error_curve_matches_the_population_loss(reading: str) -> None:
    data = draw_clients(1, reading, points=200_000)
    for k, sigma in enumerate(CLIENT_STDS):
        a = W_TRUE / sigma if reading == "feature_shift" else W_TRUE  # the label's frequency in x
        for w in (0.3, a, 1.5, 4.0):
            assert float(error(data.x[k], data.y[k], w)) == pytest.approx(_population_error(w, a, sigma, NOISE_STD), abs=0.01)


def test_curvature_is_the_second_difference() -> None:
    data = draw_clients(2, "literal")
    x, y, h = data.x[1], data.y[1], 1e-4
    for w, g in ((2.0, 1.0), (5.0, 2.5), (0.7, 0.8)):
        fd = (error(x, y, w + h, g) - 2 * error(x, y, w, g) + error(x, y, w - h, g)) / h**2
        assert curvature(x, y, w, g) == pytest.approx(float(fd), rel=1e-4)


def test_basin_is_the_connected_interval_below_the_threshold() -> None:
    ws = np.arange(10.0)
    curve = np.array([0.1, 0.9, 0.2, 0.1, 0.05, 0.2, 0.3, 0.1, 0.9, 0.0])
    assert basin(ws, curve, 0.25) == {"w_min": 9.0, "error_min": 0.0, "left": 9.0, "right": 9.0, "width": 0.0}
    assert basin(ws[:9], curve[:9], 0.25) == {"w_min": 4.0, "error_min": 0.05, "left": 2.0, "right": 5.0, "width": 3.0}
    assert basin(ws[:9], curve[:9] + 1, 0.25)["width"] == 0.0  # nowhere low


@pytest.mark.parametrize("seed", [0, 7])
def test_minimisers_sit_where_theory_puts_them(seed: int) -> None:
    for reading in ("feature_shift", "literal"):
        data = draw_clients(seed, reading)
        table = client_table(data, WS)
        for k, (sigma, gamma) in enumerate(zip(CLIENT_STDS, data.gammas)):
            # cos(w·x/γ) fits cos(w_true·t) when w/γ is w_true/σ (feature shift, t = x/σ) or w_true (literal, t = x)
            ratio = W_TRUE / sigma if reading == "feature_shift" else W_TRUE
            assert table["no_bn"][k]["w_min"] == pytest.approx(ratio, abs=0.02)
            assert table["bn"][k]["w_min"] == pytest.approx(ratio * gamma, abs=0.02 * gamma)


def test_the_paper_claims_hold_under_the_feature_shift_reading() -> None:
    for seed in (0, 1):
        data = draw_clients(seed, "feature_shift")
        c = claims(data, client_table(data, WS))
        # Fig. 1: BN brings the minimisers together and evens the curvature; the averaged model fits both clients only with BN
        assert c["no_bn"]["minimiser_gap"] > 1.0 and c["bn"]["minimiser_gap"] < 0.05
        assert c["no_bn"]["curvature_ratio"] > 5 and 0.7 < c["bn"]["curvature_ratio"] < 1.4
        assert c["no_bn"]["basin_width_ratio"] < 0.5 and 0.8 < c["bn"]["basin_width_ratio"] < 1.25
        assert max(c["no_bn"]["averaged_model_error"]) > 0.5 and max(c["bn"]["averaged_model_error"]) < 0.05
        # Fig. 2: averaging w and γ is bad; the averaged w with client 1's own γ is good
        assert c["fig2"]["error_averaged_w_and_gamma"] > 10 * c["fig2"]["error_averaged_w_local_gamma"]


def test_the_literal_reading_inverts_the_minimiser_claims() -> None:
    data = draw_clients(0, "literal")
    c = claims(data, client_table(data, WS))
    assert c["no_bn"]["minimiser_gap"] < 0.05 and c["bn"]["minimiser_gap"] > 3  # BN moves them apart (w_true·σ_k)
    assert max(c["no_bn"]["averaged_model_error"]) < 0.05 and min(c["bn"]["averaged_model_error"]) > 0.5
    assert c["fig2"]["error_averaged_w_local_gamma"] > 10 * c["fig2"]["error_averaged_w_and_gamma"]
    assert 0.7 < c["bn"]["curvature_ratio"] < 1.4 < 5 < c["no_bn"]["curvature_ratio"]  # the conditioning claim holds either way


def test_command_writes_the_records(tmp_path) -> None:
    assert main(["--out", str(tmp_path), "--seeds", "2", "--no-plot"]) == 0
    table = json.loads((tmp_path / "fedbn_toy.json").read_text())
    assert set(table["readings"]) == {"feature_shift", "literal"} and table["seeds"] == [0, 1]
    row = table["readings"]["feature_shift"]["rows"]["minimiser gap |w1* − w2*|, BN"]
    data = draw_clients(1, "feature_shift")
    assert row["per_seed"][1] == pytest.approx(claims(data, client_table(data))["bn"]["minimiser_gap"], abs=1e-12)
    assert "| curvature ratio, BN |" in (tmp_path / "fedbn_toy.md").read_text()
