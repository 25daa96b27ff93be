"""Tests for fednorm.analysis against direct numpy computations, and ``fednorm analyze`` end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fednorm.analysis import (
    collapse_report,
    effective_rank,
    extract_features,
    local_overfitting,
    norm_report,
    per_class_accuracy,
    pick_one_class_client,
    sample_per_class,
    toggle_feature_norm,
)
from fednorm.cli.main import main
from fednorm.models import get_model
from fednorm.nn import FeatureNormClassifier

DT = torch.float64


def tiny(norm: str = "none", seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return get_model("ln_cnn", num_classes=4, in_channels=1, input_size=8, norm=norm).to(DT)


def batch(seed: int, n: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 8, 8, generator=g, dtype=DT), torch.arange(n) % 4


def test_norm_report_matches_numpy() -> None:
    model = tiny()
    x, y = batch(0)
    rep = norm_report(model, x, y, num_classes=5)  # class 4 has no samples
    with torch.no_grad():
        h = model.forward_features(x).numpy()
    yn = y.numpy()
    for c in range(4):
        assert rep["feature_norm"][c] == pytest.approx(np.linalg.norm(h[yn == c], axis=1).mean(), rel=1e-12)
    assert rep["feature_norm"][4] is None
    w = model.head.weight.detach().numpy()
    np.testing.assert_allclose(rep["class_embedding_norm"], np.sqrt((w**2).sum(1)), rtol=1e-12)
    # With FN the raw features are the same, the head sees norm sqrt(d).
    fn_rep = norm_report(toggle_feature_norm(model), x, y, num_classes=4)
    np.testing.assert_allclose(fn_rep["feature_norm"], rep["feature_norm"][:4], rtol=1e-12)
    np.testing.assert_allclose(fn_rep["head_feature_norm"], [math.sqrt(model.num_features)] * 4, rtol=1e-12)


def test_collapse_report_matches_numpy_svd() -> None:
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(20, 12))
    rep = collapse_report(torch.from_numpy(feats))
    sv = np.linalg.svd(feats, compute_uv=False)
    np.testing.assert_allclose(rep["singular_values"], sv, rtol=1e-10)
    np.testing.assert_allclose(rep["normalized_singular_values"], sv / sv[0], rtol=1e-10)
    p = sv / sv.sum()
    assert rep["effective_rank"] == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-10)
    assert rep["sigma1_over_sigma2"] == pytest.approx(sv[0] / sv[1], rel=1e-10)


def test_effective_rank_extremes() -> None:
    u = np.random.default_rng(1).normal(size=(10, 1))
    rank1 = torch.from_numpy(u @ np.random.default_rng(2).normal(size=(1, 7)))
    rep = collapse_report(rank1)
    assert rep["effective_rank"] == pytest.approx(1.0, abs=1e-6)
    assert rep["sigma1_over_sigma2"] > 1e8
    assert effective_rank(torch.ones(5, dtype=DT)) == pytest.approx(5.0, rel=1e-12)  # flat spectrum
    assert effective_rank(torch.zeros(3, dtype=DT)) == 0.0


def test_per_class_accuracy_matches_direct_count() -> None:
    model = tiny()
    x, y = batch(1, n=40)
    rep = per_class_accuracy(model, x, y, 4)
    with torch.no_grad():
        logits = model.eval()(x).numpy()
    pred, yn = logits.argmax(1), y.numpy()
    assert rep["accuracy"] == pytest.approx((pred == yn).mean())
    for c in range(4):
        assert rep["per_class_accuracy"][c] == pytest.approx((pred[yn == c] == c).mean())
        assert rep["prediction_fraction"][c] == pytest.approx((pred == c).mean())
    np.testing.assert_allclose(rep["mean_logits"], logits.mean(0), rtol=1e-12)


def test_local_overfitting_one_step_is_plain_sgd_and_leaves_the_model_alone() -> None:
    model = tiny(seed=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, _ = batch(2, n=16)
    y = torch.full((16,), 2)
    xt, yt = batch(4)
    out = local_overfitting(model, x, y, xt, yt, 4, steps=1, lr=0.1, batch_size=16)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # Independent: one SGD step on the whole client (the loss is a mean, so the order is irrelevant).
    ref = tiny(seed=3)
    loss = F.cross_entropy(ref.train()(x), y)
    grads = torch.autograd.grad(loss, list(ref.parameters()))
    with torch.no_grad():
        expected = [p - 0.1 * g for p, g in zip(ref.parameters(), grads)]
    for p, e in zip(out["model"].parameters(), expected):
        torch.testing.assert_close(p, e, rtol=1e-12, atol=1e-12)
    assert out["train_loss"] == [pytest.approx(float(loss.detach()), rel=1e-12)]
    assert out["before"] == per_class_accuracy(model, xt, yt, 4)


def test_local_overfitting_on_one_class_biases_predictions_to_that_class() -> None:
    model = tiny(seed=5)
    x, _ = batch(6, n=64)
    y = torch.full((64,), 1)
    xt, yt = batch(7, n=80)
    out = local_overfitting(model, x, y, xt, yt, 4, steps=20, lr=0.5)
    assert out["after"]["prediction_fraction"][1] == 1.0
    assert out["after"]["per_class_accuracy"][1] == 1.0
    assert out["train_loss"][-1] < out["train_loss"][0]


def test_toggle_feature_norm_shares_weights_and_predictions_prop3() -> None:
    vanilla = tiny(seed=8)
    fn = toggle_feature_norm(vanilla)
    assert isinstance(fn, FeatureNormClassifier)
    assert all(torch.equal(a, b) for a, b in zip(vanilla.state_dict().values(), fn.state_dict().values()))
    x, _ = batch(9)
    assert torch.equal(vanilla.eval()(x).argmax(1), fn.eval()(x).argmax(1))
    back = toggle_feature_norm(fn)
    assert not isinstance(back, FeatureNormClassifier)
    torch.testing.assert_close(back.eval()(x), vanilla(x))
    torch.testing.assert_close(extract_features(fn, x), extract_features(vanilla, x))


def test_pick_one_class_client_and_sample_per_class() -> None:
    hist = np.array([[5, 5, 0], [0, 0, 0], [0, 3, 0], [0, 0, 7], [1, 1, 1]])
    assert pick_one_class_client(hist) == 3  # one class, the largest such client
    with pytest.raises(ValueError):
        pick_one_class_client(np.zeros((2, 3)))
    y = np.array([0, 0, 0, 1, 2, 2, 1, 0])
    ix = sample_per_class(y, 2, seed=0)
    assert list(np.bincount(y[ix])) == [2, 2, 2] and len(set(ix)) == len(ix)


def test_fednorm_analyze_end_to_end_on_digits(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    args = ["run", "--dataset", "digits", "--partition", "classes", "--classes-per-client", "1", "--num-clients", "10",
            "--model", "ln_cnn", "--norm", "fn", "--rounds", "2", "--local-steps", "3", "--batch-size", "16",
            "--lr", "0.05", "--threads", "1", "--quiet", "--out", str(run)]
    assert main(args) == 0
    capsys.readouterr()
    assert main(["analyze", str(run), "--steps", "3"]) == 0
    printed = capsys.readouterr().out
    assert "after local (as_trained)" in printed and "fn_removed" in printed
    result = json.loads((run / "analysis.json").read_text())
    for name in ("analysis_norms.png", "analysis_spectrum.png", "analysis_overfitting.png"):
        assert (run / name).stat().st_size > 0
    assert result["round"] == 2 and result["feature_norm"] is True and len(result["client_classes"]) == 1
    assert result["feature_matrix_rows"] == 20  # 2 test images of each of the 10 classes
    # Independent: the checkpoint's head weights and the run's own final accuracy.
    state = torch.load(run / "checkpoint.pt", weights_only=True)["global_state"]
    np.testing.assert_allclose(result["global"]["norms"]["class_embedding_norm"], state["head.weight"].norm(dim=1).numpy(), rtol=1e-6)
    summary = json.loads((run / "summary.json").read_text())
    before = result["local"]["as_trained"]["before"]
    assert before["accuracy"] == pytest.approx(summary["final_test_accuracy"], abs=1e-12)  # digits: whole test set
    np.testing.assert_allclose(result["global"]["norms"]["head_feature_norm"], [math.sqrt(192)] * 10, rtol=1e-5)
    assert result["local"]["as_trained"]["after"]["prediction_fraction"][result["client_classes"][0]] > 0.5


def test_fednorm_analyze_rejects_a_non_run_directory(tmp_path, capsys) -> None:
    assert main(["analyze", str(tmp_path)]) == 2
    assert "config.yaml" in capsys.readouterr().err
