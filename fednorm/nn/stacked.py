"""Stacked models: K clients' copies of a network held inside its layers.

At the papers' small batch sizes (HBN: 4) per-step framework overhead, not arithmetic, bounds
training speed, so running clients one after another wastes most of the machine. A stacked
model keeps every activation in a *client-concatenated channel* layout ``[B, K·C, ...]``
(client k owns channels ``k·C .. (k+1)·C − 1``) and every parameter as ``[K, *shape]``:

- ``Conv2d`` becomes one grouped convolution (``groups = K·g``), each client its own filters;
- ``BatchNorm`` over ``K·C`` channels computes exactly each client's per-channel batch
  statistics, and its running statistics are ``[K, C]`` buffers;
- ``GroupNorm(G, C)`` becomes ``GroupNorm(K·G, K·C)``, whose groups never straddle clients;
- ``Linear`` is one batched matrix product over ``[K, B, in]``;
- element-wise ops, pooling and ``Flatten`` need no change, because flattening
  ``[B, K·C, H, W]`` gives client-major ``[B, K·C·H·W]``.

The stacked model's ``state_dict`` has the base model's keys with a leading client axis, which
is exactly the ``[K, ...]`` layout methods aggregate over. ``K`` is read from the parameters at
call time, so a stacked model also runs any subset of its clients through
``torch.func.functional_call``. Cross-client statistics (FedTAN, FBN) are reductions of the
``[K, C]`` view over the client axis.

A model whose forward code reshapes across channels in a way this layout does not follow would
silently compute something else, so :func:`stack_model` verifies the stacked forward against
the base model client by client before it is used, and refuses otherwise.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .comm import ClientComm, LocalClientComm
from .functional import batch_norm_with_stats_backward
from .hbn import batch_moments, hybrid_batch_norm

__all__ = [
    "NotStackableError",
    "StackedConv2d",
    "StackedStdConv2d",
    "StackedScaledStdConv2d",
    "StackedLinear",
    "StackedBatchNorm",
    "StackedFederatedBatchNorm",
    "StackedHybridBatchNorm",
    "StackedGroupNorm",
    "ClientPadShortcut",
    "stack_model",
    "set_client_comm",
    "set_row_mask",
    "set_frozen_statistics",
    "set_forward_clients",
    "forward_clients",
    "attach_stacked_fbn_recorders",
    "collect_stacked_hbn_statistics",
    "detach_stacked_fbn_recorders",
    "to_client_layout",
    "from_client_layout",
]


class NotStackableError(ValueError):
    """Raised when a model cannot be run as a stacked (vectorized) model; says which module."""


def to_client_layout(x: torch.Tensor) -> torch.Tensor:
    """``[K, B, C, ...]`` (each client's batch) -> ``[B, K·C, ...]``."""
    k, b, c = x.shape[:3]
    return x.transpose(0, 1).reshape(b, k * c, *x.shape[3:])


def from_client_layout(y: torch.Tensor, num_clients: int) -> torch.Tensor:
    """``[B, K·C, ...]`` -> ``[K, B, C, ...]``."""
    b = y.shape[0]
    return y.reshape(b, num_clients, -1, *y.shape[2:]).transpose(0, 1)


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


def set_row_mask(model: nn.Module, mask: torch.Tensor | None, *, total_rows: int | None = None) -> nn.Module:
    """Mark which rows of each client's (padded) batch are real: ``mask`` is ``[B, K]`` bool.

    Synchronised BatchNorm then leaves padded rows out of every statistic, so clients with
    different batch sizes can share one stacked forward pass exactly.

    ``total_rows`` is the number of real rows over *every* participating client, these and
    those elsewhere (other processes); ``None``: the real rows here. The count weights
    ``B_i/ΣB`` need ``ΣB``; like the paper's weights ``p_i`` it is known to every party in
    advance, so it costs no exchange.
    """
    for m in model.modules():
        if isinstance(m, StackedBatchNorm):
            m.row_mask = mask
            m.total_rows = total_rows
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
    per-client statistics (:class:`StackedFederatedBatchNorm`) tag them with it; ``None``: all
    rows, in order. The root records it too, for hooks on the model (:func:`forward_clients`)."""
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


def _repeat(t: torch.Tensor | None, k: int) -> torch.Tensor | None:
    return None if t is None else t.detach().unsqueeze(0).repeat(k, *([1] * t.dim())).contiguous()


class StackedConv2d(nn.Module):
    """K clients' ``Conv2d`` as one grouped convolution; ``weight`` is ``[K, C_out, C_in/g, kh, kw]``."""

    def __init__(self, conv: nn.Conv2d, num_clients: int) -> None:
        super().__init__()
        if conv.padding_mode != "zeros":
            raise NotStackableError(f"Conv2d with padding_mode='{conv.padding_mode}' is not supported")
        self.out_channels = conv.out_channels
        self.stride, self.padding, self.dilation, self.groups = conv.stride, conv.padding, conv.dilation, conv.groups
        self.weight = nn.Parameter(_repeat(conv.weight, num_clients), requires_grad=conv.weight.requires_grad)
        self.bias = None if conv.bias is None else nn.Parameter(_repeat(conv.bias, num_clients), requires_grad=conv.bias.requires_grad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.weight.shape[0]
        w = self.weight.reshape(k * self.out_channels, *self.weight.shape[2:])
        b = None if self.bias is None else self.bias.reshape(-1)
        return F.conv2d(x, w, b, self.stride, self.padding, self.dilation, k * self.groups)

    def extra_repr(self) -> str:
        return f"clients={self.weight.shape[0]}, weight={tuple(self.weight.shape[1:])}, stride={self.stride}, padding={self.padding}"


class StackedStdConv2d(StackedConv2d):
    """K clients' weight-standardized ``Conv2d`` (:class:`~fednorm.nn.weight_std.StdConv2d`): each
    client's filters standardized per output channel, then one grouped convolution."""

    def __init__(self, conv: nn.Conv2d, num_clients: int) -> None:
        super().__init__(conv, num_clients)
        self.eps = conv.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .weight_std import standardize_weight

        k = self.weight.shape[0]
        w = standardize_weight(self.weight, self.eps).reshape(k * self.out_channels, *self.weight.shape[2:])
        b = None if self.bias is None else self.bias.reshape(-1)
        return F.conv2d(x, w, b, self.stride, self.padding, self.dilation, k * self.groups)


class StackedScaledStdConv2d(StackedConv2d):
    """K clients' :class:`~fednorm.nn.weight_std.ScaledStdConv2d` (FedWon): each client's filters
    standardized, scaled by ``γ/sqrt(fan_in)`` and its own gain ``[K, C_out, 1, 1, 1]``."""

    def __init__(self, conv: nn.Conv2d, num_clients: int) -> None:
        super().__init__(conv, num_clients)
        self.eps, self.gamma = conv.eps, conv.gamma
        self.gain = nn.Parameter(_repeat(conv.gain, num_clients), requires_grad=conv.gain.requires_grad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .weight_std import scaled_standardize_weight

        k = self.weight.shape[0]
        w = scaled_standardize_weight(self.weight, self.gain, self.gamma, self.eps)
        w = w.reshape(k * self.out_channels, *self.weight.shape[2:])
        b = None if self.bias is None else self.bias.reshape(-1)
        return F.conv2d(x, w, b, self.stride, self.padding, self.dilation, k * self.groups)


class StackedLinear(nn.Module):
    """K clients' ``Linear`` as a batched product; input ``[B, K·in]``, ``weight`` ``[K, out, in]``."""

    def __init__(self, linear: nn.Linear, num_clients: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(_repeat(linear.weight, num_clients), requires_grad=linear.weight.requires_grad)
        self.bias = None if linear.bias is None else nn.Parameter(_repeat(linear.bias, num_clients), requires_grad=linear.bias.requires_grad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.weight.shape[0]
        b = x.shape[0]
        # Computed transposed, Y^T = W X^T ([K, out, B]): the weight is then the product's left
        # operand as stored, so its gradient comes out contiguous and autograd does not copy it
        # (with X W^T the gradient is a transposed view, copied every step: 2x slower for the
        # FedBN CNN's 6272x2048 layer, and never faster for small layers; benchmarks/stacked_linear.py).
        xt = x.reshape(b, k, self.in_features).permute(1, 2, 0)  # [K, in, B], a view
        if self.bias is None:
            yt = torch.bmm(self.weight, xt)
        else:
            yt = torch.baddbmm(self.bias.unsqueeze(2), self.weight, xt)
        return yt.permute(2, 0, 1).reshape(b, k * self.out_features)

    def extra_repr(self) -> str:
        return f"clients={self.weight.shape[0]}, in={self.in_features}, out={self.out_features}"


class StackedBatchNorm(nn.Module):
    """K clients' BatchNorm: statistics per client and channel; buffers ``[K, C]``, counter ``[K]``.

    With a :class:`~fednorm.nn.comm.ClientComm` in ``comm`` (see :func:`set_client_comm`), training
    batches are instead normalised with statistics pooled over *all* clients: the count-weighted
    mean, then the count-weighted variance around that mean, each one exchange over the client
    axis — FedTAN's synchronised step (spec/001_fedtan.md §3.2, Algorithm 2). Every client's
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
        self.weight = None if bn.weight is None else nn.Parameter(_repeat(bn.weight, num_clients))
        self.bias = None if bn.bias is None else nn.Parameter(_repeat(bn.bias, num_clients))
        if bn.track_running_stats:
            self.register_buffer("running_mean", _repeat(bn.running_mean, num_clients))
            self.register_buffer("running_var", _repeat(bn.running_var, num_clients))
            self.register_buffer("num_batches_tracked", _repeat(bn.num_batches_tracked, num_clients))
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None
        self.comm: ClientComm | None = None
        self.sync_backward = True
        self.row_mask: torch.Tensor | None = None
        self.total_rows: int | None = None
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
        if self.row_mask is None and self.sync_backward:
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

        total = (float(rows.sum()) if self.total_rows is None else float(self.total_rows)) * spatial
        p = (counts / total).unsqueeze(-1)  # [K, 1]: count weights make the pooled statistics exact
        shape = [1, 1, c] + [1] * (xv.dim() - 3)
        cshape = [1, k, c] + [1] * (xv.dim() - 3)
        local_mean = client_mean(xv)
        mean = self.comm.reduce(p * local_mean)  # exchange 1: [C], the union mean
        # around the union mean, a constant here: ∂σ²/∂μ̄ sums to zero over clients (spec A2)
        local_var = client_mean((xv - mean.view(shape)) ** 2)
        var = self.comm.reduce(p * local_var)  # exchange 2: the biased union variance
        if self.sync_backward:
            # Each client's copy of (μ̄, σ̄²), differentiable as the p-weighted sums: the
            # backward pass sums the clients' (∇μ, ∇σ²) in one exchange (exchange 3, Eq. 41).
            stats = self.comm.shared(torch.cat([p * local_mean, p * local_var], dim=-1), torch.cat([mean, var]))
            mean_k, var_k = stats[:, :c], stats[:, c:]
        else:
            # Values of the union statistics, gradients of each client's own: the mean acts as the
            # local mean, the variance as the local variance around the (constant) union mean.
            mean_k = local_mean + (mean - local_mean).detach()  # [K, C]
            var_k = local_var + (var.unsqueeze(0) - local_var).detach()
        y = (xv - mean_k.view(cshape)) * torch.rsqrt(var_k + self.eps).view(cshape)
        y = self._affine(y, k)
        if self.running_mean is not None:
            with torch.no_grad():
                n = total
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


class StackedFederatedBatchNorm(StackedBatchNorm):
    """K clients' FBN layers (:class:`~fednorm.nn.fbn.FederatedBatchNorm`): each client normalises
    with its own row of the shared running statistics (``[K, C]`` buffers), in training as in
    evaluation, so the forward is one ``F.batch_norm`` over ``K·C`` channels in eval mode.

    Training mode adds what the FBN layer adds, per client: each client's batch
    ``(count, mean, biased var)`` in float64; with a recorder attached
    (:func:`attach_stacked_fbn_recorders`, the FBN method's stacked hooks) the buffers stay the
    round-start statistics and every training forward appends
    ``(clients [K'], count [K'], mean [K', C], var [K', C])``, ``clients`` being the rows this pass
    ran (:func:`set_forward_clients`); without one each client applies steps 5–6 in place with
    ``c = n/(n−1)``, as the single-participant layer does.
    """

    def __init__(self, bn: nn.modules.batchnorm._BatchNorm, num_clients: int) -> None:
        super().__init__(bn, num_clients)
        self.recorder: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.comm is not None or self.frozen:
            raise NotStackableError("FBN layers normalise with the shared statistics; they do not synchronise or freeze")
        c = self.num_features
        k = x.shape[1] // c
        if self.training:
            b = x.shape[0]
            spatial = x[0, 0].numel()
            if b * spatial < 2:
                raise ValueError(f"Expected more than 1 value per channel when training, got input size {list(x.shape)}")
            with torch.no_grad():
                # Each client's batch (count, mean, biased var) in float64. F.batch_norm with
                # momentum 1 leaves the batch mean and the unbiased variance in its "running"
                # arguments: one native pass, three times faster than mean() + var() over the
                # strided client layout.
                n = float(b * spatial)
                mean = torch.zeros(k * c, dtype=torch.float64, device=x.device)
                var = torch.ones(k * c, dtype=torch.float64, device=x.device)
                F.batch_norm(x.detach().to(torch.float64), mean, var, None, None, True, 1.0, self.eps)
                mean = mean.view(k, c)
                var = var.mul_((n - 1) / n).view(k, c)  # biased, as the FBN layer records it
                count = torch.full((k,), n, dtype=torch.float64, device=x.device)
                if self.recorder is not None:
                    clients = self.forward_clients if self.forward_clients is not None else torch.arange(k, device=x.device)
                    if len(clients) != k:
                        raise ValueError(f"forward_clients names {len(clients)} clients, the pass has {k}")
                    self.recorder.append((clients, count, mean, var))
                else:
                    from .fbn import fbn_local_update

                    corr = (count / (count - 1)).unsqueeze(-1)
                    new_mean, new_var = fbn_local_update(
                        self.running_mean.double(), self.running_var.double(), mean, var, float(self.momentum), corr  # type: ignore[union-attr]
                    )
                    self.running_mean.copy_(new_mean)  # type: ignore[union-attr]
                    self.running_var.copy_(new_var)  # type: ignore[union-attr]
                self.num_batches_tracked.add_(1)  # type: ignore[union-attr]
        return F.batch_norm(
            x, self.running_mean.detach().view(-1), self.running_var.detach().view(-1),  # type: ignore[union-attr]
            None if self.weight is None else self.weight.reshape(-1),
            None if self.bias is None else self.bias.reshape(-1),
            False, 0.0, self.eps,
        )


class StackedHybridBatchNorm(StackedBatchNorm):
    """K clients' HBN layers (:class:`~fednorm.nn.hbn.HybridBatchNorm`): ``alpha``, ``weight``,
    ``bias`` and the global statistics are ``[K, C]``. Training mode normalises each client's
    batch with ``w·batch + (1−w)·global`` statistics, ``w = sigmoid(−alpha)`` of that client
    (:func:`~fednorm.nn.hbn.hybrid_batch_norm` per client); evaluation mode is BatchNorm's with
    the global statistics. Like the HBN layer it never changes its buffers."""

    def __init__(self, bn: nn.modules.batchnorm._BatchNorm, num_clients: int) -> None:
        nn.Module.__init__(self)
        self.num_features, self.eps, self.momentum = bn.num_features, bn.eps, None
        self.track_running_stats = True
        self.weight = None if bn.weight is None else nn.Parameter(_repeat(bn.weight, num_clients))
        self.bias = None if bn.bias is None else nn.Parameter(_repeat(bn.bias, num_clients))
        self.alpha = nn.Parameter(_repeat(bn.alpha, num_clients), requires_grad=bn.alpha.requires_grad)
        self.register_buffer("running_mean", _repeat(bn.running_mean, num_clients))
        self.register_buffer("running_var", _repeat(bn.running_var, num_clients))
        self.register_buffer("num_batches_tracked", _repeat(bn.num_batches_tracked, num_clients))
        self.comm = None
        self.sync_backward = True
        self.row_mask = None
        self.total_rows = None
        self.frozen = False
        self.forward_clients = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.comm is not None or self.frozen:
            raise NotStackableError("HBN layers do not synchronise or freeze their statistics")
        if not self.training:
            return F.batch_norm(
                x, self.running_mean.view(-1), self.running_var.view(-1),  # type: ignore[union-attr]
                None if self.weight is None else self.weight.reshape(-1),
                None if self.bias is None else self.bias.reshape(-1),
                False, 0.0, self.eps,
            )
        if self.row_mask is None:  # K clients' layers are one HBN over K·C channels
            return hybrid_batch_norm(
                x, self.running_mean.reshape(-1), self.running_var.reshape(-1), self.alpha.reshape(-1),  # type: ignore[union-attr]
                None if self.weight is None else self.weight.reshape(-1),
                None if self.bias is None else self.bias.reshape(-1),
                training=True, eps=self.eps,
            )
        # Padded rows (a statistics pass over clients with different batch sizes) stay out of
        # the batch statistics; this arises only in that pass, which needs no gradient.
        if torch.is_grad_enabled():
            raise RuntimeError("padded HBN batches (set_row_mask) are for the no-grad statistics pass only")
        c = self.num_features
        k = x.shape[1] // c
        if self.row_mask.shape != (x.shape[0], k):
            raise ValueError(f"row mask has shape {tuple(self.row_mask.shape)}, expected {(x.shape[0], k)}")
        batch_mean, batch_var = _client_moments(x, c, self.row_mask.sum(dim=0).tolist())
        w = torch.sigmoid(-self.alpha)
        mean = (w * batch_mean.to(w.dtype) + (1 - w) * self.running_mean).reshape(-1)  # type: ignore[union-attr]
        var = (w * batch_var.to(w.dtype) + (1 - w) * self.running_var).reshape(-1)  # type: ignore[union-attr]
        return F.batch_norm(x, mean, var, None if self.weight is None else self.weight.reshape(-1),
                            None if self.bias is None else self.bias.reshape(-1), False, 0.0, self.eps)


def attach_stacked_fbn_recorders(model: nn.Module) -> dict[str, list]:
    """Attach a fresh recorder to every :class:`StackedFederatedBatchNorm` of a stacked model;
    returns ``{layer_name: records}`` (the base model's layer names)."""
    records: dict[str, list] = {}
    for name, m in model.named_modules():
        if isinstance(m, StackedFederatedBatchNorm):
            records[name] = m.recorder = []
    return records


def detach_stacked_fbn_recorders(model: nn.Module) -> None:
    """Detach the recorders: the stacked FBN layers update their own statistics again."""
    for m in model.modules():
        if isinstance(m, StackedFederatedBatchNorm):
            m.recorder = None


#: Rows (padded batch × clients) of one stacked forward of the HBN statistics pass. Measured on
#: the HBN paper's CIFAR-10 setting (batches of up to 512 images, one thread): 256 or 512 rows
#: took half the time of one forward of all ten clients (docs/performance.md).
STATS_MAX_ROWS = 512


def collect_stacked_hbn_statistics(
    model: nn.Module, batches: list[list[torch.Tensor]], *, train_mode: bool = True, max_rows: int | None = None,
    channels_last: bool = False,
) -> list[dict[str, Any] | None]:
    """HBN's statistics pass (:func:`~fednorm.nn.hbn.collect_hbn_statistics`) for every client
    of a stacked model at once: ``batches[i]`` are client i's input batches; returns per client
    ``{layer_name: HBNStats}`` (``None`` for a client without batches), exact as the per-client
    pass (the same Chan merge of each layer's input, in float64).

    The j-th batches of the clients run together in one stacked forward: batches of different
    sizes are zero-padded and the HBN layers leave the padded rows out of their batch statistics
    (:func:`set_row_mask`) when every stacked norm layer is HBN (layers that mix samples
    otherwise, e.g. plain BN, would see the padding: then one forward per batch size, in row
    subsets through ``functional_call``). A forward holds at most ``max_rows`` rows over its
    clients (padded batch × clients, at least one client; default :data:`STATS_MAX_ROWS`): the
    pass's batches are large, and one huge stacked activation is slower than a few smaller ones.
    No tensor of the model changes; its training flags are restored. ``channels_last`` feeds
    4-d batches in channels-last memory format, as training does (``LocalSpec.channels_last``):
    on CPU a stacked (grouped) convolution and pooling over a pass's large batches run 2-7×
    faster in it.
    """
    from torch.func import functional_call

    from .hbn import HBNStats

    k = len(batches)
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, StackedHybridBatchNorm)]
    accs = {name: _StackedAccumulator(k, m.num_features) for name, m in layers}

    sizes: list[int] = []  # real rows of each client of the current pass (the rest is padding)

    def recorder(name: str, layer: StackedHybridBatchNorm):
        def pre_hook(_m: nn.Module, args: tuple) -> None:
            clients = layer.forward_clients if layer.forward_clients is not None else torch.arange(k)
            accs[name].update(args[0], clients, sizes)
        return pre_hook

    norms = [m for m in model.modules() if isinstance(m, StackedBatchNorm)]
    pad = all(isinstance(m, StackedHybridBatchNorm) for m in norms)

    handles = [m.register_forward_pre_hook(recorder(name, m)) for name, m in layers]
    flags = [(m, m.training) for m in model.modules()]
    model.train(train_mode)
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    dev = next(iter(tensors.values())).device if tensors else torch.device("cpu")
    try:
        with torch.no_grad():
            for j in range(max((len(b) for b in batches), default=0)):
                groups: dict[int, list[int]] = defaultdict(list)
                for i, b in enumerate(batches):
                    if j < len(b):
                        groups[0 if pad else len(b[j])].append(i)
                for group in groups.values():
                    per = max(1, (max_rows or STATS_MAX_ROWS) // max(len(batches[i][j]) for i in group))
                    if per < len(group):  # split: similar sizes together pad less (clients are independent)
                        group.sort(key=lambda i: -len(batches[i][j]))
                    for start in range(0, len(group), per):
                        members = group[start:start + per]
                        idx = torch.tensor(members, device=dev)
                        sizes[:] = [len(batches[i][j]) for i in members]
                        longest = max(sizes)
                        rows = [batches[i][j] for i in members]
                        if min(sizes) < longest:
                            rows = [torch.cat([r, r.new_zeros((longest - len(r), *r.shape[1:]))]) if len(r) < longest else r
                                    for r in rows]
                            set_row_mask(model, torch.arange(longest, device=dev).unsqueeze(1) < torch.tensor(sizes, device=dev).unsqueeze(0))
                        else:
                            set_row_mask(model, None)
                        x = to_client_layout(torch.stack(rows))
                        if channels_last and x.dim() == 4:
                            x = x.contiguous(memory_format=torch.channels_last)
                        set_forward_clients(model, idx)
                        if members == list(range(k)):
                            model(x)
                        else:
                            functional_call(model, {n: t.index_select(0, idx) for n, t in tensors.items()}, (x,))
    finally:
        set_forward_clients(model, None)
        set_row_mask(model, None)
        for handle in handles:
            handle.remove()
        for m, flag in flags:
            m.training = flag
    results = {name: acc.result() for name, acc in accs.items()}
    return [{name: HBNStats(*(t[i] for t in results[name])) for name in accs} if batches[i] else None for i in range(k)]


def _client_moments(x: torch.Tensor, c: int, sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each client's batch mean and biased variance, ``[K', C]`` float64, over its first
    ``sizes[j]`` rows of ``x [B, K'·C, ...]`` (:func:`~fednorm.nn.hbn.batch_moments`); the
    statistics pass pads each client's batch at the end."""
    b, kc = x.shape[:2]
    k = kc // c
    if min(sizes) == b:
        mean, var = batch_moments(x)
        return mean.view(k, c), var.view(k, c)
    parts = [batch_moments(x[:n, j * c:(j + 1) * c]) for j, n in enumerate(sizes)]
    return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])


class _StackedAccumulator:
    """Per-client Chan/Welford merges of one stacked HBN layer's input, all clients at once:
    counts ``[K]`` and ``(mean, M2)`` ``[K, C]`` in float64, the vector form of
    :class:`fednorm.nn.hbn._Accumulator` (same merge, same order of batches per client)."""

    def __init__(self, num_clients: int, num_features: int) -> None:
        self.c = num_features
        self.n = torch.zeros(num_clients, dtype=torch.float64)
        self.mean = torch.zeros(num_clients, num_features, dtype=torch.float64)
        self.m2 = torch.zeros(num_clients, num_features, dtype=torch.float64)

    def update(self, x: torch.Tensor, clients: torch.Tensor, sizes: list[int]) -> None:
        """``x`` is ``[B, K'·C, ...]``, client ``clients[j]`` owning channels ``j·C:(j+1)·C`` and
        its first ``sizes[j]`` rows (the rest is padding)."""
        mb, vb = _client_moments(x, self.c, sizes)
        if self.n.device != x.device:
            self.n, self.mean, self.m2 = self.n.to(x.device), self.mean.to(x.device), self.m2.to(x.device)
        nb = torch.tensor(sizes, dtype=torch.float64, device=x.device) * x[0, 0].numel()
        m2b = vb * nb.unsqueeze(1)
        clients = clients.to(device=x.device, dtype=torch.long)
        n_old, mean_old = self.n[clients], self.mean[clients]
        n = n_old + nb
        delta = mb - mean_old
        self.mean[clients] = mean_old + delta * (nb / n).unsqueeze(1)
        self.m2[clients] = self.m2[clients] + m2b + delta.square() * (n_old * nb / n).unsqueeze(1)
        self.n[clients] = n

    def result(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(count [K], mean [K, C], biased var [K, C])``; rows of clients without input are NaN."""
        return self.n, self.mean, self.m2 / self.n.unsqueeze(1)


class StackedGroupNorm(nn.Module):
    """K clients' ``GroupNorm(G, C)`` as ``GroupNorm(K·G, K·C)``; affine ``[K, C]``."""

    def __init__(self, gn: nn.GroupNorm, num_clients: int) -> None:
        super().__init__()
        self.num_groups, self.num_channels, self.eps = gn.num_groups, gn.num_channels, gn.eps
        self.weight = None if gn.weight is None else nn.Parameter(_repeat(gn.weight, num_clients))
        self.bias = None if gn.bias is None else nn.Parameter(_repeat(gn.bias, num_clients))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = x.shape[1] // self.num_channels
        w = None if self.weight is None else self.weight.reshape(-1)
        b = None if self.bias is None else self.bias.reshape(-1)
        return F.group_norm(x, k * self.num_groups, w, b, self.eps)


class ClientPadShortcut(nn.Module):
    """Option-A ResNet shortcut (stride + zero channel padding) applied per client."""

    def __init__(self, shortcut: nn.Module) -> None:
        super().__init__()
        self.in_planes = shortcut.in_planes
        self.stride = shortcut.stride
        self.pad_front, self.pad_back = shortcut.pad_front, shortcut.pad_back

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        b, kc, h, w = x.shape
        k = kc // self.in_planes
        y = F.pad(x.reshape(b, k, self.in_planes, h, w), (0, 0, 0, 0, self.pad_front, self.pad_back))
        return y.reshape(b, -1, h, w)


class ClientFeatureNorm(nn.Module):
    """The LN paper's feature normalization applied to each client's features separately."""

    def __init__(self, fn: nn.Module) -> None:
        super().__init__()
        self.inner = fn
        self.num_features = fn.num_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .feature_norm import feature_norm

        b = x.shape[0]
        if self.num_features is None:
            raise NotStackableError("FeatureNorm needs num_features to be run per client")
        y = feature_norm(x.reshape(b, -1, self.num_features), self.inner.eps, scale=self.inner.scale)
        return y.reshape(b, -1)


# Modules without tensors of their own that act per channel or element-wise.
_PASSTHROUGH = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.ELU,
    nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d,
    nn.Dropout, nn.Dropout2d, nn.Identity, nn.Flatten,
)


def _convert(module: nn.Module, k: int) -> nn.Module:
    from ..models.resnet import PadShortcut

    from .weight_std import ScaledStdConv2d, StdConv2d

    if isinstance(module, ScaledStdConv2d):
        return StackedScaledStdConv2d(module, k)
    if isinstance(module, StdConv2d):
        return StackedStdConv2d(module, k)
    if isinstance(module, nn.Conv2d):
        if type(module) is not nn.Conv2d:  # a subclass changes the forward: stacking it as a plain conv would be wrong
            raise NotStackableError(f"{type(module).__name__} has no stacked version yet")
        return StackedConv2d(module, k)
    if isinstance(module, nn.Linear):
        return StackedLinear(module, k)
    from .fbn import FederatedBatchNorm
    from .hbn import HybridBatchNorm

    if isinstance(module, FederatedBatchNorm):
        return StackedFederatedBatchNorm(module, k)
    if isinstance(module, HybridBatchNorm):
        return StackedHybridBatchNorm(module, k)
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        if type(module) not in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm):
            # A subclass (e.g. HBN) changes the forward; treating it as BN would be silently wrong.
            raise NotStackableError(f"{type(module).__name__} has no stacked version yet")
        return StackedBatchNorm(module, k)
    if isinstance(module, nn.GroupNorm):
        return StackedGroupNorm(module, k)
    if isinstance(module, PadShortcut):
        return ClientPadShortcut(module)
    from .feature_norm import FeatureNorm, FeatureNormClassifier

    if isinstance(module, FeatureNorm):
        return ClientFeatureNorm(module)
    if isinstance(module, FeatureNormClassifier):
        # The wrapper shares its wrapped model's children: convert those once, re-register them.
        inner = _convert(module.model, k)
        for name, child in inner.named_children():
            setattr(module, name, child)
        module.feature_norm = ClientFeatureNorm(module.feature_norm)
        return module
    if isinstance(module, nn.Flatten) and module.start_dim != 1:
        raise NotStackableError(f"Flatten(start_dim={module.start_dim}) is not supported")
    own = list(module._parameters.values()) + list(module._buffers.values())
    if any(t is not None for t in own) and not isinstance(module, _PASSTHROUGH):
        raise NotStackableError(
            f"{type(module).__name__} holds tensors of its own and has no stacked version"
        )
    for name, child in module.named_children():
        setattr(module, name, _convert(child, k))
    return module


def _tensors(model: nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    yield from model.state_dict(keep_vars=True).items()


def stack_model(
    model: nn.Module, num_clients: int, *, example_input: torch.Tensor | None = None, verify: bool = True
) -> nn.Module:
    """A stacked copy of ``model`` holding ``num_clients`` clients (the model is not modified).

    Args:
        model: a network built from supported layers (every model in ``fednorm.models``).
        num_clients: the client count K.
        example_input: a ``[B, C, H, W]`` batch used to verify the stacked forward against
            the base model, client by client, in train and eval mode. Required when ``verify``.
        verify: run the verification (recommended; it costs two small forward passes).

    Raises:
        NotStackableError: a module has no stacked version, or the verification failed.
    """
    stacked = _convert(copy.deepcopy(model), num_clients)
    keys_base = {k: v.shape for k, v in model.state_dict().items()}
    keys_stacked = {k: v.shape for k, v in stacked.state_dict().items()}
    if set(keys_base) != set(keys_stacked):
        raise NotStackableError(f"stacked state keys differ: {sorted(set(keys_base) ^ set(keys_stacked))}")
    for key, shape in keys_base.items():
        if keys_stacked[key] != (num_clients, *shape):
            raise NotStackableError(f"stacked '{key}' has shape {tuple(keys_stacked[key])}, expected {(num_clients, *shape)}")
    if verify:
        if example_input is None:
            raise ValueError("example_input is required to verify the stacked model")
        _verify(model, stacked, num_clients, example_input)
    return stacked


def _train_without_dropout(model: nn.Module, training: bool) -> None:
    """Train/eval mode, with dropout off: its random masks cannot match across layouts."""
    model.train(training)
    for m in model.modules():
        if isinstance(m, (nn.Dropout, nn.Dropout2d)):
            m.eval()


@torch.no_grad()
def _verify(model: nn.Module, stacked: nn.Module, k: int, x: torch.Tensor) -> None:
    """Perturb each client's copy differently and compare the stacked forward with the base one."""
    # In float64 so rounding (1e-12) cannot be mistaken for a layout error (O(1)).
    base = copy.deepcopy(model).double().cpu()
    probe = copy.deepcopy(stacked).double().cpu()
    x = x.detach().double().cpu()
    gen = torch.Generator().manual_seed(1234)
    client_states = []
    for i in range(k):
        state = {}
        for name, t in base.state_dict().items():
            if t.is_floating_point():
                noise = torch.randn(t.shape, generator=gen, dtype=t.dtype) * 0.05 * (i + 1)
                state[name] = t + noise.to(t.device)
            else:
                state[name] = t.clone()
        client_states.append(state)
    stacked_state = {name: torch.stack([s[name] for s in client_states]) for name in client_states[0]}
    xs = torch.stack([x + 0.1 * i for i in range(k)])  # each client its own batch
    for training in (False, True):
        probe.load_state_dict(stacked_state)
        _train_without_dropout(probe, training)
        try:
            out = from_client_layout(probe(to_client_layout(xs)), k)
        except (RuntimeError, ValueError) as exc:
            if isinstance(exc, NotStackableError):
                raise
            raise NotStackableError(f"the stacked forward fails: {exc}") from None
        for i in range(k):
            ref_model = copy.deepcopy(base)
            ref_model.load_state_dict(client_states[i])
            _train_without_dropout(ref_model, training)
            ref = ref_model(xs[i])
            if out[i].shape != ref.shape or not torch.allclose(out[i], ref, rtol=1e-7, atol=1e-8):
                err = (out[i] - ref).abs().max().item() if out[i].shape == ref.shape else float("nan")
                raise NotStackableError(
                    f"the stacked forward differs from the model's own forward for client {i} "
                    f"({'train' if training else 'eval'} mode, max error {err:.3g}); its forward code "
                    "probably mixes channels of different clients (e.g. torch.cat on channels)"
                )
