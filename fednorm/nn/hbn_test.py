"""Tests for fednorm.nn.hbn: HBN equations (Eqs. 1, 9, 10), eval path, statistics pass (Eq. 7/8), converters."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fednorm.nn import hbn  # noqa: F401  (registers the "hbn" norm)
from fednorm.nn.functional import pooled_stats
from fednorm.nn.hbn import (
    HybridBatchNorm,
    HybridBatchNorm1d,
    HybridBatchNorm2d,
    collect_hbn_statistics,
    convert_to_batchnorm,
    convert_to_hybrid,
    hybrid_batch_norm,
)
from fednorm.nn.norms import get_norm_layer

D = torch.float64


def _layer(c: int = 3, cls: type = HybridBatchNorm2d, seed: int = 0) -> HybridBatchNorm:
    g = torch.Generator().manual_seed(seed)
    layer = cls(c, dtype=D)
    with torch.no_grad():
        layer.weight.copy_(torch.rand(c, generator=g, dtype=D) + 0.5)
        layer.bias.copy_(torch.randn(c, generator=g, dtype=D))
        layer.running_mean.copy_(torch.randn(c, generator=g, dtype=D))
        layer.running_var.copy_(torch.rand(c, generator=g, dtype=D) + 0.5)
    return layer


def _x(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=D) * 2 + 0.7


def test_layer_defaults_and_roles() -> None:
    layer = HybridBatchNorm2d(4)
    assert isinstance(layer, _BatchNorm)
    assert torch.equal(layer.alpha, torch.zeros(4)) and torch.equal(layer.batch_weight, torch.full((4,), 0.5))
    assert torch.equal(layer.global_mean, torch.zeros(4)) and torch.equal(layer.global_var, torch.ones(4))
    assert layer.global_mean is layer.running_mean and layer.global_var is layer.running_var
    assert layer.local_tensors == ("alpha",) and layer.stat_buffers == ("running_mean", "running_var")
    assert "momentum" not in repr(layer) and "eps=1e-05" in repr(layer)
    with torch.no_grad():
        layer.alpha.fill_(3.0)
        layer.running_mean.fill_(2.0)
    layer.reset_parameters()
    assert torch.equal(layer.alpha, torch.zeros(4)) and torch.equal(layer.running_mean, torch.zeros(4))


@pytest.mark.parametrize("cls,shape", [(HybridBatchNorm2d, (5, 3, 4, 4)), (HybridBatchNorm1d, (6, 3)), (HybridBatchNorm1d, (4, 3, 7))])
def test_alpha_zero_is_exact_half_mix_eq9(cls: type, shape: tuple[int, ...]) -> None:
    layer = _layer(cls=cls).train()
    x = _x(*shape)
    dims = [0] + list(range(2, x.dim()))
    mu = 0.5 * x.mean(dims) + 0.5 * layer.running_mean
    var = 0.5 * x.var(dims, unbiased=False) + 0.5 * layer.running_var
    view = [1, -1] + [1] * (x.dim() - 2)
    ref = (x - mu.view(view)) / torch.sqrt(var.view(view) + 1e-5) * layer.weight.view(view) + layer.bias.view(view)
    torch.testing.assert_close(layer(x), ref, rtol=1e-12, atol=1e-12)


def test_large_alpha_limits_global_and_batch() -> None:
    layer = _layer().train()
    x = _x(5, 3, 4, 4)
    with torch.no_grad():
        layer.alpha.fill_(60.0)  # w = sigmoid(-60) ≈ 1e-26: global only
    ref_global = F.batch_norm(x, layer.running_mean, layer.running_var, layer.weight, layer.bias, False, 0.0, 1e-5)
    torch.testing.assert_close(layer(x), ref_global, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        layer.alpha.fill_(-60.0)  # w ≈ 1: batch only = BN training output
    ref_batch = F.batch_norm(x, None, None, layer.weight, layer.bias, True, 0.0, 1e-5)
    torch.testing.assert_close(layer(x), ref_batch, rtol=1e-12, atol=1e-12)


def test_eval_uses_global_stats_only_and_ignores_batch() -> None:
    layer = _layer().eval()
    with torch.no_grad():
        layer.alpha.fill_(-2.0)  # alpha must be ignored in eval
    x = _x(4, 3, 5, 5)
    out = layer(x)
    ref = F.batch_norm(x, layer.running_mean, layer.running_var, layer.weight, layer.bias, False, 0.0, 1e-5)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    x2 = torch.cat([x[:1], _x(3, 3, 5, 5, seed=9) * 10])
    torch.testing.assert_close(layer(x2)[:1], out[:1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(layer(x[:1]), out[:1], rtol=1e-12, atol=1e-12)  # batch size 1


def test_gradcheck_input_alpha_weight_bias() -> None:
    x = _x(3, 2, 2, 2).requires_grad_()
    alpha = torch.tensor([0.3, -0.4], dtype=D, requires_grad=True)
    weight = torch.tensor([1.2, 0.7], dtype=D, requires_grad=True)
    bias = torch.tensor([0.1, -0.2], dtype=D, requires_grad=True)
    gm, gv = torch.tensor([0.5, -0.1], dtype=D), torch.tensor([1.5, 0.8], dtype=D)

    def f(x, alpha, weight, bias):  # type: ignore[no-untyped-def]
        return hybrid_batch_norm(x, gm, gv, alpha, weight, bias, training=True)

    assert torch.autograd.gradcheck(f, (x, alpha, weight, bias))
    layer = _layer(2).train()
    layer(x).pow(2).sum().backward()
    for t in (layer.alpha, layer.weight, layer.bias, x):
        assert t.grad is not None and t.grad.abs().sum() > 0
    assert layer.running_mean.grad is None


@pytest.mark.parametrize("shape, channels_last", [((6, 3), False), ((4, 3, 5), False), ((3, 3, 4, 2), False), ((3, 3, 4, 2), True)])
@pytest.mark.parametrize("affine", [True, False])
def test_fused_gradients_equal_autograd_through_the_equations(shape: tuple[int, ...], channels_last: bool, affine: bool) -> None:
    """The hand-written backward (on BatchNorm's native kernels, in either memory format) against
    autograd through Eqs. 1, 9, 10 written out op by op."""
    gen = torch.Generator().manual_seed(3)
    c = shape[1]
    x = torch.randn(shape, generator=gen, dtype=D) * 2 + 0.7
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    alpha = torch.randn(c, generator=gen, dtype=D).requires_grad_()
    weight = torch.randn(c, generator=gen, dtype=D).requires_grad_() if affine else None
    bias = torch.randn(c, generator=gen, dtype=D).requires_grad_() if affine else None
    gm, gv = torch.randn(c, generator=gen, dtype=D), torch.rand(c, generator=gen, dtype=D) + 0.5
    g = torch.randn(shape, generator=gen, dtype=D)
    leaves = [t for t in (x, alpha, weight, bias) if t is not None]

    dims = [0] + list(range(2, len(shape)))
    view = [1, -1] + [1] * (len(shape) - 2)
    w = torch.sigmoid(-alpha)
    mu = w * x.mean(dims) + (1 - w) * gm
    var = w * ((x - x.mean(dims).view(view)) ** 2).mean(dims) + (1 - w) * gv
    ref = (x - mu.view(view)) / torch.sqrt(var.view(view) + 1e-5)
    if affine:
        ref = ref * weight.view(view) + bias.view(view)  # type: ignore[union-attr]
    expected = torch.autograd.grad(ref, leaves, g)
    out = hybrid_batch_norm(x, gm, gv, alpha, weight, bias, training=True)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for got, want in zip(torch.autograd.grad(out, leaves, g), expected):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-11)


def test_forward_never_changes_global_stats() -> None:
    layer = _layer()
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    layer.train()(_x(5, 3, 4, 4))
    layer.eval()(_x(5, 3, 4, 4))
    for k, v in layer.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_bad_input_dim_raises() -> None:
    with pytest.raises(ValueError, match="expected 4D input"):
        HybridBatchNorm2d(3)(torch.randn(2, 3))
    with pytest.raises(ValueError, match="expected 2D or 3D input"):
        HybridBatchNorm1d(3)(torch.randn(2, 3, 4, 4))


def test_bn_checkpoint_loads_strictly() -> None:
    bn = nn.BatchNorm2d(3)
    bn.running_mean.fill_(0.3)
    layer = HybridBatchNorm2d(3)
    layer.load_state_dict(bn.state_dict())  # strict, no alpha in the checkpoint
    assert torch.equal(layer.global_mean, bn.running_mean) and torch.equal(layer.alpha, torch.zeros(3))


def test_norm_registry_builds_hbn() -> None:
    assert type(get_norm_layer("hbn")(8)) is HybridBatchNorm2d
    assert type(get_norm_layer("hbn")(8, spatial=False)) is HybridBatchNorm1d
    assert get_norm_layer("hbn", eps=1e-3)(8).eps == 1e-3


class _TwoHBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.n1 = HybridBatchNorm2d(3)
        self.fc = nn.Linear(3 * 4 * 4, 5)
        self.n2 = HybridBatchNorm1d(5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.n2(self.fc(torch.relu(self.n1(self.conv(x))).flatten(1)))


def _inputs(model: _TwoHBN, batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Slow reference: the concatenated inputs of each HBN layer, recomputed layer by layer."""
    # the train-mode forward of n1 depends on the batch, so recompute it batch by batch
    a1 = [model.conv(b) for b in batches]
    a2 = [model.fc(torch.relu(model.n1(a)).flatten(1)) for a in a1]
    return {"n1": torch.cat(a1), "n2": torch.cat(a2)}


@pytest.mark.parametrize("channels_last", [False, True])
def test_statistics_pass_is_exact_and_pools_to_union_eq7_eq8(channels_last: bool) -> None:
    """Exact per client and pooled to the union, in either memory format of the pass's batches."""
    torch.manual_seed(0)
    model = _TwoHBN().double()
    with torch.no_grad():
        model.n1.running_mean.fill_(0.2)
        model.n1.alpha.fill_(0.5)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.eval()
    clients = [[_x(4, 2, 4, 4, seed=s) for s in (1, 2, 3)], [_x(3, 2, 4, 4, seed=s) * 3 for s in (4, 5)]]
    stats = [collect_hbn_statistics(model, [(b, None) for b in batches], channels_last=channels_last) for batches in clients]
    assert not model.training and not model.n1.training  # flags restored
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    model.train()
    with torch.no_grad():
        refs = [_inputs(model, batches) for batches in clients]
    for name in ("n1", "n2"):
        for st, ref in zip(stats, refs):
            ref = ref[name]
            dims = [0] + list(range(2, ref.dim()))
            assert st[name].count.item() == ref.numel() // ref.shape[1]
            torch.testing.assert_close(st[name].mean, ref.mean(dims), rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(st[name].var, ref.var(dims, unbiased=False), rtol=1e-12, atol=1e-12)
        union = torch.cat([r[name] for r in refs])
        dims = [0] + list(range(2, union.dim()))
        count = torch.stack([s[name].count for s in stats])
        mean = torch.stack([s[name].mean for s in stats])
        var = torch.stack([s[name].var for s in stats])
        _, mu, var_g = pooled_stats(count, mean, var, unbiased=True)
        torch.testing.assert_close(mu, union.mean(dims), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(var_g, union.var(dims, unbiased=True), rtol=1e-12, atol=1e-12)


def test_statistics_pass_eval_mode_and_empty_batches() -> None:
    model = _TwoHBN().double()
    b = _x(4, 2, 4, 4)
    st = collect_hbn_statistics(model, [b], train_mode=False)
    with torch.no_grad():
        a = model.conv(b)
    torch.testing.assert_close(st["n1"].mean, a.mean((0, 2, 3)), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="empty"):
        collect_hbn_statistics(model, [])


def test_convert_round_trip_keeps_weights_and_stats() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.Flatten(), nn.Linear(12, 4), nn.BatchNorm1d(4)).double()
    model.train()(_x(6, 2, 4, 4))  # populate running stats
    model.eval()
    x = _x(5, 2, 4, 4, seed=3)
    ref_out = model(x)
    ref_state = {k: v.clone() for k, v in model.state_dict().items()}
    hyb = convert_to_hybrid(model)
    assert type(hyb[1]) is HybridBatchNorm2d and type(hyb[4]) is HybridBatchNorm1d
    assert hyb[1].weight.dtype == D and not hyb[1].training
    torch.testing.assert_close(hyb[1].global_mean, ref_state["1.running_mean"], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(hyb(x), ref_out, rtol=1e-12, atol=1e-12)  # eval path is BN's eval path
    back = convert_to_batchnorm(hyb)
    assert type(back[1]) is nn.BatchNorm2d and type(back[4]) is nn.BatchNorm1d
    assert back.state_dict().keys() == ref_state.keys()
    for k, v in back.state_dict().items():
        assert torch.equal(v, ref_state[k]), k
    root = convert_to_hybrid(nn.BatchNorm2d(3).train())
    assert type(root) is HybridBatchNorm2d and root.training
    assert type(convert_to_batchnorm(root)) is nn.BatchNorm2d
    with pytest.raises(ValueError, match="BatchNorm3d"):
        convert_to_hybrid(nn.BatchNorm3d(2))


def test_simple_cnn_with_hbn_trains_a_step() -> None:
    from fednorm.models import get_model

    torch.manual_seed(0)
    model = get_model("simple_cnn", norm="hbn")
    layers = [m for m in model.modules() if isinstance(m, HybridBatchNorm)]
    assert len(layers) == 3
    stats_before = [m.running_mean.clone() for m in layers]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    loss = F.cross_entropy(model.train()(x), y)
    loss.backward()
    opt.step()
    assert all(not torch.equal(m.alpha, torch.zeros_like(m.alpha)) for m in layers)
    assert all(torch.equal(m.running_mean, s) for m, s in zip(layers, stats_before))
    assert model.eval()(x).shape == (4, 10)
