"""Tests for fednorm.nn.feature_norm: φ, FeatureNorm, the FN wrapper and the LN paper's Props. 1–3.

The propositions (Zhang et al., 2024, Sec. 4.1–4.2) are checked in float64 on tiny random
ReLU MLPs written here: ``h_1 = relu(A_1 x + b_1)``, ``h_l = relu(A_l h_{l-1})`` (no bias after
layer 1, the paper's Assumption 1), ``logits = W h_L (+ c)``.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from fednorm.models import get_model
from fednorm.nn.feature_norm import FeatureNorm, FeatureNormClassifier, feature_norm, with_feature_norm

DT = torch.float64


# ---------------------------------------------------------------------------------------------
# Tiny MLPs and the paper's normalisers, written independently of the library code.


def phi(x: torch.Tensor) -> torch.Tensor:
    """Scale normalisation φ(x) = √d x / ‖x‖ (eq. 5 without the shift), no ε."""
    return math.sqrt(x.shape[-1]) * x / x.norm(dim=-1, keepdim=True)


def shift(x: torch.Tensor) -> torch.Tensor:
    """Shift operator S(x) = x − μ(x)·1."""
    return x - x.mean(dim=-1, keepdim=True)


def psi(x: torch.Tensor) -> torch.Tensor:
    """MV normalisation ψ(x) = (x − μ) / σ with the biased std (eq. 3), no ε."""
    return shift(x) / x.std(dim=-1, unbiased=False, keepdim=True)


def make_mlp(seed: int, dims=(7, 16, 12, 9), num_classes=5, first_bias=True, hidden_bias=False, head_bias=False):
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(o, i, generator=g, dtype=DT) / math.sqrt(i) for i, o in zip(dims[:-1], dims[1:])]
    biases = [torch.randn(o, generator=g, dtype=DT) for o in dims[1:]]
    if not first_bias:
        biases[0] = torch.zeros_like(biases[0])
    if not hidden_bias:
        biases[1:] = [torch.zeros_like(b) for b in biases[1:]]
    head_w = torch.randn(num_classes, dims[-1], generator=g, dtype=DT)
    head_b = torch.randn(num_classes, generator=g, dtype=DT) * 3 if head_bias else torch.zeros(num_classes, dtype=DT)
    return weights, biases, head_w, head_b


def run_mlp(mlp, x, norms):
    """Forward with ``norms[l]`` applied after the ReLU of hidden layer l (``None`` = identity)."""
    weights, biases, head_w, head_b = mlp
    h = x
    for (a, b), norm in zip(zip(weights, biases), norms):
        h = torch.relu(h @ a.T + b)
        if norm is not None:
            h = norm(h)
    return h @ head_w.T + head_b


def inputs(seed: int, n: int = 64, d: int = 7) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=DT)


def valid_inputs(mlp, x) -> torch.Tensor:
    """The rows of ``x`` in the propositions' domain.

    φ (ψ) is undefined on a zero (constant) hidden vector, e.g. a row the ReLU kills entirely;
    the propositions exclude such inputs, so the tests drop them (and check that most remain).
    """
    keep = torch.ones(x.shape[0], dtype=torch.bool)
    h = x
    for a, b in zip(mlp[0], mlp[1]):
        h = torch.relu(h @ a.T + b)
        keep &= (h.norm(dim=-1) > 0) & (h.std(dim=-1) > 0)
    assert keep.sum() >= x.shape[0] // 2
    return x[keep]


# ---------------------------------------------------------------------------------------------
# Prop. 1: φ at every hidden layer == φ at the last hidden layer only (Assumption 1).


@pytest.mark.parametrize("seed", range(5))
def test_scale_norm_every_layer_equals_last_layer_only_prop1(seed: int) -> None:
    mlp = make_mlp(seed, first_bias=True, head_bias=True)  # Assumption 1 allows a layer-1 bias
    x = valid_inputs(mlp, inputs(100 + seed))
    every = run_mlp(mlp, x, [phi, phi, phi])
    last_only = run_mlp(mlp, x, [None, None, phi])
    assert_close(every, last_only, rtol=1e-12, atol=1e-12)
    # The library's FN is the "last only" form.
    assert_close(run_mlp(mlp, x, [None, None, feature_norm]), last_only, rtol=1e-12, atol=1e-12)


def test_prop1_fails_with_bias_after_first_layer() -> None:
    mlp = make_mlp(0, hidden_bias=True)  # violates Assumption 1
    x = valid_inputs(mlp, inputs(100))
    every = run_mlp(mlp, x, [phi, phi, phi])
    last_only = run_mlp(mlp, x, [None, None, phi])
    assert (every - last_only).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------------
# Prop. 2 (reduced LN): ψ after every hidden layer == S after hidden layers 1..L-1 and ψ after
# layer L. Stated exactly as tested: same bias-free-after-layer-1 ReLU MLP, ψ with the biased
# std and no ε, inputs for which no hidden post-ReLU vector is constant (σ > 0); logits equal
# to float64 rounding, with or without a head bias (the head sees the same vector).


@pytest.mark.parametrize("seed", range(5))
def test_mv_norm_every_layer_equals_shifts_plus_last_layer_psi_prop2(seed: int) -> None:
    mlp = make_mlp(seed, first_bias=True, head_bias=True)
    x = valid_inputs(mlp, inputs(200 + seed))
    every = run_mlp(mlp, x, [psi, psi, psi])
    reduced = run_mlp(mlp, x, [shift, shift, psi])
    assert_close(every, reduced, rtol=1e-12, atol=1e-12)
    # ψ here is LN without affine and ε → 0 (torch's F.layer_norm).
    ln = lambda h: F.layer_norm(h, h.shape[-1:], eps=0.0)  # noqa: E731
    assert_close(run_mlp(mlp, x, [ln, ln, ln]), reduced, rtol=1e-10, atol=1e-10)
    # ψ = φ ∘ S (eq. 5): the last-layer ψ is FN applied to the shifted features.
    assert_close(run_mlp(mlp, x, [shift, shift, lambda h: feature_norm(shift(h))]), reduced, rtol=1e-12, atol=1e-12)


def test_prop2_fails_with_bias_after_first_layer() -> None:
    mlp = make_mlp(1, hidden_bias=True)
    x = valid_inputs(mlp, inputs(201))
    assert (run_mlp(mlp, x, [psi, psi, psi]) - run_mlp(mlp, x, [shift, shift, psi])).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------------
# Prop. 3: same predictions as the vanilla net with the same weights iff the head has no bias.


@pytest.mark.parametrize("seed", range(5))
def test_fn_and_vanilla_predict_same_classes_without_head_bias_prop3(seed: int) -> None:
    mlp = make_mlp(seed, first_bias=True, head_bias=False)
    x = inputs(300 + seed, n=512)
    vanilla = run_mlp(mlp, x, [None, None, None])
    fn = run_mlp(mlp, x, [None, None, feature_norm])
    assert torch.equal(vanilla.argmax(1), fn.argmax(1))  # dead rows included: both all-zero
    # Logits are a positive per-sample rescaling of each other: √d / ‖h(x)‖ (rows with h ≠ 0).
    live = vanilla.abs().sum(1) > 0
    ratio = fn[live] / vanilla[live]
    assert_close(ratio, ratio[:, :1].expand_as(ratio))
    assert (ratio > 0).all()


def test_prop3_fails_with_head_bias() -> None:
    # Explicit: z = (10, 0) → FN z = (√2, 0); head I with bias (0, 5).
    z = torch.tensor([[10.0, 0.0]], dtype=DT)
    head = nn.Linear(2, 2).to(DT)
    with torch.no_grad():
        head.weight.copy_(torch.eye(2, dtype=DT))
        head.bias.copy_(torch.tensor([0.0, 5.0], dtype=DT))
    assert head(z).argmax(1).item() == 0
    assert head(feature_norm(z)).argmax(1).item() == 1
    # And on a random MLP with a head bias, some predictions change.
    mlp = make_mlp(0, head_bias=True)
    x = inputs(300, n=512)
    vanilla = run_mlp(mlp, x, [None, None, None]).argmax(1)
    fn = run_mlp(mlp, x, [None, None, feature_norm]).argmax(1)
    assert (vanilla != fn).any()


# ---------------------------------------------------------------------------------------------
# feature_norm / FeatureNorm.


@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (2, 3), (16, 192)])
def test_fn_rows_have_norm_sqrt_d(shape) -> None:
    z = torch.randn(*shape, dtype=DT)
    out = FeatureNorm(shape[1])(z)
    assert out.shape == z.shape and out.dtype == DT
    assert_close(out.norm(dim=1), torch.full((shape[0],), math.sqrt(shape[1]), dtype=DT), rtol=1e-14, atol=1e-14)
    assert_close(out, math.sqrt(shape[1]) * F.normalize(z, dim=1))  # the code's F.normalize form


def test_fn_is_scale_invariant_and_shift_variant() -> None:
    z = torch.rand(8, 10, dtype=DT) + 0.1
    assert_close(feature_norm(z * 37.5), feature_norm(z))
    assert not torch.allclose(feature_norm(z + 1.0), feature_norm(z))


def test_fn_custom_scale() -> None:
    z = torch.randn(4, 6, dtype=DT)
    assert_close(feature_norm(z, scale=1.0), F.normalize(z, dim=-1))
    assert_close(FeatureNorm(scale=2.0)(z).norm(dim=1), torch.full((4,), 2.0, dtype=DT))


def test_zero_rows_give_zero_not_nan() -> None:
    z = torch.zeros(3, 4, dtype=DT)
    z[1] = torch.tensor([1.0, 2.0, 2.0, 0.0], dtype=DT)
    z.requires_grad_(True)
    out = FeatureNorm()(z)
    assert torch.isfinite(out).all()
    assert torch.equal(out[0].detach(), torch.zeros(4, dtype=DT))
    assert_close(out[1].norm(), torch.tensor(2.0, dtype=DT))
    out.sum().backward()
    assert torch.isfinite(z.grad).all()
    # Below eps the map is linear, z ↦ √d z / eps (as F.normalize): large but finite slope.
    assert_close(z.grad[0], torch.full((4,), 2.0 / 1e-12, dtype=DT))


def test_tiny_rows_below_eps_are_not_blown_up() -> None:
    z = torch.full((1, 4), 1e-14, dtype=DT)  # norm 2e-14 < eps = 1e-12
    assert_close(feature_norm(z), z / 1e-12 * 2.0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_is_finite(dtype) -> None:
    z = torch.randn(4, 8).to(dtype)
    z[0] = 0
    out = feature_norm(z)
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert_close(out[1:].float().norm(dim=1), torch.full((3,), math.sqrt(8)), rtol=1e-2, atol=1e-2)


def test_gradient_matches_gradcheck() -> None:
    z = torch.randn(5, 7, dtype=DT, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: FeatureNorm()(t), (z,))
    assert torch.autograd.gradgradcheck(lambda t: feature_norm(t), (z,))


def test_gradient_is_orthogonal_to_input_scale_invariance() -> None:
    # Degree-0 homogeneity (Euler): z · ∇_z L = 0 per row, so FN's gradient cannot grow ‖z‖.
    z = torch.randn(6, 9, dtype=DT, requires_grad=True)
    w = torch.randn(9, 3, dtype=DT)
    (feature_norm(z) @ w).pow(2).sum().backward()
    assert torch.isfinite(z.grad).all()
    assert_close((z.grad * z).sum(dim=1), torch.zeros(6, dtype=DT), atol=1e-12, rtol=0)


def test_feature_norm_layer_has_no_state_and_same_train_eval() -> None:
    fn = FeatureNorm(8)
    assert list(fn.parameters()) == [] and list(fn.buffers()) == [] and fn.state_dict() == {}
    z = torch.randn(4, 8)
    out_train = fn.train()(z)
    assert torch.equal(out_train, fn.eval()(z))
    assert repr(fn) == "FeatureNorm(8, eps=1e-12, scale=sqrt(d))"
    assert repr(FeatureNorm(scale=1.0)) == "FeatureNorm(eps=1e-12, scale=1.0)"


def test_feature_norm_validates() -> None:
    with pytest.raises(ValueError, match="expected 2D input"):
        FeatureNorm()(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="expected 8 features"):
        FeatureNorm(8)(torch.randn(2, 3))
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="num_features"):
            FeatureNorm(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eps"):
        FeatureNorm(eps=0.0)
    with pytest.raises(ValueError, match="scale"):
        feature_norm(torch.randn(2, 2), scale=-1.0)
    with pytest.raises(ValueError, match="0-dim"):
        feature_norm(torch.tensor(1.0))


# ---------------------------------------------------------------------------------------------
# The wrapper on fednorm models.


def test_wrapper_forward_is_head_of_fn_features_simple_cnn() -> None:
    torch.manual_seed(0)
    base = get_model("simple_cnn", norm="none")
    net = FeatureNormClassifier(base)
    x = torch.rand(3, 3, 32, 32)
    feats = net.forward_features(x)
    assert feats.shape == (3, base.num_features)
    assert_close(feats.norm(dim=1), torch.full((3,), math.sqrt(base.num_features)))
    assert_close(net(x), base.head(feature_norm(base.forward_features(x))))
    assert net.head is base.head and net.num_features == base.num_features == 128
    assert net.num_classes == 10 and net.model is base


def test_wrapper_keeps_state_dict_keys_and_loads_vanilla_checkpoints() -> None:
    base = get_model("simple_cnn", norm="none")
    net = with_feature_norm(base)
    assert list(net.state_dict()) == list(base.state_dict())
    other = get_model("simple_cnn", norm="none")
    net.load_state_dict(other.state_dict())  # strict
    for k, v in other.state_dict().items():
        assert torch.equal(base.state_dict()[k], v)  # shared modules: the wrapped model changed too
    assert len(list(net.parameters())) == len(list(base.parameters()))


def test_wrapper_matches_vanilla_predictions_with_bias_free_head_prop3() -> None:
    torch.manual_seed(1)
    base = get_model("ln_cnn", norm="none").to(DT)  # bias-free everywhere, d = 192
    net = with_feature_norm(base)
    assert net.num_features == 192
    x = torch.rand(16, 3, 32, 32, dtype=DT)
    assert torch.equal(net(x).argmax(1), base(x).argmax(1))


def test_wrapper_train_eval_to_and_deepcopy() -> None:
    base = get_model("simple_cnn", norm="bn")
    net = with_feature_norm(base)
    net.eval()
    assert not base.training and not any(m.training for m in base.modules())
    net.train()
    assert base.training and all(m.training for m in net.modules())
    net.to(DT)
    assert all(p.dtype == DT for p in base.parameters())
    clone = copy.deepcopy(net)
    assert clone.model.head is clone.head and clone.head is not net.head
    x = torch.rand(2, 3, 32, 32, dtype=DT)
    net.eval()
    clone.eval()
    assert_close(clone(x), net(x))


def test_wrapper_validates() -> None:
    with pytest.raises(TypeError, match="forward_features"):
        FeatureNormClassifier(nn.Linear(3, 2))
    net = with_feature_norm(get_model("mlp", norm="none"))
    with pytest.raises(ValueError, match="already"):
        with_feature_norm(net)
    base = get_model("mlp", norm="none")
    base.register_buffer("extra", torch.zeros(1))
    with pytest.raises(ValueError, match="extra"):
        with_feature_norm(base)


@pytest.mark.parametrize("name", ["simple_cnn", "ln_cnn", "mlp", "resnet20"])
def test_wrapper_builds_for_registered_models(name: str) -> None:
    base = get_model(name, norm="none")
    net = with_feature_norm(base)
    assert list(net.state_dict()) == list(base.state_dict())
    x = torch.rand(2, 3, 32, 32) if name != "mlp" else None
    if x is not None:
        net.eval()
        assert net(x).shape == (2, base.num_classes)


def test_one_sgd_step_on_wrapped_simple_cnn() -> None:
    torch.manual_seed(0)
    net = with_feature_norm(get_model("simple_cnn", norm="none"))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x, y = torch.rand(4, 3, 32, 32), torch.randint(0, 10, (4,))
    loss = F.cross_entropy(net(x), y)
    opt.zero_grad()
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())
    opt.step()
    after = net.state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in before)
    assert torch.isfinite(F.cross_entropy(net(x), y))
