"""Tests for fednorm.models: every registered model × every registered norm × input configuration."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fednorm.errors import UnknownNameError
from fednorm.models import MODELS, ClassifierModel, get_model, list_models
from fednorm.models.base import maybe_max_pool, to_hw
from fednorm.nn.ln_variants import norm_placement
from fednorm.nn.norms import convert_norm, get_norm_layer, list_norms, norm_modules

# (in_channels, input_size): 8×8 sklearn digits, 32×32 CIFAR, 28×28 MNIST-like digits.
INPUTS = [(1, 8), (3, 32), (1, 28)]
BATCH = 2


def _num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _num_running_stats(model: nn.Module) -> int:
    return sum(
        m.running_mean.numel() + m.running_var.numel()
        for _, m in norm_modules(model)
        if isinstance(m, _BatchNorm) and m.running_mean is not None
    )


# Every model with every norm and with every input, and every norm with every input (a pairwise cover),
# not every triple: the input decides a model's shapes, the norm its layers. The full product was 3x the
# cases and about 450 s of the suite's CPU time (ResNet-50 at 32x32 under every norm).
PAIRWISE = [(name, norm, *INPUTS[(i + j) % len(INPUTS)])
            for i, name in enumerate(list_models()) for j, norm in enumerate(list_norms())]


def test_the_cases_cover_every_pair() -> None:
    assert {(n, m) for n, m, *_ in PAIRWISE} == {(n, m) for n in list_models() for m in list_norms()}
    assert {(n, tuple(i)) for n, _, *i in PAIRWISE} == {(n, i) for n in list_models() for i in INPUTS}
    assert {(m, tuple(i)) for _, m, *i in PAIRWISE} == {(m, i) for m in list_norms() for i in INPUTS}


@pytest.mark.parametrize("name,norm,in_channels,input_size", PAIRWISE)
def test_model_builds_trains_and_evaluates(name: str, norm: str, in_channels: int, input_size: int) -> None:
    torch.manual_seed(0)
    # Norm names with a placement (LN paper's variants) need the matching model option.
    needs = set(norm_placement(get_norm_layer(norm))) - {"feature_norm", "weight_standardization"}  # applied to any model
    missing = needs - set(inspect.signature(MODELS.get_builder(name)).parameters)
    if missing:
        with pytest.raises(ValueError, match=sorted(missing)[0]):
            get_model(name, num_classes=7, in_channels=in_channels, input_size=input_size, norm=norm)
        return
    model = get_model(name, num_classes=7, in_channels=in_channels, input_size=input_size, norm=norm)
    assert isinstance(model, ClassifierModel)
    assert isinstance(model.head, nn.Linear)
    assert model.head.in_features == model.num_features
    assert model.head.out_features == 7
    x = torch.randn(BATCH, in_channels, input_size, input_size)

    model.train()
    features = model.forward_features(x)
    assert features.shape == (BATCH, model.num_features)
    logits = model(x)
    assert logits.shape == (BATCH, 7)
    F.cross_entropy(logits, torch.tensor([0, 6])).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)

    model.eval()
    with torch.no_grad():
        assert model(x[:1]).shape == (1, 7)
        assert model.forward_features(x[:1]).shape == (1, model.num_features)


@pytest.mark.parametrize("name", list_models())
def test_norm_none_has_no_norm_modules(name: str) -> None:
    model = get_model(name, norm="none", in_channels=1, input_size=8)
    assert norm_modules(model) == []
    assert get_model(name, norm=None, in_channels=1, input_size=8) is not None


@pytest.mark.parametrize("name", list_models())
def test_norm_bn_gives_only_batch_norms(name: str) -> None:
    norms = norm_modules(get_model(name, norm="bn", in_channels=1, input_size=8))
    assert norms and all(isinstance(m, _BatchNorm) for _, m in norms)


@pytest.mark.parametrize("name", list_models())
@pytest.mark.parametrize("norm", ["gn", "ln"])
def test_group_norms_replace_every_norm(name: str, norm: str) -> None:
    norms = norm_modules(get_model(name, norm=norm, in_channels=1, input_size=8))
    assert norms and all(isinstance(m, nn.GroupNorm) for _, m in norms)
    expected = 2 if norm == "gn" else 1
    assert all(m.num_groups == expected for _, m in norms)


@pytest.mark.parametrize(
    "name,expected_norms",
    [("simple_cnn", 3), ("fedbn_cnn", 5), ("fbn_cnn", 4), ("ln_cnn", 4), ("resnet20", 19), ("resnet18", 20), ("vgg11", 8), ("mlp", 1)],
)
def test_number_of_norm_layers(name: str, expected_norms: int) -> None:
    assert len(norm_modules(get_model(name, in_channels=1, input_size=8))) == expected_norms


def test_resnet20_parameter_count_fedtan_4_2() -> None:
    model = get_model("resnet20", num_classes=10)
    assert _num_params(model) == 269_722
    assert _num_running_stats(model) == 1_376
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 19 and all(c.bias is None for c in convs)


def test_resnet20_option_a_shortcut_is_parameter_free() -> None:
    model = get_model("resnet20")
    block = model.layers[1][0]
    x = torch.randn(2, 16, 8, 8)
    out = block.shortcut(x)
    assert out.shape == (2, 32, 4, 4)
    torch.testing.assert_close(out[:, 8:24], x[:, :, ::2, ::2])
    assert out[:, :8].abs().sum() == 0 and out[:, 24:].abs().sum() == 0
    assert sum(p.numel() for p in block.shortcut.parameters()) == 0


def test_fbn_cnn_parameter_count_fbn_6() -> None:
    model = get_model("fbn_cnn", num_classes=10)
    # FBN's CNN (Guerraoui et al., 2024, App. C.1, Table 1), counted by hand: 1,310,922
    # parameters, all trainable; 768 running statistics.
    assert _num_params(model) == sum(p.numel() for p in model.parameters()) == 1_310_922
    assert _num_running_stats(model) == 768
    assert model.fc[0].in_features == 8192


def test_mlp_parameter_count_fedtan_4_2() -> None:
    model = get_model("mlp", in_channels=1, input_size=28, num_classes=10)
    assert _num_params(model) == 23_920
    assert isinstance(model.fc[2], nn.BatchNorm1d)
    assert _num_params(get_model("mlp", in_channels=1, input_size=28, hidden=50)) == 784 * 50 + 50 + 100 + 510


def test_resnet18_parameter_counts() -> None:
    assert _num_params(get_model("resnet18")) == 11_173_962
    # torchvision's ImageNet ResNet-18, HBN's Tiny-ImageNet model (Chen et al., 2025, Sec. 4.1).
    assert _num_params(get_model("resnet18", stem="imagenet", num_classes=1000)) == 11_689_512


def test_resnet18_norm_after_activation_ln_paper() -> None:
    model = get_model("resnet18", norm="ln", norm_position="after", in_channels=1, input_size=8)
    # Shortcuts carry no norm in the LN paper's group_norm_after ResNet: 17 norms, not 20.
    assert len(norm_modules(model)) == 17
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)


@pytest.mark.parametrize(
    "name,in_channels,input_size,flat",
    [
        ("simple_cnn", 3, 32, 1024),  # HBN Table 7
        ("fedbn_cnn", 3, 28, 6272),  # FedBN DigitModel
        ("fbn_cnn", 3, 32, 8192),  # FBN Table 1
        ("ln_cnn", 3, 32, 1600),  # LN paper CNN_CIFAR
        ("simple_cnn", 1, 8, 64),  # 8×8: pools down to 1×1
        ("ln_cnn", 1, 8, 64),  # 8×8: second conv padded, last pool to 1×1
    ],
)
def test_flatten_sizes_follow_the_specs(name: str, in_channels: int, input_size: int, flat: int) -> None:
    model = get_model(name, in_channels=in_channels, input_size=input_size)
    assert model.fc[0].in_features == flat


def test_simple_cnn_fn_before_fc_is_hbn_fedfn() -> None:
    """HBN's FedFN (code ``SimpleCNN(fn=True)``): no body norm, the flattened 1024-d conv map
    scaled to norm sqrt(1024) = 32 before ``fc``; same state dict as the plain net."""
    torch.manual_seed(0)
    plain = get_model("simple_cnn", norm="none")
    fn = get_model("simple_cnn", norm="none", fn_before_fc=True)
    assert fn.state_dict().keys() == plain.state_dict().keys()
    fn.load_state_dict(plain.state_dict())
    x = torch.randn(5, 3, 32, 32, dtype=torch.float64)
    plain.double(), fn.double()
    z = plain.features(x)  # (5, 1024), the code's ``features`` before F.normalize
    expected = plain.head(plain.fc(z / z.norm(dim=1, keepdim=True) * 32.0))
    torch.testing.assert_close(fn(x), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fn.features(x).norm(dim=1), torch.full((5,), 32.0, dtype=torch.float64))


def test_ln_cnn_is_bias_free_by_default_and_has_bias_option() -> None:
    model = get_model("ln_cnn", norm="none")
    assert all(m.bias is None for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear)))
    assert model.num_features == 192
    with_bias = get_model("ln_cnn", norm="none", bias=True)
    assert all(m.bias is not None for m in with_bias.modules() if isinstance(m, (nn.Conv2d, nn.Linear)))
    table7 = get_model("ln_cnn", fc_dims=(384,))
    assert table7.num_features == 384 and table7.head.in_features == 384


def test_ln_cnn_norm_after_relu() -> None:
    model = get_model("ln_cnn", norm="bn")
    kinds = [type(m) for m in model.features]
    assert kinds[:4] == [nn.Conv2d, nn.ReLU, nn.BatchNorm2d, nn.MaxPool2d]
    assert [type(m) for m in model.fc][:3] == [nn.Linear, nn.ReLU, nn.BatchNorm1d]


def test_fbn_cnn_norm_after_relu_and_dropout() -> None:
    model = get_model("fbn_cnn")
    kinds = [type(m) for m in model.features]
    assert kinds[:3] == [nn.Conv2d, nn.ReLU, nn.BatchNorm2d]
    assert sum(isinstance(m, nn.Dropout) and m.p == 0.25 for m in model.features) == 2


def test_fedbn_cnn_uses_batch_norm_1d_in_fc_layers() -> None:
    model = get_model("fedbn_cnn", input_size=28)
    assert [m.num_features for m in model.fc if isinstance(m, nn.BatchNorm1d)] == [2048, 512]
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.features) == 3


def test_vgg11_head_is_linear_512() -> None:
    model = get_model("vgg11", num_classes=100)
    assert (model.head.in_features, model.head.out_features) == (512, 100)
    assert sum(isinstance(m, nn.Conv2d) for m in model.modules()) == 8


def test_non_square_input_size() -> None:
    model = get_model("simple_cnn", in_channels=1, input_size=(16, 8))
    assert model(torch.randn(2, 1, 16, 8)).shape == (2, 10)


def test_convert_model_to_gn_keeps_output_shape() -> None:
    model = get_model("fedbn_cnn", in_channels=1, input_size=8)
    converted = convert_norm(model, "gn")
    assert converted is model
    assert not any(isinstance(m, _BatchNorm) for m in model.modules())
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_unknown_model_name_suggests_closest() -> None:
    with pytest.raises(UnknownNameError, match="resnet20"):
        get_model("resnet21")
    with pytest.raises(UnknownNameError, match="Did you mean 'gn'"):
        get_model("mlp", norm="gnn")


def test_model_names_are_case_and_dash_insensitive() -> None:
    assert isinstance(get_model("Simple-CNN", in_channels=1, input_size=8), ClassifierModel)


def test_gn_divisibility_error_through_get_model() -> None:
    with pytest.raises(ValueError, match="divisible by num_groups"):
        get_model("mlp", norm="gn", norm_args={"num_groups": 7})


def test_norm_args_are_bound() -> None:
    model = get_model("simple_cnn", norm="gn", norm_args={"num_groups": 4}, in_channels=1, input_size=8)
    assert {m.num_groups for _, m in norm_modules(model)} == {4}


def test_get_model_rejects_norm_layer_kwarg() -> None:
    with pytest.raises(TypeError, match="norm="):
        get_model("mlp", norm_layer=nn.BatchNorm2d)


@pytest.mark.parametrize("bad", [0, -1, (8,), (8, 8, 8), "32"])
def test_invalid_input_size(bad: object) -> None:
    with pytest.raises(ValueError, match="input_size"):
        to_hw(bad)  # type: ignore[arg-type]


def test_maybe_max_pool_skips_below_2x2() -> None:
    pool, hw = maybe_max_pool((1, 4))
    assert isinstance(pool, nn.Identity) and hw == (1, 4)
    pool, hw = maybe_max_pool((7, 5))
    assert isinstance(pool, nn.MaxPool2d) and hw == (3, 2)
