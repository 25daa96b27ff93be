"""Tests for fednorm.nn.norms: the norm registry, get_norm_layer, norm_modules and convert_norm."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fednorm.errors import UnknownNameError
from fednorm.nn.norms import (
    NORMS,
    convert_norm,
    create_batch_norm,
    get_norm_layer,
    is_batch_norm,
    list_norms,
    norm_modules,
)


def test_builtin_norms_are_registered() -> None:
    assert {"bn", "gn", "ln", "none"} <= set(list_norms())
    assert list_norms() == sorted(list_norms())
    assert list_norms(include="?n") == [n for n in list_norms() if len(n) == 2 and n.endswith("n")]


@pytest.mark.parametrize("name", sorted(NORMS.list()))
@pytest.mark.parametrize("spatial,shape", [(True, (2, 6, 4, 4)), (False, (2, 6))])
def test_every_norm_builds_channel_first_and_runs(name: str, spatial: bool, shape: tuple[int, ...]) -> None:
    layer = get_norm_layer(name)(6, spatial=spatial)
    assert isinstance(layer, nn.Module)
    x = torch.randn(*shape)
    assert layer.train()(x).shape == x.shape
    assert layer.eval()(x).shape == x.shape


def test_bn_follows_spatial_and_torch_defaults() -> None:
    bn2 = get_norm_layer("bn")(8)
    bn1 = get_norm_layer("bn")(8, spatial=False)
    assert type(bn2) is nn.BatchNorm2d and type(bn1) is nn.BatchNorm1d
    for layer in (bn1, bn2):
        assert (layer.eps, layer.momentum, layer.affine, layer.track_running_stats) == (1e-5, 0.1, True, True)


def test_gn_defaults_to_two_groups_and_ln_is_group_norm_1() -> None:
    gn = get_norm_layer("gn")(8)
    ln = get_norm_layer("ln")(8)
    assert isinstance(gn, nn.GroupNorm) and gn.num_groups == 2 and gn.num_channels == 8
    assert isinstance(ln, nn.GroupNorm) and ln.num_groups == 1
    assert isinstance(get_norm_layer("gn")(8, spatial=False), nn.GroupNorm)


def test_ln_on_features_equals_layer_norm() -> None:
    x = torch.randn(5, 12, dtype=torch.float64)
    ln = get_norm_layer("ln")(12, spatial=False).double()
    torch.testing.assert_close(ln(x), nn.functional.layer_norm(x, (12,), eps=1e-5))


def test_ln_on_maps_normalizes_over_chw() -> None:
    x = torch.randn(3, 4, 5, 5, dtype=torch.float64)
    out = get_norm_layer("ln")(4).double()(x)
    torch.testing.assert_close(out, nn.functional.layer_norm(x, (4, 5, 5), eps=1e-5))


def test_gn_divisibility_error_names_the_fix() -> None:
    with pytest.raises(ValueError, match=r"num_features \(C=15\) must be divisible by num_groups \(G=2\)") as info:
        get_norm_layer("gn")(15)
    assert "num_groups" in str(info.value) and "[1, 3, 5, 15]" in str(info.value)
    with pytest.raises(ValueError, match="num_groups must be a positive integer"):
        get_norm_layer("gn", num_groups=0)(8)


def test_none_is_identity() -> None:
    assert isinstance(get_norm_layer("none")(8), nn.Identity)
    assert isinstance(get_norm_layer(None)(8), nn.Identity)
    assert isinstance(get_norm_layer(None)(8, spatial=False), nn.Identity)


def test_get_norm_layer_string_binds_kwargs_and_normalizes_case() -> None:
    layer = get_norm_layer("BN", momentum=0.01, eps=1e-3)(4)
    assert (layer.momentum, layer.eps) == (0.01, 1e-3)
    assert get_norm_layer("gn", num_groups=4)(8).num_groups == 4


def test_get_norm_layer_class() -> None:
    norm_layer = get_norm_layer(nn.BatchNorm2d)
    assert type(norm_layer(4)) is nn.BatchNorm2d
    assert type(norm_layer(4, spatial=False)) is nn.BatchNorm1d  # 2d/1d follow spatial
    assert type(get_norm_layer(nn.BatchNorm1d)(4)) is nn.BatchNorm2d
    gn = get_norm_layer(nn.GroupNorm, num_groups=4)(8)  # channel-first call
    assert (gn.num_groups, gn.num_channels) == (4, 8)
    assert type(get_norm_layer(nn.LayerNorm)(8, spatial=False)) is nn.LayerNorm
    with pytest.raises(ValueError, match="norm='ln'"):
        get_norm_layer(nn.LayerNorm)(8)
    with pytest.raises(ValueError, match="Linear"):
        get_norm_layer(nn.InstanceNorm2d)(8, spatial=False)
    assert type(get_norm_layer(nn.InstanceNorm1d)(8)) is nn.InstanceNorm2d
    assert isinstance(get_norm_layer(nn.SyncBatchNorm)(8, spatial=False), nn.SyncBatchNorm)  # rank-agnostic
    with pytest.raises(TypeError, match="lazy"):
        get_norm_layer(nn.LazyBatchNorm2d)(8)
    with pytest.raises(TypeError, match="nn.Module subclass"):
        get_norm_layer(int)


def test_get_norm_layer_partial() -> None:
    layer = get_norm_layer(functools.partial(nn.BatchNorm2d, eps=1e-3), momentum=0.2)(4, spatial=False)
    assert type(layer) is nn.BatchNorm1d and (layer.eps, layer.momentum) == (1e-3, 0.2)
    gn = get_norm_layer(functools.partial(nn.GroupNorm, 4))(8)  # positional args: called as p(C)
    assert (gn.num_groups, gn.num_channels) == (4, 8)
    bound = get_norm_layer(functools.partial(create_batch_norm, momentum=0.3))(4, spatial=False)
    assert type(bound) is nn.BatchNorm1d and bound.momentum == 0.3


def test_get_norm_layer_callable() -> None:
    plain = get_norm_layer(lambda c: nn.GroupNorm(4, c))
    assert plain(8, spatial=False).num_groups == 4  # spatial not passed to a callable without it
    seen = {}

    def builder(c: int, *, spatial: bool = True, scale: float = 1.0) -> nn.Module:
        seen.update(c=c, spatial=spatial, scale=scale)
        return nn.Identity()

    get_norm_layer(builder, scale=2.0)(5, spatial=False)
    assert seen == {"c": 5, "spatial": False, "scale": 2.0}


def test_get_norm_layer_is_idempotent() -> None:
    for spec in ("bn", "gn", None, nn.BatchNorm2d, functools.partial(nn.BatchNorm2d, eps=1e-3)):
        once = get_norm_layer(spec)
        twice = get_norm_layer(once)
        assert type(once(4, spatial=False)) is type(twice(4, spatial=False))
        assert type(once(4)) is type(twice(4))


def test_get_norm_layer_errors() -> None:
    with pytest.raises(UnknownNameError, match="Did you mean 'bn'"):
        get_norm_layer("bnn")
    with pytest.raises(TypeError, match="norm must be"):
        get_norm_layer(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="instance"):
        get_norm_layer(nn.BatchNorm2d(4))


def test_is_batch_norm_and_norm_modules_select_by_type() -> None:
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.BatchNorm2d(4),
        nn.GroupNorm(2, 4),
        nn.InstanceNorm2d(4),
        nn.Flatten(),
        nn.LayerNorm(4),
        nn.Identity(),
    )
    model.add_module("weird_bn_name", nn.ReLU())  # names never matter
    found = norm_modules(model)
    assert [name for name, _ in found] == ["1", "2", "3", "5"]
    assert [is_batch_norm(m) for _, m in found] == [True, False, False, False]
    assert norm_modules(model, types=(nn.GroupNorm,)) == [("2", model[2])]
    assert norm_modules(nn.BatchNorm1d(3))[0][0] == ""


def _bn_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8)),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 6),
        nn.BatchNorm1d(6),
    )
    for _, m in norm_modules(model):
        nn.init.normal_(m.weight)
        nn.init.normal_(m.bias)
    return model


def test_convert_norm_to_gn_replaces_every_bn_and_copies_affine() -> None:
    model = _bn_model()
    x = torch.randn(3, 3, 5, 5)
    before = model(x).shape
    old = {name: (m.weight.detach().clone(), m.bias.detach().clone()) for name, m in norm_modules(model)}
    model.eval()
    result = convert_norm(model, "gn")
    assert result is model
    assert not any(isinstance(m, _BatchNorm) for m in model.modules())
    new = dict(norm_modules(model))
    assert set(new) == set(old)
    for name, (weight, bias) in old.items():
        assert isinstance(new[name], nn.GroupNorm) and new[name].num_groups == 2
        torch.testing.assert_close(new[name].weight.detach(), weight)
        torch.testing.assert_close(new[name].bias.detach(), bias)
        assert new[name].training is False  # carried from the old layer
    assert model(x).shape == before


def test_convert_norm_bare_bn_root_returns_new_layer() -> None:
    bn = nn.BatchNorm2d(4)
    nn.init.normal_(bn.weight)
    new = convert_norm(bn, "ln")
    assert isinstance(new, nn.GroupNorm) and new.num_groups == 1
    torch.testing.assert_close(new.weight.detach(), bn.weight.detach())


def test_convert_norm_kwargs_none_and_affine_mismatch() -> None:
    model = _bn_model()
    convert_norm(model, "gn", num_groups=1)
    assert {m.num_groups for _, m in norm_modules(model)} == {1}
    assert norm_modules(convert_norm(_bn_model(), "none")) == []
    static = nn.Sequential(nn.BatchNorm2d(4, affine=False))
    converted = convert_norm(static, "gn")
    torch.testing.assert_close(converted[0].weight.detach(), torch.ones(4))  # nothing to copy


def test_convert_norm_to_batch_norm_carries_running_stats_and_dtype() -> None:
    model = _bn_model().double()
    model.train()
    model(torch.randn(4, 3, 5, 5, dtype=torch.float64))
    stats = {n: (m.running_mean.clone(), m.running_var.clone()) for n, m in norm_modules(model)}
    model[1].weight.requires_grad_(False)
    convert_norm(model, functools.partial(nn.BatchNorm2d, momentum=0.5))
    for name, m in norm_modules(model):
        assert m.momentum == 0.5 and m.weight.dtype == torch.float64
        torch.testing.assert_close(m.running_mean, stats[name][0])
        torch.testing.assert_close(m.running_var, stats[name][1])
        assert int(m.num_batches_tracked) == 1
    assert type(model[7]) is nn.BatchNorm1d
    assert model[1].weight.requires_grad is False


def test_convert_norm_leaves_non_bn_norms_alone() -> None:
    model = nn.Sequential(nn.GroupNorm(2, 4), nn.BatchNorm2d(4))
    gn = model[0]
    convert_norm(model, "ln")
    assert model[0] is gn and model[1].num_groups == 1
