"""FBN layer and functions: normalisation with the shared statistics, exact aggregation (Eq. 9–10)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fednorm.nn import convert_norm, get_norm_layer
from fednorm.nn.fbn import (
    FederatedBatchNorm1d,
    FederatedBatchNorm2d,
    fbn_aggregate,
    fbn_local_update,
    recording_fbn_statistics,
)

BETA = 0.1


def _union_stats(xs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, float]:
    u = torch.cat(xs)
    dims = [0, 2, 3] if u.dim() == 4 else [0]
    return u.mean(dims), u.var(dims, unbiased=True), u.numel() / u.shape[1]


def test_train_and_eval_normalise_with_the_shared_statistics_f4():
    layer = FederatedBatchNorm2d(3, momentum=BETA).double()
    with torch.no_grad():
        layer.running_mean.copy_(torch.tensor([1.0, -2.0, 0.5]))
        layer.running_var.copy_(torch.tensor([4.0, 0.25, 2.0]))
        layer.weight.copy_(torch.tensor([2.0, 1.0, -1.0]))
        layer.bias.copy_(torch.tensor([0.0, 1.0, 3.0]))
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64)
    m, v = layer.running_mean.clone(), layer.running_var.clone()
    expected = (x - m.view(1, 3, 1, 1)) / torch.sqrt(v.view(1, 3, 1, 1) + 1e-5) * layer.weight.view(1, 3, 1, 1) + layer.bias.view(1, 3, 1, 1)
    with recording_fbn_statistics(layer):
        y_train = layer.train()(x)
    y_eval = layer.eval()(x)
    torch.testing.assert_close(y_train, expected.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(y_eval, expected.detach(), rtol=0, atol=1e-12)
    assert torch.equal(layer.running_mean, m) and torch.equal(layer.running_var, v)  # recording: buffers untouched


def test_no_gradient_through_batch_statistics():
    """A sample's output and gradient do not depend on its batch peers (F5: no coupling)."""
    layer = FederatedBatchNorm2d(2).double().train()
    x = torch.randn(3, 2, 4, 4, dtype=torch.float64, requires_grad=True)
    with recording_fbn_statistics(layer):
        layer(x)[0].sum().backward()
    assert x.grad[1:].abs().max() == 0
    scale = layer.weight / torch.sqrt(layer.running_var + layer.eps)
    torch.testing.assert_close(x.grad[0], scale.view(2, 1, 1).expand(2, 4, 4).detach())


def test_single_participant_update_equals_torch_batchnorm_running_stats():
    """Without a method (one participant) the layer's running statistics follow torch BN's."""
    fbn = FederatedBatchNorm1d(4, momentum=BETA).double().train()
    bn = nn.BatchNorm1d(4, momentum=BETA).double().train()
    for _ in range(5):
        x = torch.randn(7, 4, dtype=torch.float64) * 3 + 1
        fbn(x)
        bn(x)
    torch.testing.assert_close(fbn.running_mean, bn.running_mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(fbn.running_var, bn.running_var, rtol=0, atol=1e-12)


@pytest.mark.parametrize("sizes", [[5, 5, 5], [2, 7, 3, 4], [1, 9]])
def test_aggregate_equals_centralized_update_on_the_union_f1_f7(sizes):
    """Eq. 9–10 with count weights: one step of centralized BN on the union batch (float64)."""
    torch.manual_seed(0)
    mu0, var0 = torch.randn(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64) + 0.5
    xs = [torch.randn(b, 3, 2, 3, dtype=torch.float64) * (i + 1) + 4 * i for i, b in enumerate(sizes)]
    counts, means, variances = [], [], []
    for x in xs:
        bm, bv = x.mean([0, 2, 3]), x.var([0, 2, 3], unbiased=False)
        lm, lv = fbn_local_update(mu0, var0, bm, bv, BETA)
        counts.append(x.numel() / 3)
        means.append(lm)
        variances.append(lv)
    mean, var = fbn_aggregate(torch.tensor(counts), torch.stack(means), torch.stack(variances), var0, BETA)
    um, uv, _ = _union_stats(xs)
    torch.testing.assert_close(mean, (1 - BETA) * mu0 + BETA * um, rtol=0, atol=1e-12)
    torch.testing.assert_close(var, (1 - BETA) * var0 + BETA * uv, rtol=0, atol=1e-12)


def test_naive_average_is_biased_by_the_between_client_variance_f2():
    """Naive BN: averaging the clients' torch-BN running variances misses exactly
    β·Kn/(Kn−1)·(1/n)Σ(ū_i − ū)² of centralized BN's update."""
    torch.manual_seed(3)
    n, b = 4, 6
    xs = [torch.randn(b, 2, dtype=torch.float64) + 5 * i for i in range(n)]
    local = []
    for x in xs:
        bn = nn.BatchNorm1d(2, momentum=BETA).double().train()
        bn(x)
        local.append(bn.running_var)
    central = nn.BatchNorm1d(2, momentum=BETA).double().train()
    central(torch.cat(xs))
    naive = torch.stack(local).mean(0)
    means = torch.stack([x.mean(0) for x in xs])
    kn = n * b
    between = ((means - means.mean(0)) ** 2).mean(0)
    # the within part differs by the K/(K-1) vs Kn/(Kn-1) factors; compare with the exact identity
    within_local = torch.stack([x.var(0, unbiased=False) for x in xs]).mean(0)
    naive_expected = (1 - BETA) + BETA * b / (b - 1) * within_local
    torch.testing.assert_close(naive, naive_expected, rtol=0, atol=1e-12)
    fbn_bias = naive - central.running_var - BETA * (b / (b - 1) - kn / (kn - 1)) * within_local
    torch.testing.assert_close(fbn_bias, -BETA * kn / (kn - 1) * between, rtol=0, atol=1e-12)
    assert (fbn_bias < -1.0).all()  # the clients' means differ by 5: a large bias


def test_norm_registry_and_converter_build_fbn():
    assert isinstance(get_norm_layer("fbn")(8), FederatedBatchNorm2d)
    assert isinstance(get_norm_layer("fbn")(8, spatial=False), FederatedBatchNorm1d)
    net = convert_norm(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)), "fbn")
    assert isinstance(net[1], FederatedBatchNorm2d)
    with pytest.raises(ValueError, match="momentum"):
        FederatedBatchNorm2d(2, momentum=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="more than 1 value"):
        FederatedBatchNorm1d(2).train()(torch.randn(1, 2))
