"""Stacked BatchNorm (per client, or synchronised over clients as FedTAN's step), GroupNorm and
feature normalization, plus the switches the engine sets on a stacked model's norm layers."""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..comm import ClientComm, GroupedClientComm, LocalClientComm
from ..functional import batch_norm_with_stats_backward
from .layout import NotStackableError, repeat_clients

__all__ = [
    "StackedBatchNorm",
    "StackedGroupNorm",
    "ClientFeatureNorm",
    "set_client_comm",
    "set_row_mask",
    "set_frozen_statistics",
    "set_forward_clients",
    "forward_clients",
]


def set_client_comm(model: nn.Module, comm: ClientComm | None, *, backward: bool = True) -> nn.Module:
    """Make every :class:`StackedBatchNorm` of a stacked model normalise training batches with
    statistics pooled over clients through ``comm`` (FedTAN's synchronised step), or per client
    again with ``None``.

    With ``backward=False`` only the forward statistics are shared; each client backpropagates
    as if its own batch statistics were used (the paper's "FedAvg + Algorithm 2" baseline).
    """
    for m in model.modules():
        if isinstance(m, StackedBatchNorm):
            m.comm = comm
            m.sync_backward = backward
    return model


def set_row_mask(model: nn.Module, mask: torch.Tensor | None, *, total_rows: int | None = None,
                 row_sizes: Sequence[int] | None = None) -> nn.Module:
    """Mark which rows of each client's (padded) batch are real: ``mask`` is ``[B, K]`` bool.

    Synchronised BatchNorm then leaves padded rows out of every statistic, so clients with
    different batch sizes can share one stacked forward pass exactly.

    ``total_rows`` is the number of real rows over *every* participating client, these and
    those elsewhere (other processes); ``None``: the real rows here. The count weights
    ``B_i/ΣB`` need ``ΣB``; like the paper's weights ``p_i`` it is known to every party in
    advance, so it costs no exchange. ``row_sizes``: each client's real rows (the mask's column
    sums) as the host knows them, so that no layer reads the device for ``ΣB``.
    """
    for m in model.modules():
        if isinstance(m, StackedBatchNorm):
            m.row_mask = mask
            m.total_rows = total_rows
            m.row_sizes = None if mask is None or row_sizes is None else list(row_sizes)
    return model


def set_frozen_statistics(model: nn.Module, frozen: bool) -> nn.Module:
    """Make every :class:`StackedBatchNorm` normalise with its running statistics in training too
    and stop updating them (FedTAN-II after its switch round)."""
    for m in model.modules():
        if isinstance(m, StackedBatchNorm):
            m.frozen = frozen
    return model


def set_forward_clients(model: nn.Module, clients: torch.Tensor | None) -> nn.Module:
    """Tell the stacked norm layers which clients the rows of the next forward passes are:
    ``clients[j]`` is the stacked-model row (client position) of the pass's j-th client (the
    executor runs subsets of a chunk once clients run out of batches). Layers that record
    per-client statistics (:class:`~fednorm.nn.stacked.fbn.StackedFederatedBatchNorm`) tag them
    with it; ``None``: all rows, in order. The root records it too, for hooks on the model
    (:func:`forward_clients`)."""
    model.__dict__["_forward_clients"] = clients
    for m in model.modules():
        if isinstance(m, StackedBatchNorm):
            m.forward_clients = clients
    return model


def forward_clients(model: nn.Module) -> torch.Tensor | None:
    """The client rows of a stacked model's current forward passes, as last set by
    :func:`set_forward_clients` on it (``None``: all rows, in order). Forward hooks that apply a
    per-client transform (FedLC's and FedRS's logits) read it."""
    return model.__dict__.get("_forward_clients")


class StackedBatchNorm(nn.Module):
    """K clients' BatchNorm: statistics per client and channel; buffers ``[K, C]``, counter ``[K]``.

    With a :class:`~fednorm.nn.comm.ClientComm` in ``comm`` (see :func:`set_client_comm`), training
    batches are instead normalised with statistics pooled over *all* clients: the count-weighted
    mean, then the count-weighted variance around that mean, each one exchange over the client
    axis — FedTAN's synchronised step (Wang et al. 2023, "Why Batch Normalization Damage Federated
    Learning on Non-IID Data?", §5, Algorithm 2, Eqs. 39–40). Every client's
    output is then centralized BatchNorm on the union batch restricted to its rows. In the
    backward pass the gradients of the pooled mean and variance travel back across clients
    together, in one exchange (Algorithm 3), so a layer costs the paper's three exchanges.
    Each client's running statistics are updated with the pooled batch statistics.
    """

    def __init__(self, bn: nn.modules.batchnorm._BatchNorm, num_clients: int) -> None:
        super().__init__()
        if bn.momentum is None:
            raise NotStackableError("BatchNorm with momentum=None (cumulative average) is not supported")
        self.num_features, self.eps, self.momentum = bn.num_features, bn.eps, bn.momentum
        self.track_running_stats = bn.track_running_stats
        self.weight = None if bn.weight is None else nn.Parameter(repeat_clients(bn.weight, num_clients))
        self.bias = None if bn.bias is None else nn.Parameter(repeat_clients(bn.bias, num_clients))
        if bn.track_running_stats:
            self.register_buffer("running_mean", repeat_clients(bn.running_mean, num_clients))
            self.register_buffer("running_var", repeat_clients(bn.running_var, num_clients))
            self.register_buffer("num_batches_tracked", repeat_clients(bn.num_batches_tracked, num_clients))
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None
        self.comm: ClientComm | None = None
        self.sync_backward = True
        self.row_mask: torch.Tensor | None = None
        self.total_rows: int | None = None
        self.row_sizes: list[int] | None = None  # the row mask's column sums, on the host
        self.frozen = False
        self.forward_clients: torch.Tensor | None = None

    def _affine(self, y: torch.Tensor, k: int) -> torch.Tensor:
        cshape = [1, k, self.num_features] + [1] * (y.dim() - 3)
        if self.weight is not None:
            y = y * self.weight.view(cshape)
        if self.bias is not None:
            y = y + self.bias.view(cshape)
        return y

    def _synced(self, x: torch.Tensor) -> torch.Tensor:
        assert self.comm is not None
        if self.total_rows is None and not isinstance(self.comm, LocalClientComm):
            raise ValueError("synchronised BatchNorm with clients elsewhere needs the step's total batch size "
                             "(set_row_mask(..., total_rows=...); synced_loss(..., total_batch=...))")
        grouped = isinstance(self.comm, GroupedClientComm)  # several runs' clients: statistics per run
        if self.row_mask is None and self.sync_backward and not grouped:
            return self._synced_fused(x)
        b, kc = x.shape[:2]
        c = self.num_features
        k = kc // c
        xv = x.reshape(b, k, c, *x.shape[2:])
        dims = [0] + list(range(3, xv.dim()))
        spatial = float(xv[0, 0, 0].numel())
        if self.row_mask is None:
            m = None
            rows = torch.full((k,), float(b), dtype=x.dtype, device=x.device)
        else:
            if self.row_mask.shape != (b, k):
                raise ValueError(f"row mask has shape {tuple(self.row_mask.shape)}, expected {(b, k)}")
            m = self.row_mask.to(x.dtype).view(b, k, 1, *([1] * (xv.dim() - 3)))
            rows = self.row_mask.to(x.dtype).sum(dim=0)
        counts = rows * spatial

        def client_mean(t: torch.Tensor) -> torch.Tensor:  # [K, C], over each client's real values
            s = t.sum(dim=dims) if m is None else (t * m).sum(dim=dims)
            return s / counts.unsqueeze(-1)

        if self.total_rows is None:
            total_rows = (self.comm.row_totals(rows, self.row_sizes) if isinstance(self.comm, LocalClientComm)
                          else float(rows.sum()))
        else:
            total_rows = (self.total_rows.to(dtype=x.dtype, device=x.device) if isinstance(self.total_rows, torch.Tensor)
                          else float(self.total_rows))
        total = total_rows * spatial  # a float, or with groups each row's group's total ([K])
        p = (counts / total).unsqueeze(-1)  # [K, 1]: count weights make the pooled statistics exact
        shape = [1, 1, c] + [1] * (xv.dim() - 3)
        cshape = [1, k, c] + [1] * (xv.dim() - 3)
        local_mean = client_mean(xv)
        mean = self.comm.reduce(p * local_mean)  # exchange 1: [C], the union mean ([K, C]: each row its group's)
        # around the union mean, a constant here: ∂σ²/∂μ̄ sums to zero over clients (Wang et al. 2023's
        # Eq. 59, ∇_μ σ² = 0, holds for that sum, not per client)
        local_var = client_mean((xv - mean.view(cshape if grouped else shape)) ** 2)
        var = self.comm.reduce(p * local_var)  # exchange 2: the biased union variance
        if self.sync_backward:
            # Each client's copy of (μ̄, σ̄²), differentiable as the p-weighted sums: the
            # backward pass sums the clients' (∇μ, ∇σ²) in one exchange (exchange 3, Wang et al. 2023, Eq. 41).
            stats = self.comm.shared(torch.cat([p * local_mean, p * local_var], dim=-1), torch.cat([mean, var], dim=-1))
            mean_k, var_k = stats[:, :c], stats[:, c:]
        else:
            # Values of the union statistics, gradients of each client's own: the mean acts as the
            # local mean, the variance as the local variance around the (constant) union mean.
            mean_k = local_mean + (mean - local_mean).detach()  # [K, C]
            var_k = local_var + (var.expand_as(local_var) - local_var).detach()
        y = (xv - mean_k.view(cshape)) * torch.rsqrt(var_k + self.eps).view(cshape)
        y = self._affine(y, k)
        if self.running_mean is not None:
            with torch.no_grad():
                n = total
                if isinstance(n, torch.Tensor):
                    unbiased = var * (n / (n - 1.0).clamp(min=1.0)).unsqueeze(-1)
                else:
                    unbiased = var * (n / max(n - 1.0, 1.0))
                self.running_mean.mul_(1 - self.momentum).add_(self.momentum * mean)
                self.running_var.mul_(1 - self.momentum).add_(self.momentum * unbiased)
        return y.reshape(x.shape)

    def _synced_fused(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`_synced` (equal batches, gradients synchronised) on BatchNorm's native kernels,
        in x's own memory format: the clients' moments from the statistics kernel, the
        normalisation with the union statistics from the inference kernel, and their backward
        passes written out (:class:`_ClientMoments`, :class:`_NormalizeWith`). The same
        exchanges, in the same order, as the tensor-op form, which stays for padded batches."""
        assert self.comm is not None
        b, kc = x.shape[:2]
        c = self.num_features
        k = kc // c
        spatial = float(x[0, 0].numel())
        total = float(b * k if self.total_rows is None else self.total_rows) * spatial
        p = torch.full((k, 1), b * spatial / total, dtype=x.dtype, device=x.device)  # count weights
        with torch.no_grad():  # their gradient is _ClientMoments's backward
            own_mean, own_var = torch.batch_norm_update_stats(x, None, None, 1.0)  # each client's, [K·C], biased
        own_mean, own_var = own_mean.view(k, c), own_var.view(k, c)
        mean = self.comm.reduce(p * own_mean)  # exchange 1: [C], the union mean
        local_mean, local_var = _ClientMoments.apply(x, own_mean, own_var, mean)  # var around the union mean
        var = self.comm.reduce(p * local_var.detach())  # exchange 2: the biased union variance
        stats = self.comm.shared(torch.cat([p * local_mean, p * local_var], dim=-1), torch.cat([mean, var]))
        mean_k, var_k = stats[:, :c], stats[:, c:]
        y = _NormalizeWith.apply(x, mean_k.reshape(-1), var_k.reshape(-1),
                                 None if self.weight is None else self.weight.reshape(-1),
                                 None if self.bias is None else self.bias.reshape(-1), self.eps)
        if self.running_mean is not None:
            with torch.no_grad():
                unbiased = var * (total / max(total - 1.0, 1.0))
                self.running_mean.mul_(1 - self.momentum).add_(self.momentum * mean)
                self.running_var.mul_(1 - self.momentum).add_(self.momentum * unbiased)
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.frozen and self.running_mean is not None:
            return F.batch_norm(
                x, self.running_mean.view(-1), self.running_var.view(-1),
                None if self.weight is None else self.weight.reshape(-1),
                None if self.bias is None else self.bias.reshape(-1),
                False, 0.0, self.eps,
            )
        if self.training and self.comm is not None:
            if self.num_batches_tracked is not None:
                self.num_batches_tracked.add_(1)
            return self._synced(x)
        use_batch = self.training or self.running_mean is None
        if self.training and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        if use_batch and x.shape[0] * (x[0, 0].numel()) <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {list(x.shape)}")
        return F.batch_norm(
            x,
            None if self.running_mean is None else self.running_mean.view(-1),
            None if self.running_var is None else self.running_var.view(-1),
            None if self.weight is None else self.weight.reshape(-1),
            None if self.bias is None else self.bias.reshape(-1),
            use_batch,
            self.momentum,
            self.eps,
        )

    def extra_repr(self) -> str:
        k = (self.weight if self.weight is not None else self.running_mean).shape[0]
        return f"clients={k}, num_features={self.num_features}, eps={self.eps}, momentum={self.momentum}"


class _ClientMoments(torch.autograd.Function):
    """Each client's mean and its variance around the union mean ``μ̄`` (a constant), ``[K, C]``,
    from the clients' own moments: ``E[(x − μ̄)²] = σ_k² + (μ_k − μ̄)²``. Backward: one pass,
    ``∂/∂x = g_mean/n + g_var·2(x − μ̄)/n`` per client and channel (``n`` values each)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, own_mean: torch.Tensor, own_var: torch.Tensor,
                union_mean: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(x, union_mean)
        return own_mean.clone(), own_var + (own_mean - union_mean).square()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, g_mean: torch.Tensor | None, g_var: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        x, union_mean = ctx.saved_tensors
        n = x.numel() // x.shape[1]
        g_mean = torch.zeros_like(g_var) if g_mean is None else g_mean
        g_var = torch.zeros_like(g_mean) if g_var is None else g_var
        a = (2.0 / n) * g_var  # [K, C]
        c = g_mean / n - a * union_mean
        view = [1, -1] + [1] * (x.dim() - 2)
        grad = torch.empty_like(x)
        torch.addcmul(c.reshape(view), x, a.reshape(view), out=grad)
        return grad, None, None, None


class _NormalizeWith(torch.autograd.Function):
    """``(x − μ)·rsqrt(σ² + ε)·γ + β`` per channel, with ``μ, σ²`` inputs that carry gradients
    (the synchronised statistics): BatchNorm's inference kernel forward, its inference backward
    for ``g·γ·rstd``, ``Σg·(x − μ)·rstd`` and ``Σg``, from which ``∂/∂μ`` and ``∂/∂σ²`` follow."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, weight: torch.Tensor | None,
                bias: torch.Tensor | None, eps: float) -> torch.Tensor:
        ctx.save_for_backward(x, mean, var, weight)
        ctx.eps = eps
        return torch.batch_norm(x, weight, bias, mean, var, False, 0.0, eps, False)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, mean, var, weight = ctx.saved_tensors
        grad_x, grad_mean, grad_var, grad_gamma, sum_g = batch_norm_with_stats_backward(
            g, x, mean, var, weight, ctx.eps, input_grad=bool(ctx.needs_input_grad[0]))
        return (grad_x, grad_mean, grad_var, grad_gamma if weight is not None else None,
                sum_g if ctx.needs_input_grad[4] else None, None)


class StackedGroupNorm(nn.Module):
    """K clients' ``GroupNorm(G, C)`` as ``GroupNorm(K·G, K·C)``; affine ``[K, C]``."""

    def __init__(self, gn: nn.GroupNorm, num_clients: int) -> None:
        super().__init__()
        self.num_groups, self.num_channels, self.eps = gn.num_groups, gn.num_channels, gn.eps
        self.weight = None if gn.weight is None else nn.Parameter(repeat_clients(gn.weight, num_clients))
        self.bias = None if gn.bias is None else nn.Parameter(repeat_clients(gn.bias, num_clients))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = x.shape[1] // self.num_channels
        w = None if self.weight is None else self.weight.reshape(-1)
        b = None if self.bias is None else self.bias.reshape(-1)
        return F.group_norm(x, k * self.num_groups, w, b, self.eps)


class ClientFeatureNorm(nn.Module):
    """The LN paper's feature normalization applied to each client's features separately."""

    def __init__(self, fn: nn.Module) -> None:
        super().__init__()
        self.inner = fn
        self.num_features = fn.num_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from ..feature_norm import feature_norm

        b = x.shape[0]
        if self.num_features is None:
            raise NotStackableError("FeatureNorm needs num_features to be run per client")
        y = feature_norm(x.reshape(b, -1, self.num_features), self.inner.eps, scale=self.inner.scale)
        return y.reshape(b, -1)

