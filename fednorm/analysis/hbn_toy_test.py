"""HBN's two-cluster toy against numpy's statistics and Eq. 9's closed form, and the figure's claim as properties."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fednorm.analysis.hbn_toy import CLUSTERS, EPS, cluster_report, draw_clusters, global_statistics, main, normalise


def _np(points):
    return [x.numpy() for x in points]


def test_draw_matches_the_spec_clusters() -> None:
    a, b = draw_clusters(0)
    assert a.shape == (300, 2) and b.shape == (200, 2)
    assert np.allclose(a.mean(0).numpy(), 5.0, atol=0.1) and np.allclose(b.mean(0).numpy(), -1.0, atol=0.3)
    assert np.allclose(a.std(0).numpy(), 0.4, atol=0.06) and np.allclose(b.std(0).numpy(), 1.2, atol=0.2)


def test_global_statistics_are_the_union_mean_and_bessel_variance() -> None:
    points = draw_clusters(3)
    mean, var = global_statistics(points)
    union = np.concatenate(_np(points))
    np.testing.assert_allclose(mean.numpy(), union.mean(0), rtol=1e-12)
    np.testing.assert_allclose(var.numpy(), union.var(0, ddof=1), rtol=1e-12)  # Eq. 8: N − 1


@pytest.mark.parametrize("seed", [0, 5])
def test_every_scheme_equals_its_closed_form(seed: int) -> None:
    points = draw_clusters(seed)
    union = np.concatenate(_np(points))
    g_mean, g_var = union.mean(0), union.var(0, ddof=1)
    for scheme in ("local", "global", "hybrid"):
        for x, out, c in zip(_np(points), normalise(points, scheme), CLUSTERS):
            b_mean, b_var = x.mean(0), x.var(0)  # batch statistics: biased (Eq. 1)
            w = {"local": 1.0, "global": 0.0, "hybrid": c.batch_weight}[scheme]
            mu, var = w * b_mean + (1 - w) * g_mean, w * b_var + (1 - w) * g_var  # Eq. 9
            np.testing.assert_allclose(out.numpy(), (x - mu) / np.sqrt(var + EPS), rtol=1e-10, atol=1e-12)


def test_local_normalisation_is_zero_mean_unit_variance_per_cluster() -> None:
    points = draw_clusters(1)
    for x, out in zip(_np(points), _np(normalise(points, "local"))):
        assert np.abs(out.mean(0)).max() < 1e-12
        np.testing.assert_allclose(out.var(0), x.var(0) / (x.var(0) + EPS), rtol=1e-12)


def test_global_normalisation_keeps_the_size_ratio_per_coordinate() -> None:
    points = draw_clusters(2)
    raw = [x.std(0) for x in _np(points)]
    out = [x.std(0) for x in _np(normalise(points, "global"))]
    np.testing.assert_allclose(out[1] / out[0], raw[1] / raw[0], rtol=1e-12)  # one affine map for both clusters


@pytest.mark.parametrize("seed", range(4))
def test_the_figure_claim_hybrid_evens_the_sizes_and_keeps_the_clusters_apart(seed: int) -> None:
    points = draw_clusters(seed)
    local, glob, hybrid = (cluster_report(normalise(points, s)) for s in ("local", "global", "hybrid"))
    assert local["centre_distance"] < 1e-12 and local["size_ratio"] == pytest.approx(1.0, abs=1e-4)  # overlap (Fig. 2b)
    assert glob["size_ratio"] > 2.5 and glob["separation"] > 7  # apart, unequal sizes (Fig. 2c)
    assert 1.5 < hybrid["size_ratio"] < glob["size_ratio"] - 0.5  # sizes evened out (Fig. 2d) ...
    assert hybrid["separation"] > 4 and hybrid["order_kept"]  # ... while the global structure stays


def test_command_writes_the_records(tmp_path) -> None:
    assert main(["--out", str(tmp_path), "--seeds", "2", "--no-plot"]) == 0
    table = json.loads((tmp_path / "hbn_toy.json").read_text())
    rows = {r["scheme"]: r for r in table["rows"]}
    assert set(rows) == {"raw", "local", "global", "hybrid"} and table["seeds"] == [0, 1]
    assert rows["hybrid"]["size_ratio"]["per_seed"] == [cluster_report(normalise(draw_clusters(s), "hybrid"))["size_ratio"] for s in (0, 1)]
    assert "| hybrid |" in (tmp_path / "hbn_toy.md").read_text()
