"""Hybrid Batch Normalisation (HBN) layers: a learnable per-channel mix of batch and global statistics.

HBN (Chen et al., ICML 2025, arXiv:2505.21877) replaces each BatchNorm. In
training mode it normalises a mini-batch with ``w·batch + (1−w)·global`` statistics, where the
per-channel batch weight ``w = sigmoid(−alpha)`` is learnt per client and never communicated, and
the global statistics (μ_g, σ_g², HBN Eq. 8) are frozen buffers that only the server sets. In
evaluation mode only the global statistics are used, which is exactly BatchNorm's evaluation path
with ``running_mean``/``running_var`` = ``(global_mean, global_var)``. This module holds the pure
function :func:`hybrid_batch_norm`, the layers :class:`HybridBatchNorm1d`/:class:`HybridBatchNorm2d`
(registered as the norm ``"hbn"``), the client-side statistics pass
(:func:`collect_hbn_statistics`, HBN Eq. 7/15), one step of the layer-wise pass
(:func:`collect_hbn_layer_statistics`) and the converters to and from plain BatchNorm.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .functional import batch_norm_with_stats_backward
from .norms import register_norm

__all__ = [
    "hybrid_batch_norm",
    "HybridBatchNorm",
    "HybridBatchNorm1d",
    "HybridBatchNorm2d",
    "create_hybrid_batch_norm",
    "HBNStats",
    "hbn_modules",
    "recording_hbn_statistics",
    "collect_hbn_statistics",
    "collect_hbn_layer_statistics",
    "convert_to_hybrid",
    "convert_to_batchnorm",
]


def _channel_view(t: torch.Tensor, dim: int) -> torch.Tensor:
    return t.view([1, -1] + [1] * (dim - 2))


def hybrid_batch_norm(
    input: torch.Tensor,
    global_mean: torch.Tensor,
    global_var: torch.Tensor,
    alpha: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    training: bool = False,
    eps: float = 1e-5,
) -> torch.Tensor:
    """Hybrid batch normalisation of ``input`` (Chen et al., 2025, Sec. 3.3, Eqs. 1, 9, 10).

    Training mode (Eqs. 1, 9, 10)::

        μ_b, σ_b² = mean and *biased* variance of the batch over all dims but C   (Eq. 1)
        w  = sigmoid(−alpha)                       # weight on the batch statistics
        μ̂  = w·μ_b  + (1−w)·μ_g                   (Eq. 9)
        σ̂² = w·σ_b² + (1−w)·σ_g²                  (Eq. 9; variances, not std devs, are mixed)
        y  = (x − μ̂) / sqrt(σ̂² + ε) · weight + bias  (Eq. 10)

    Gradients flow through μ_b and σ_b² (as in BN) and to ``alpha``; ``global_mean``/``global_var``
    are treated as constants (they are frozen buffers in the layer). Evaluation mode normalises
    with ``(global_mean, global_var)`` only and ignores ``alpha`` (Sec. 3.3), i.e. it is
    ``F.batch_norm(input, global_mean, global_var, weight, bias, training=False, eps=eps)``.

    [code≠paper] The released code uses ``sigmoid(+alpha)`` as the batch weight; fednorm follows the
    paper (``sigmoid(−alpha)``). Both are identical at the initial value ``alpha = 0`` (50/50 mix);
    only the sign of reported alphas differs.

    Args:
        input: ``(N, C)``, ``(N, C, L)`` or ``(N, C, H, W)``.
        global_mean: μ_g, ``[C]`` (HBN Eq. 8).
        global_var: σ_g², ``[C]`` (HBN Eq. 8, Bessel-corrected by the server).
        alpha: mixing logit, ``[C]``; only used in training mode.
        weight, bias: affine γ, β, ``[C]`` (optional).
        training: mix batch and global statistics (True) or use global statistics only (False).
        eps: added to the variance (default: 1e-5, as in the code).

    Returns:
        A tensor of the shape of ``input``.
    """
    if not training:
        return F.batch_norm(input, global_mean, global_var, weight, bias, False, 0.0, eps)
    return _HybridNorm.apply(input, torch.sigmoid(-alpha), global_mean.detach(), global_var.detach(), weight, bias, eps)


class _HybridNorm(torch.autograd.Function):
    """Eqs. 1, 9, 10 as one op on PyTorch's native BatchNorm kernels. Forward: the batch moments
    from the BatchNorm statistics kernel (one Welford pass), then BatchNorm's inference kernel
    with the mixed statistics. Backward: BatchNorm's inference backward gives ``g·γ·rstd`` and the
    channel sums ``Σg`` and ``Σg·(x − μ̂)·rstd`` in one fused pass; the terms through the batch
    moments are one more elementwise pass. Written out because autograd through the ten
    elementwise ops of the equations cost about four times as much per layer, and the native
    kernels (memory-format aware, so channels-last batches stay fast) a further 1.1-2.4× less
    than the same algebra in tensor ops (benchmarks/hbn_layer.py). Inputs: ``x [N, C, *]``, the
    batch weight ``w = sigmoid(−alpha) [C]``, constant global statistics, optional affine, eps."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, global_mean: torch.Tensor, global_var: torch.Tensor,
                weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
        batch_mean, batch_var = torch.batch_norm_update_stats(x, None, None, 1.0)  # biased var (Eq. 1)
        mean = torch.lerp(global_mean, batch_mean, w)  # w·μ_b + (1 − w)·μ_g (Eq. 9)
        var = torch.lerp(global_var, batch_var, w)
        ctx.save_for_backward(x, w, batch_mean, batch_var, mean, var, global_mean, global_var, weight)
        ctx.count = x.numel() // x.shape[1]
        ctx.eps = eps
        return torch.batch_norm(x, weight, bias, mean, var, False, 0.0, eps, False)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, w, batch_mean, batch_var, mean, var, global_mean, global_var, weight = ctx.saved_tensors
        n, d = ctx.count, x.dim()
        grad_x, d_mean, d_var, grad_gamma, sum_g = batch_norm_with_stats_backward(
            g, x, mean, var, weight, ctx.eps, input_grad=bool(ctx.needs_input_grad[0]))  # ∂L/∂μ̂, ∂L/∂σ̂²
        grad_w = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            # ∂μ_b/∂x = 1/n, ∂σ_b²/∂x = 2(x − μ_b)/n: grad_x = g·γ·rstd + x·b + c per channel.
            w_n = w / n
            b = (d_var * w_n).mul_(2.0)
            c = torch.addcmul(d_mean * w_n, b, batch_mean, value=-1.0)
            grad_x = grad_x.addcmul_(x, _channel_view(b, d)).add_(_channel_view(c, d))
        if ctx.needs_input_grad[1]:
            grad_w = torch.addcmul(d_mean * (batch_mean - global_mean), d_var, batch_var - global_var)
        if weight is not None and ctx.needs_input_grad[4]:
            grad_weight = grad_gamma
        if ctx.needs_input_grad[5]:
            grad_bias = sum_g
        return grad_x, grad_w, None, None, grad_weight, grad_bias, None


class HybridBatchNorm(_BatchNorm):
    """Base class of the HBN layers (Chen et al., 2025, Sec. 3.2–3.3, Eqs. 8–10).

    Subclasses ``_BatchNorm`` so that ``isinstance(m, _BatchNorm)`` checks keep working and BN
    checkpoints load: the BN buffers ``running_mean``/``running_var`` *are* HBN's global statistics
    μ_g and σ_g² (Eq. 8), initialised to 0 and 1 as in the released code, and exposed as
    :attr:`global_mean`/:attr:`global_var`. The extra parameter ``alpha`` (``[C]``, initialised to 0,
    Algorithm 1) is the client-local mixing logit; :attr:`batch_weight` is ``sigmoid(−alpha)``.

    HBN has **no momentum** ("discard the moving average momentum", Sec. 3.4): ``forward`` never
    updates ``running_mean``/``running_var`` in either mode. The server computes them from the
    clients' statistics (:func:`collect_hbn_statistics`, pooled with Eq. 8 and optionally the
    EMA of Eq. 11) and writes them into the buffers.

    Communication roles: ``alpha`` stays on the client (:attr:`local_tensors`);
    ``running_mean``/``running_var`` are statistics set by the server (:attr:`stat_buffers`);
    ``weight``/``bias`` are averaged like any other parameter (Sec. 3.3).

    Args:
        num_features: number of channels C.
        eps: added to the variance (default: 1e-5).
        affine: learn γ and β (default: True).
        device, dtype: factory arguments.
    """

    #: Tensors that never leave the client (alpha "does not participate in communication", HBN Sec. 3.3).
    local_tensors: tuple[str, ...] = ("alpha",)
    # The global statistics come from the HBN method's statistics pass; the simulator refuses
    # other methods, under which they would stay at their (0, 1) initialisation.
    requires_method: str = "hbn"
    #: Buffers holding the global statistics μ_g, σ_g², set by the server (HBN Eq. 8, 11).
    stat_buffers: tuple[str, ...] = ("running_mean", "running_var")

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        affine: bool = True,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        # momentum=None: HBN keeps no moving average; running stats are only set by the server.
        super().__init__(num_features, eps, None, affine, True, device=device, dtype=dtype)
        self.alpha = nn.Parameter(torch.zeros(num_features, device=device, dtype=dtype))  # α, Eq. 9

    # ----------------------------------------------------------------------------------------
    @property
    def global_mean(self) -> torch.Tensor:
        """The global mean μ_g (HBN Eq. 8), held in the ``running_mean`` buffer."""
        return self.running_mean  # type: ignore[return-value]

    @property
    def global_var(self) -> torch.Tensor:
        """The global variance σ_g² (HBN Eq. 8), held in the ``running_var`` buffer."""
        return self.running_var  # type: ignore[return-value]

    @property
    def batch_weight(self) -> torch.Tensor:
        """Per-channel weight on the batch statistics, ``sigmoid(−alpha)`` (paper convention)."""
        return torch.sigmoid(-self.alpha)

    def reset_parameters(self) -> None:
        """Reset γ=1, β=0, μ_g=0, σ_g²=1 and alpha=0."""
        super().reset_parameters()
        alpha = getattr(self, "alpha", None)  # absent while _BatchNorm.__init__ runs
        if alpha is not None:
            with torch.no_grad():
                alpha.zero_()

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, affine={self.affine}"

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):  # type: ignore[no-untyped-def]
        # A plain BN checkpoint has no alpha: keep the current value (0 after init) instead of
        # failing a strict load, as _BatchNorm does for num_batches_tracked.
        key = prefix + "alpha"
        if key not in state_dict and self.alpha is not None:
            state_dict[key] = self.alpha.detach().clone()
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        return hybrid_batch_norm(
            input,
            self.running_mean,  # type: ignore[arg-type]
            self.running_var,  # type: ignore[arg-type]
            self.alpha,
            self.weight,
            self.bias,
            self.training,
            self.eps,
        )


class HybridBatchNorm1d(HybridBatchNorm):
    """HBN for ``(N, C)`` or ``(N, C, L)`` inputs (not in the paper; the authors' released code is 4-D only).

    See :class:`HybridBatchNorm` and :func:`hybrid_batch_norm`.

    Shape:
        - Input: ``(N, C)`` or ``(N, C, L)``; Output: same shape.
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() not in (2, 3):
            raise ValueError(f"expected 2D or 3D input (got {input.dim()}D input)")


class HybridBatchNorm2d(HybridBatchNorm):
    """HBN for ``(N, C, H, W)`` inputs (statistics over N×H×W, as ``BatchNorm2d``).

    See :class:`HybridBatchNorm` and :func:`hybrid_batch_norm`.

    Shape:
        - Input: ``(N, C, H, W)``; Output: same shape.

    Examples:
        >>> layer = HybridBatchNorm2d(8)
        >>> layer.batch_weight[:2]
        tensor([0.5000, 0.5000], grad_fn=<SliceBackward0>)
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 4:
            raise ValueError(f"expected 4D input (got {input.dim()}D input)")


@register_norm("hbn")
def create_hybrid_batch_norm(
    num_features: int,
    *,
    spatial: bool = True,
    eps: float = 1e-5,
    affine: bool = True,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """Norm builder for HBN: ``HybridBatchNorm2d`` (``spatial=True``) or ``HybridBatchNorm1d``.

    Args:
        num_features: number of channels C.
        spatial: maps ``(N, C, H, W)`` (True) or features ``(N, C)`` from a Linear layer (False).
        eps, affine, device, dtype: as in :class:`HybridBatchNorm`.
    """
    cls = HybridBatchNorm2d if spatial else HybridBatchNorm1d
    return cls(num_features, eps=eps, affine=affine, device=device, dtype=dtype)


# --------------------------------------------------------------------------------------------
# Client-side statistics pass (HBN Eq. 7 / 15, Chen et al., 2025, Sec. 3.2, App. A.2)
# --------------------------------------------------------------------------------------------


class HBNStats(NamedTuple):
    """Exact per-channel statistics of an HBN layer's input on one client (float64).

    ``count`` is the number of values per channel (samples × H × W), the weight under which
    :func:`fednorm.nn.functional.pooled_stats` pools means and biased variances exactly; ``var``
    is biased (1/count, Eq. 7). Eq. 8's Bessel ``N − 1`` counts samples, not values (see
    :func:`collect_hbn_statistics`).
    """

    count: torch.Tensor
    mean: torch.Tensor
    var: torch.Tensor


def batch_moments(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and biased variance of ``x [N, C, *]`` as float64.

    One pass of PyTorch's native BatchNorm statistics kernel (Welford, accumulating in double on
    CPU): exact for float64 input, and for float32 input within a few ulps of the float64 moments
    (measured ≤ 5e-8 relative) at a tenth of the cost of a float64 copy of a large activation.
    The merge across batches and clients stays in float64 (:class:`_Accumulator`).
    """
    mean, var = torch.batch_norm_update_stats(x.detach(), None, None, 1.0)
    return mean.to(torch.float64), var.to(torch.float64)


class _Accumulator:
    """Chan/Welford merge of ``(n, mean, M2)`` in float64 over batches (the released code's merge
    drops a term)."""

    def __init__(self) -> None:
        self.n: torch.Tensor | None = None
        self.mean: torch.Tensor | None = None
        self.m2: torch.Tensor | None = None

    def update(self, x: torch.Tensor) -> None:
        nb = torch.tensor(float(x.numel() // x.shape[1]), dtype=torch.float64, device=x.device)
        if nb == 0:
            return
        mb, vb = batch_moments(x)
        m2b = vb * nb
        if self.n is None:
            self.n, self.mean, self.m2 = nb, mb, m2b
            return
        n = self.n + nb
        delta = mb - self.mean
        self.mean = self.mean + delta * (nb / n)
        self.m2 = self.m2 + m2b + delta**2 * (self.n * nb / n)
        self.n = n

    def result(self) -> HBNStats:
        if self.n is None:
            raise ValueError("no batch reached this HBN layer; cannot compute its statistics")
        return HBNStats(self.n, self.mean, self.m2 / self.n)  # type: ignore[operator,arg-type]


def hbn_modules(model: nn.Module) -> list[tuple[str, HybridBatchNorm]]:
    """``(qualified_name, layer)`` for every HBN layer of ``model``, selected by type."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, HybridBatchNorm)]


@contextlib.contextmanager
def recording_hbn_statistics(model: nn.Module) -> Iterator[dict[str, _Accumulator]]:
    """Record the input of every HBN layer while the context is active.

    Yields a dict ``{module_name: accumulator}``; call ``.result()`` on an accumulator for its
    :class:`HBNStats`. Hooks are removed on exit. Nothing else is changed: HBN layers never update
    their buffers in ``forward``.
    """
    accumulators: dict[str, _Accumulator] = {}
    handles = []
    for name, layer in hbn_modules(model):
        acc = accumulators[name] = _Accumulator()
        handles.append(layer.register_forward_pre_hook(lambda _m, args, acc=acc: acc.update(args[0])))
    try:
        yield accumulators
    finally:
        for handle in handles:
            handle.remove()


def collect_hbn_statistics(
    model: nn.Module, batches: Iterable[Any], *, train_mode: bool = True, channels_last: bool = False
) -> dict[str, HBNStats]:
    """Client statistics pass: exact ``(count, mean, biased var)`` of each HBN layer's input.

    HBN Eq. 7 / 15 (Chen et al., 2025, Sec. 3.2, App. A.2): run before local training, under the
    downloaded global weights, with no gradient. Statistics are merged exactly over all
    ``batches`` (Chan merge in float64), fixing the authors' released code's merge, which drops a
    term. The results are what a client uploads; the server pools them with
    ``pooled_stats(count, mean, var, unbiased=True)`` (Eq. 8).

    The forward of earlier layers is not defined by the paper for deep nets. By default
    (``train_mode=True``) the model runs in training mode, so earlier HBN layers normalise with the
    hybrid statistics as in the code; ``train_mode=False`` uses the global statistics only. The
    model's training flags are restored afterwards. No parameter or HBN buffer changes; note that
    plain BN layers, if any, would update their running statistics in training mode.

    Args:
        model: a model containing HBN layers.
        batches: an iterable of input tensors, or of ``(input, target, ...)`` tuples/lists.
        train_mode: run the pass in training mode (default: True, as in the code).
        channels_last: feed 4-d batches in channels-last memory format, as training does
            (faster convolutions and pooling on CPU; the statistics are the same).

    Returns:
        ``{module_name: HBNStats(count, mean, var)}`` in float64; ``count`` is the number of
        values per channel (samples × H × W). Eq. 8's Bessel ``N − 1`` counts *samples* in the
        paper and in the released code alike, so pool with the sample count for
        Eq. 8 (what :class:`fednorm.methods.HBN` uploads by default, ``bessel_count="samples"``);
        pooling with ``count`` divides by ``N·H·W − 1`` instead (``bessel_count="elements"``).

    Raises:
        ValueError: if ``batches`` is empty or some HBN layer received no input.
    """
    flags = [(m, m.training) for m in model.modules()]
    model.train(train_mode)
    try:
        with torch.no_grad(), recording_hbn_statistics(model) as accumulators:
            seen = 0
            for batch in batches:
                x = batch[0] if isinstance(batch, (tuple, list)) else batch
                if channels_last and x.dim() == 4:
                    x = x.contiguous(memory_format=torch.channels_last)
                model(x)
                seen += 1
        if seen == 0:
            raise ValueError("collect_hbn_statistics: batches is empty; need at least one batch")
        return {name: acc.result() for name, acc in accumulators.items()}
    finally:
        for m, flag in flags:
            m.training = flag


class _Stop(Exception):
    """Ends a forward pass at the layer being measured (:func:`collect_hbn_layer_statistics`)."""


def collect_hbn_layer_statistics(
    model: nn.Module, batches: Iterable[Any], index: int, *, channels_last: bool = False
) -> tuple[str, HBNStats] | None:
    """Step ``index`` of the layer-wise statistics pass: the exact ``(count, mean, biased var)``
    of the input of the ``index``-th HBN layer to run (0-based, in the order of the layers' first
    calls), in inference mode.

    In inference mode every earlier HBN layer normalises with the statistics the model holds, so
    when the server has loaded the pooled statistics of the first ``index`` layers (steps
    ``0 .. index − 1``), the pooled result of this step is the exact statistics of the layer's
    input under those: after one step per layer, the statistics ``S(ω; D)`` of the model as it
    is evaluated (HBN Eq. 5, A.2), which one pass cannot give for layers after the first. The
    order of first calls is the order of dependence (a layer's input can only depend on layers
    that ran before it), whatever order the model registers its layers in. Each forward stops at
    the measured layer, so step ``index`` costs the network's prefix up to it. The model's
    training flags are restored; no tensor changes.

    Args:
        model: a model containing HBN layers.
        batches: an iterable of input tensors, or of ``(input, target, ...)`` tuples/lists.
        index: which layer, by order of first call.
        channels_last: feed 4-d batches in channels-last memory format, as training does.

    Returns:
        ``(layer_name, HBNStats)`` in float64 (``count`` as in :func:`collect_hbn_statistics`), or
        ``None`` when the batches reach fewer than ``index + 1`` HBN layers.

    Raises:
        ValueError: if ``batches`` is empty, or two batches reach different layers at ``index``.
    """
    names = {m: name for name, m in hbn_modules(model)}
    acc = _Accumulator()
    order: list[nn.Module] = []
    target: list[str] = []

    def pre_hook(module: nn.Module, args: tuple) -> None:
        if module in order:
            return
        order.append(module)
        if len(order) == index + 1:
            target.append(names[module])
            acc.update(args[0])
            raise _Stop

    flags = [(m, m.training) for m in model.modules()]
    handles = [m.register_forward_pre_hook(pre_hook) for m in names]
    model.eval()
    try:
        seen = 0
        with torch.no_grad():
            for batch in batches:
                x = batch[0] if isinstance(batch, (tuple, list)) else batch
                if channels_last and x.dim() == 4:
                    x = x.contiguous(memory_format=torch.channels_last)
                order.clear()
                try:
                    model(x)
                except _Stop:
                    pass
                seen += 1
        if seen == 0:
            raise ValueError("collect_hbn_layer_statistics: batches is empty; need at least one batch")
    finally:
        for handle in handles:
            handle.remove()
        for m, flag in flags:
            m.training = flag
    if not target:
        return None
    if len(set(target)) > 1 or len(target) != seen:
        raise ValueError(f"collect_hbn_layer_statistics: the batches reach different HBN layers at index {index}: {sorted(set(target))}")
    return target[0], acc.result()


# --------------------------------------------------------------------------------------------
# Converters (torch's convert_sync_batchnorm pattern)
# --------------------------------------------------------------------------------------------


def _reference(module: nn.Module) -> dict[str, Any]:
    for t in list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)):
        if t.is_floating_point():
            return {"device": t.device, "dtype": t.dtype}
    return {}


def _copy_bn_state(old: _BatchNorm, new: _BatchNorm) -> None:
    with torch.no_grad():
        if old.affine and new.affine:
            new.weight.copy_(old.weight)  # type: ignore[union-attr]
            new.bias.copy_(old.bias)  # type: ignore[union-attr]
            new.weight.requires_grad_(old.weight.requires_grad)  # type: ignore[union-attr]
            new.bias.requires_grad_(old.bias.requires_grad)  # type: ignore[union-attr]
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            src, dst = getattr(old, name, None), getattr(new, name, None)
            if isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor):
                dst.copy_(src)
    new.train(old.training)


def convert_to_hybrid(module: nn.Module) -> nn.Module:
    """Replace every BatchNorm in ``module`` by HBN; mutates ``module`` in place (like torch).

    Follows ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``: recurse over ``named_children``,
    match ``isinstance(_BatchNorm)`` (existing HBN layers are kept), build from the old
    ``num_features``/``eps``/``affine`` on the old device and dtype, copy ``weight``/``bias`` under
    ``no_grad``, carry ``running_mean``/``running_var`` into the global statistics (μ_g, σ_g²), and
    the ``training`` flag. ``alpha`` starts at 0. ``BatchNorm1d`` becomes :class:`HybridBatchNorm1d`;
    every other BN (2d, ``SyncBatchNorm``) becomes :class:`HybridBatchNorm2d`.
    A BN without running statistics (``track_running_stats=False``) gives μ_g = 0, σ_g² = 1.

    Returns:
        ``module``, or the new layer if ``module`` itself is a BatchNorm (use the return value).
        Optimisers built before the call hold the old parameters.

    Raises:
        ValueError: for ``BatchNorm3d`` (HBN supports 2-D to 4-D inputs only).
    """
    if isinstance(module, _BatchNorm) and not isinstance(module, HybridBatchNorm):
        if isinstance(module, nn.BatchNorm3d):
            raise ValueError("convert_to_hybrid: BatchNorm3d is not supported (HBN takes 2D-4D inputs)")
        cls = HybridBatchNorm1d if isinstance(module, nn.BatchNorm1d) else HybridBatchNorm2d
        new = cls(module.num_features, eps=module.eps, affine=module.affine, **_reference(module))
        _copy_bn_state(module, new)
        return new
    for name, child in module.named_children():
        converted = convert_to_hybrid(child)
        if converted is not child:
            module.add_module(name, converted)
    return module


def convert_to_batchnorm(module: nn.Module, *, momentum: float | None = 0.1) -> nn.Module:
    """Inverse of :func:`convert_to_hybrid`: export HBN layers as plain BN; mutates in place.

    The exported model's evaluation output is identical: HBN's eval path is BN's with
    ``running_mean``/``running_var`` = (μ_g, σ_g²). ``alpha`` (training-only, client-local) is
    dropped. :class:`HybridBatchNorm1d` becomes ``nn.BatchNorm1d``, :class:`HybridBatchNorm2d`
    ``nn.BatchNorm2d``.

    Args:
        module: a model or a single HBN layer.
        momentum: of the new BN layers (default: 0.1, torch's).

    Returns:
        ``module``, or the new layer if ``module`` itself is an HBN layer.
    """
    if isinstance(module, HybridBatchNorm):
        cls = nn.BatchNorm1d if isinstance(module, HybridBatchNorm1d) else nn.BatchNorm2d
        new = cls(module.num_features, eps=module.eps, momentum=momentum, affine=module.affine, **_reference(module))
        _copy_bn_state(module, new)
        return new
    for name, child in module.named_children():
        converted = convert_to_batchnorm(child, momentum=momentum)
        if converted is not child:
            module.add_module(name, converted)
    return module
