"""Tests for the LN paper's norm variants (fednorm/nn/ln_variants.py) on the paper's own models.

Props. 1–3 (Zhang et al., 2024, Sec. 4.1–4.2) are checked in float64 on the library's
bias-free ``ln_cnn`` (convolutions, max-pools, linears), against a functional forward of the
same weights written here with the normalisers spelled out (φ, ψ, S over all non-batch dims).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from fednorm.config import ExperimentConfig
from fednorm.engine.simulator import Simulation
from fednorm.models import get_model
from fednorm.nn import FeatureNormClassifier, ScaleNorm, Shift, norm_placement
from fednorm.nn.norms import get_norm_layer

DT = torch.float64


def phi(h: torch.Tensor) -> torch.Tensor:
    """φ(h) = √d h / ‖h‖ per sample, d = all non-batch dims, no ε."""
    flat = h.flatten(1)
    return (math.sqrt(flat.shape[1]) * flat / flat.norm(dim=1, keepdim=True)).view_as(h)


def shift(h: torch.Tensor) -> torch.Tensor:
    flat = h.flatten(1)
    return (flat - flat.mean(dim=1, keepdim=True)).view_as(h)


def psi(h: torch.Tensor) -> torch.Tensor:
    """ψ(h) = (h − μ) / σ per sample over all non-batch dims (biased σ), no ε."""
    flat = h.flatten(1)
    return ((flat - flat.mean(1, keepdim=True)) / flat.std(1, unbiased=False, keepdim=True)).view_as(h)


def cnn_weights(model: nn.Module) -> list[torch.Tensor]:
    """conv1, conv2, fc1, fc2, head weights in forward order (the model is bias-free)."""
    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert all(m.bias is None for m in layers)
    return [m.weight for m in layers]


def cnn_forward(w: list[torch.Tensor], x: torch.Tensor, norms, *, before: bool = False) -> torch.Tensor:
    """The LN paper's CNN: [conv → act/norm → pool] × 2 → [fc → act/norm] × 2 → head."""

    def act(h, norm):
        if norm is None:
            return torch.relu(h)
        return torch.relu(norm(h)) if before else norm(torch.relu(h))

    h = F.max_pool2d(act(F.conv2d(x, w[0]), norms[0]), 2)
    h = F.max_pool2d(act(F.conv2d(h, w[1]), norms[1]), 2).flatten(1)
    h = act(h @ w[2].T, norms[2])
    h = act(h @ w[3].T, norms[3])
    return h @ w[4].T


def build(norm: str, seed: int = 0, **kw) -> nn.Module:
    torch.manual_seed(seed)
    return get_model("ln_cnn", norm=norm, **kw).to(DT).eval()


def images(seed: int, n: int = 6) -> torch.Tensor:
    return torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed), dtype=DT)


# ---------------------------------------------------------------------------------------------
# Prop. 1: φ after every layer == φ after the last layer only == FN.


@pytest.mark.parametrize("seed", range(2))
def test_scale_norm_every_layer_equals_fn_on_the_paper_cnn_prop1(seed: int) -> None:
    every = build("fn_every", seed)
    w = cnn_weights(every)
    x = images(seed)
    ref_every = cnn_forward(w, x, [phi, phi, phi, phi])
    ref_last = cnn_forward(w, x, [None, None, None, phi])
    assert_close(ref_every, ref_last, rtol=1e-10, atol=1e-10)  # the proposition itself
    assert_close(every(x), ref_every, rtol=1e-10, atol=1e-10)  # the library's fn_every
    fn = build("fn", seed + 100)
    fn.load_state_dict(every.state_dict())  # same keys: FN and φ layers hold no tensors
    assert isinstance(fn, FeatureNormClassifier)
    assert_close(fn(x), ref_last, rtol=1e-10, atol=1e-10)  # the library's FN = last-layer φ


# ---------------------------------------------------------------------------------------------
# Prop. 2: ψ after every layer == S at the hidden layers + ψ at the last one.


@pytest.mark.parametrize("seed", range(2))
def test_mv_norm_every_layer_equals_shifts_plus_last_psi_on_the_paper_cnn_prop2(seed: int) -> None:
    static = build("ln_static", seed, norm_args={"eps": 0.0})
    w = cnn_weights(static)
    x = images(10 + seed)
    ref_every = cnn_forward(w, x, [psi, psi, psi, psi])
    ref_reduced = cnn_forward(w, x, [shift, shift, shift, psi])
    assert_close(ref_every, ref_reduced, rtol=1e-9, atol=1e-9)  # the proposition
    assert_close(static(x), ref_every, rtol=1e-9, atol=1e-9)  # library ln_static = ψ everywhere
    reduced = build("ln_reduced", seed + 100, norm_args={"eps": 0.0})
    reduced.load_state_dict(static.state_dict())
    assert_close(reduced(x), ref_reduced, rtol=1e-9, atol=1e-9)
    # The learnable LN at its initial affine (γ = 1, β = 0) is the static one.
    ln = build("ln", seed + 200, norm_args={"eps": 0.0})
    ln.load_state_dict(static.state_dict(), strict=False)
    assert_close(ln(x), ref_every, rtol=1e-9, atol=1e-9)


def test_prop2_needs_bias_free_layers() -> None:
    static = build("ln_static", 0, norm_args={"eps": 0.0}, bias=True)
    reduced = build("ln_reduced", 1, norm_args={"eps": 0.0}, bias=True)
    reduced.load_state_dict(static.state_dict())
    with torch.no_grad():
        for p in static.parameters():
            if p.dim() == 1:
                p.normal_()
        reduced.load_state_dict(static.state_dict())
    x = images(3)
    assert (static(x) - reduced(x)).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------------
# Prop. 3: FN and vanilla with the same weights predict the same classes (bias-free head).


def test_fn_and_vanilla_predict_the_same_classes_on_the_paper_cnn_prop3() -> None:
    vanilla = build("none", 0)
    fn = build("fn", 1)
    fn.load_state_dict(vanilla.state_dict())
    x = images(7, n=32)
    a, b = vanilla(x), fn(x)
    assert torch.equal(a.argmax(1), b.argmax(1))
    z = vanilla.forward_features(x)
    # FN logits = vanilla logits × √d / ‖z‖ per sample (an independent computation).
    assert_close(b, a * math.sqrt(z.shape[1]) / z.norm(dim=1, keepdim=True), rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# Layers, placements, names.


def test_scale_norm_output_has_norm_sqrt_chw_and_shift_zero_mean() -> None:
    x = torch.randn(5, 4, 3, 2, dtype=DT) * 7 + 3
    out = ScaleNorm(4)(x)
    assert_close(out.flatten(1).norm(dim=1), torch.full((5,), math.sqrt(24.0), dtype=DT))
    assert_close(ScaleNorm(4)(3.5 * x), out)  # scale invariant
    s = Shift(4)(x)
    assert_close(s.flatten(1).mean(1), torch.zeros(5, dtype=DT), atol=1e-12, rtol=0)
    assert_close(x - s, (x - s)[:, :1, :1, :1].expand_as(x))  # a constant per sample
    assert not any(True for _ in ScaleNorm(4).parameters()) and not list(Shift(4).state_dict())


def test_ln_before_places_the_norm_between_conv_and_relu() -> None:
    before = build("ln_before", 0, norm_args={"eps": 0.0})
    x = images(4)
    assert_close(before(x), cnn_forward(cnn_weights(before), x, [psi] * 4, before=True), rtol=1e-9, atol=1e-9)
    after = build("ln", 0, norm_args={"eps": 0.0})
    assert (after(x) - before(x)).abs().max() > 1e-6
    kinds = [type(m).__name__ for m in before.features]
    assert kinds[:3] == ["Conv2d", "GroupNorm", "ReLU"]


def test_norm_names_imply_placements() -> None:
    assert norm_placement(get_norm_layer("ln")) == {}
    assert norm_placement(get_norm_layer("ln_before")) == {"norm_position": "before"}
    assert norm_placement(get_norm_layer("fn", eps=1e-6)) == {"feature_norm": {"eps": 1e-6, "scale": None}}
    assert norm_placement(get_norm_layer("fn_inside_ln"))["norm_sites"] == "block_output"
    fn = get_model("ln_cnn", norm="fn", norm_args={"scale": 2.0})
    assert fn.feature_norm.scale == 2.0
    assert not any(isinstance(m, (nn.GroupNorm, nn.BatchNorm2d)) for m in fn.modules())
    # FN composes with a body norm through the model option.
    ln_fn = get_model("ln_cnn", norm="ln", feature_norm=True)
    assert isinstance(ln_fn, FeatureNormClassifier) and sum(isinstance(m, nn.GroupNorm) for m in ln_fn.modules()) == 4


def test_placements_a_model_cannot_honour_are_refused() -> None:
    with pytest.raises(ValueError, match="norm_position"):
        get_model("simple_cnn", norm="ln_before")
    with pytest.raises(ValueError, match="norm_sites"):
        get_model("ln_cnn", norm="fn_inside_ln")
    with pytest.raises(ValueError, match="model_args"):
        get_model("ln_cnn", norm="ln_before", norm_position="after")
    with pytest.raises(ValueError, match="block_output"):
        get_model("resnet18", norm="ln", norm_sites="block_output")  # needs norm_position="after"


def test_ln_resnet18_norms_follow_every_relu_and_shortcuts_have_none() -> None:
    net = get_model("ln_resnet18", norm="ln")
    gns = [n for n, m in net.named_modules() if isinstance(m, nn.GroupNorm)]
    assert len(gns) == 17 and all(net.get_submodule(n).num_groups == 1 for n in gns)  # stem + 2 per block
    assert not any("shortcut" in n for n in gns)
    assert net.norm_position == "after" and net.head.bias is not None


@pytest.mark.parametrize("norm, layer", [("fn_inside_ln", nn.GroupNorm), ("fn_inside_sn", ScaleNorm)])
def test_fn_inside_resnet_normalises_only_block_outputs(norm: str, layer: type) -> None:
    net = get_model("ln_resnet18", norm=norm)
    assert isinstance(net, FeatureNormClassifier)
    sites = [n for n, m in net.named_modules() if isinstance(m, layer)]
    assert len(sites) == 8 and all(n.endswith("norm2") for n in sites)
    net.eval()
    assert net(torch.rand(2, 3, 32, 32)).shape == (2, 10)


def test_norm_fn_run_equals_feature_norm_model_option_bit_for_bit() -> None:
    common = dict(dataset="digits", partition="classes", classes_per_client=1, num_clients=10, model="ln_cnn",
                  rounds=2, local_steps=3, batch_size=8, lr=0.05, seed=1, threads=1)
    a = Simulation(ExperimentConfig(**common, norm="fn"))
    b = Simulation(ExperimentConfig(**common, norm="none", model_args={"feature_norm": True}))
    assert a.executor.name == b.executor.name == "vectorized"
    for _ in range(2):
        a.step()
        b.step()
    assert a.global_state.keys() == b.global_state.keys()
    assert all(torch.equal(a.global_state[k], b.global_state[k]) for k in a.global_state)
