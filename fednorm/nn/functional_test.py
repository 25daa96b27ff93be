import pytest
import torch
import torch.nn.functional as F

from fednorm.nn.comm import LocalClientComm
from fednorm.nn.functional import batch_norm_with_stats_backward, channel_stats, cross_client_batch_norm, pooled_stats


def _clients(sizes, c=3, spatial=(4, 5), seed=0):
    g = torch.Generator().manual_seed(seed)
    # different means and scales per client: a non-IID feature shift
    return [torch.randn(b, c, *spatial, generator=g, dtype=torch.float64) * (1 + i) + 2 * i for i, b in enumerate(sizes)]


def test_pooled_stats_equal_union_stats():
    xs = _clients([2, 5, 1, 7])
    stats = [channel_stats(x) for x in xs]
    n, mu, var = pooled_stats(*(torch.stack(s) for s in zip(*stats)))
    union = torch.cat(xs)
    torch.testing.assert_close(mu, union.mean(dim=(0, 2, 3)), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(var, union.var(dim=(0, 2, 3), unbiased=False), rtol=1e-13, atol=1e-13)
    _, _, var_u = pooled_stats(*(torch.stack(s) for s in zip(*stats)), unbiased=True)
    torch.testing.assert_close(var_u, union.var(dim=(0, 2, 3), unbiased=True), rtol=1e-13, atol=1e-13)
    assert int(n) == union.numel() // 3


def test_naive_variance_average_is_biased_low():
    xs = _clients([4, 4])
    means, vars_ = zip(*[(x.mean(dim=(0, 2, 3)), x.var(dim=(0, 2, 3), unbiased=False)) for x in xs])
    naive = torch.stack(vars_).mean(0)
    exact = torch.cat(xs).var(dim=(0, 2, 3), unbiased=False)
    assert (naive < exact).all()


def test_cross_client_bn_forward_and_gradients_equal_centralized_bn_on_union():
    sizes = [3, 6, 2]
    xs = [x.requires_grad_() for x in _clients(sizes)]
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    comm = LocalClientComm()
    ys = cross_client_batch_norm(xs, w, b, comm=comm)
    target = [torch.randn_like(y) for y in ys]
    # p-weighted sum of client mean losses == union mean loss when p_i = B_i / B
    p = torch.tensor(sizes, dtype=torch.float64) / sum(sizes)
    loss = sum(p[i] * ((ys[i] - target[i]) ** 2).mean() for i in range(3))
    grads = torch.autograd.grad(loss, xs + [w, b])

    xu = torch.cat([x.detach() for x in xs]).requires_grad_()
    wu, bu = w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    yu = F.batch_norm(xu, None, None, wu, bu, training=True, eps=1e-5)
    for y, y_ref in zip(ys, yu.split(sizes)):
        torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    loss_u = ((yu - torch.cat(target)) ** 2).mean()
    gx, gw, gb = torch.autograd.grad(loss_u, [xu, wu, bu])
    torch.testing.assert_close(torch.cat(grads[:3]), gx, rtol=1e-11, atol=1e-13)
    torch.testing.assert_close(grads[3], gw, rtol=1e-11, atol=1e-13)
    torch.testing.assert_close(grads[4], gb, rtol=1e-11, atol=1e-13)
    # the mean, then the variance around it; backward: both statistics' gradients together
    assert comm.traffic.exchanges == 3
    assert comm.traffic.uplink_bytes == 3 * (3 + 3 + 2 * 3) * 8  # 3 clients, C = 3, float64
    assert comm.traffic.broadcast_bytes == (3 + 3 + 2 * 3) * 8


def test_cross_client_bn_differs_from_local_bn_under_shift():
    xs = _clients([4, 4])
    ys = cross_client_batch_norm(xs)
    local = F.batch_norm(xs[0], None, None, training=True)
    assert not torch.allclose(ys[0], local)


@pytest.mark.parametrize("shape, channels_last", [((5, 3), False), ((4, 3, 5, 2), False), ((4, 3, 5, 2), True)])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_with_stats_backward_equals_autograd(shape, channels_last, affine):
    """The native-kernel backward of normalising with statistics that are inputs (HBN's mixed,
    FedTAN's synchronised ones) against autograd through the formula, in float64."""
    gen = torch.Generator().manual_seed(5)
    c = shape[1]
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * 1.5 + 0.3
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    if channels_last:
        x, g = x.contiguous(memory_format=torch.channels_last), g.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    mean = torch.randn(c, generator=gen, dtype=torch.float64, requires_grad=True)
    var = (torch.rand(c, generator=gen, dtype=torch.float64) + 0.5).requires_grad_()
    weight = torch.randn(c, generator=gen, dtype=torch.float64, requires_grad=True) if affine else None
    view = [1, -1] + [1] * (len(shape) - 2)
    y = (x - mean.view(view)) / torch.sqrt(var.view(view) + 1e-5)
    if affine:
        y = y * weight.view(view)
    leaves = [x, mean, var] + ([weight] if affine else [])
    want = torch.autograd.grad(y, leaves, g)
    gx, gm, gv, gw, gb = batch_norm_with_stats_backward(g, x.detach(), mean.detach(), var.detach(),
                                                        None if weight is None else weight.detach(), 1e-5)
    got = [gx, gm, gv] + ([gw] if affine else [])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)
    torch.testing.assert_close(gb, g.sum(dim=[0] + list(range(2, len(shape)))), rtol=0, atol=1e-11)
