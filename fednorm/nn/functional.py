"""Pure functions behind fednorm's norm layers; the equations are tested against these.

Statistics that cross clients always travel as ``(count, mean, biased variance)`` and are
pooled exactly (within-client plus between-client terms), never averaged naively: the naive
average of variances misses the spread of the client means (FBN §3, HBN Eq. 8).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .comm import ClientComm, LocalClientComm

__all__ = ["channel_stats", "pooled_stats", "cross_client_batch_norm", "batch_norm_with_stats_backward"]


def _reduce_dims(x: torch.Tensor) -> list[int]:
    return [0] + list(range(2, x.dim()))


def channel_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-channel ``(count, mean, biased variance)`` of ``x`` (N×C or N×C×...), as BN computes them."""
    dims = _reduce_dims(x)
    count = torch.tensor(float(x.numel() // x.shape[1]), dtype=x.dtype, device=x.device)
    mean = x.mean(dim=dims)
    var = x.var(dim=dims, unbiased=False)
    return count, mean, var


def pooled_stats(
    count: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, *, unbiased: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact statistics of the union of K groups from their ``(count [K], mean [K,C], var [K,C])``.

    ``var`` are biased (1/n) within-group variances. Returns ``(total count, mean, variance)``
    where the variance is biased, or Bessel-corrected (÷(N−1), HBN Eq. 8) with ``unbiased``.
    Empty groups (count 0) contribute nothing.
    """
    count = count.to(mean.dtype)
    total = count.sum()
    w = (count / total).unsqueeze(-1)
    mu = (w * mean).sum(dim=0)
    m2 = (count.unsqueeze(-1) * (var + (mean - mu) ** 2)).sum(dim=0)
    return total, mu, m2 / (total - 1 if unbiased else total)


def cross_client_batch_norm(
    xs: Sequence[torch.Tensor],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    client_weights: torch.Tensor | None = None,
    eps: float = 1e-5,
    comm: ClientComm | None = None,
) -> list[torch.Tensor]:
    """Batch-normalise every client's batch with statistics aggregated over all clients.

    FedTAN's synchronised step (Wang et al., 2023, Sec. 5.2, Algorithm 2): the global mean is the
    p-weighted sum of client means (one exchange), then each client's variance *around the
    global mean* is p-weighted and summed (a second). With ``p_i = B_i / ΣB`` (the default)
    these are exactly the statistics of the union batch, so each client's output equals
    centralized BatchNorm on the union batch restricted to its rows. In the backward pass the
    clients' gradients with respect to the mean and the variance are summed together in one
    exchange (Algorithm 3, Eq. 41), so a layer costs the paper's three exchanges.

    Args:
        xs: one ``B_i × C × ...`` tensor per client (batch sizes may differ).
        weight, bias: shared affine parameters ``[C]`` (optional).
        client_weights: ``p_i``, summing to one over all clients (default: proportional to
            the number of normalised values here; pass them when ``comm`` spans processes).
        eps: added to the variance.
        comm: the cross-client exchange (default: in-process); it counts the traffic.
    """
    comm = comm or LocalClientComm()
    counts = torch.stack([torch.tensor(float(x.numel() // x.shape[1]), dtype=x.dtype, device=x.device) for x in xs])
    p = (counts / counts.sum() if client_weights is None else client_weights.to(xs[0].dtype)).unsqueeze(-1)
    c = xs[0].shape[1]
    means = torch.stack([x.mean(dim=_reduce_dims(x)) for x in xs])
    mu = comm.reduce(p * means)
    shape = [1, -1] + [1] * (xs[0].dim() - 2)
    # around the global mean, a constant here: its gradient path sums to zero over clients (docs/fedtan.md, A2)
    dev = torch.stack([((x - mu.view(shape)) ** 2).mean(dim=_reduce_dims(x)) for x in xs])
    var = comm.reduce(p * dev)
    stats = comm.shared(torch.cat([p * means, p * dev], dim=-1), torch.cat([mu, var]))  # [K, 2C]
    outs = []
    for i, x in enumerate(xs):
        y = (x - stats[i, :c].view(shape)) * torch.rsqrt(stats[i, c:] + eps).view(shape)
        if weight is not None:
            y = y * weight.view(shape)
        if bias is not None:
            y = y + bias.view(shape)
        outs.append(y)
    return outs


def batch_norm_with_stats_backward(
    g: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, weight: torch.Tensor | None, eps: float,
    *, input_grad: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of ``y = (x − μ)·rsqrt(σ² + ε)·γ + β`` per channel where ``μ, σ²`` are inputs in
    their own right (HBN's mixed statistics, FedTAN's synchronised ones), on BatchNorm's native
    inference backward: one fused pass gives ``g·γ·rstd`` (the direct part of ``∂L/∂x``),
    ``Σg·(x − μ)·rstd`` (``∂L/∂γ``) and ``Σg`` (``∂L/∂β``); the statistics' gradients follow
    per channel. Memory-format aware, so channels-last activations stay fast.

    Returns:
        ``(grad_x_direct or None, ∂L/∂μ, ∂L/∂σ², ∂L/∂γ, ∂L/∂β)``, the last four ``[C]``.
    """
    rstd = (var + eps).rsqrt_()
    gamma = torch.ones_like(rstd) if weight is None else weight
    grad_x, grad_gamma, sum_g = torch.ops.aten.native_batch_norm_backward(
        g, x, gamma, mean, var, mean, rstd, False, eps, [input_grad, True, True]  # CUDA asserts the saved pair is given
    )
    scale = rstd * gamma
    grad_mean = (scale * sum_g).neg_()                 # −γ·rstd·Σg
    grad_var = (scale * rstd * grad_gamma).mul_(-0.5)  # −½γ·rstd³·Σg(x − μ)
    return grad_x, grad_mean, grad_var, grad_gamma, sum_g
