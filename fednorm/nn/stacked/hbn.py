"""Stacked HBN layers (Chen et al. 2025, "Hybrid Batch Normalisation", §3) and HBN's statistics pass
run for every client of a stacked model at once, exact as the per-client pass."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..hbn import HBNStats, batch_moments, hybrid_batch_norm
from .layout import NotStackableError, repeat_clients, to_client_layout
from .norms import StackedBatchNorm, set_forward_clients, set_row_mask

__all__ = ["StackedHybridBatchNorm", "STATS_MAX_ROWS", "collect_stacked_hbn_statistics"]


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
        self.weight = None if bn.weight is None else nn.Parameter(repeat_clients(bn.weight, num_clients))
        self.bias = None if bn.bias is None else nn.Parameter(repeat_clients(bn.bias, num_clients))
        self.alpha = nn.Parameter(repeat_clients(bn.alpha, num_clients), requires_grad=bn.alpha.requires_grad)
        self.register_buffer("running_mean", repeat_clients(bn.running_mean, num_clients))
        self.register_buffer("running_var", repeat_clients(bn.running_var, num_clients))
        self.register_buffer("num_batches_tracked", repeat_clients(bn.num_batches_tracked, num_clients))
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
