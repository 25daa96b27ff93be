"""Exact statistics of every normalization layer's input on the union of the clients' data.

The reference of the statistics diagnostics: what centralized BatchNorm on all the clients' data
would normalise with, under the current global weights. Every layer's statistics depend on how
the layers before it normalise, so the reference is the fixed point in which *each* layer
normalises with the exact (biased) union statistics of its input, which is what training-mode
BatchNorm does with the whole union as one batch. It is computed in L statistics passes over the
data (L normalization layers, in evaluation mode, so every layer normalises with its buffers):
after pass k the first k layers in forward order hold their exact statistics, so the last pass
records every layer's exact input. Moments are taken per batch with
:func:`fednorm.nn.hbn.batch_moments` (float64) and pooled exactly with
:func:`fednorm.nn.functional.pooled_stats`, per client and then over clients (HBN's Eq. 8 code).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..nn.functional import pooled_stats
from ..nn.hbn import batch_moments

__all__ = ["Moments", "ExactStatistics", "norm_layers", "recording_moments", "exact_statistics", "standardized_distance"]


@dataclass
class Moments:
    """Per-channel ``(count, mean, biased var)`` in float64; ``count`` is values per channel."""

    count: torch.Tensor
    mean: torch.Tensor
    var: torch.Tensor


@dataclass
class ExactStatistics:
    """The union's exact statistics per layer and each client's share of them.

    ``clients[name][i]`` are client ``i``'s moments of the layer's input in the same pass (the
    layers before it normalising with the union's statistics); pooling them gives ``union[name]``.
    """

    union: dict[str, Moments]
    clients: dict[str, list[Moments | None]]


def norm_layers(model: nn.Module) -> list[tuple[str, _BatchNorm]]:
    """Every batch-statistics normalization layer (BN, FBN, HBN: any ``_BatchNorm``), by type."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, _BatchNorm)]


class _Moments:
    """A layer's per-batch moments of one client, pooled exactly at the end."""

    def __init__(self) -> None:
        self.parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def add(self, x: torch.Tensor) -> None:
        n = x.numel() // x.shape[1]
        if n:
            mean, var = batch_moments(x)
            self.parts.append((torch.tensor(float(n), dtype=torch.float64), mean, var))

    def result(self) -> Moments | None:
        if not self.parts:
            return None
        count, mean, var = (torch.stack(col) for col in zip(*self.parts))
        total, mu, v = pooled_stats(count, mean, var)
        return Moments(total, mu, v)


@contextlib.contextmanager
def recording_moments(model: nn.Module, order: list[str] | None = None) -> Iterator[dict[str, _Moments]]:
    """Record the moments of every normalization layer's input while active; ``order``, if
    given (and empty), receives the layer names in the order they first ran."""
    recorders: dict[str, _Moments] = {}
    handles = []
    for name, layer in norm_layers(model):
        def hook(_m: nn.Module, args: tuple[torch.Tensor, ...], name: str = name) -> None:
            if order is not None and name not in order:
                order.append(name)
            recorders[name].add(args[0])

        recorders[name] = _Moments()
        handles.append(layer.register_forward_pre_hook(hook))
    try:
        yield recorders
    finally:
        for h in handles:
            h.remove()


def _set_statistics(layer: _BatchNorm, m: Moments) -> None:
    with torch.no_grad():
        layer.running_mean.copy_(m.mean)  # type: ignore[union-attr]
        layer.running_var.copy_(m.var)  # type: ignore[union-attr]


def exact_statistics(
    model: nn.Module, client_x: Sequence[torch.Tensor], *, batch_size: int = 512, copy_model: bool = True
) -> ExactStatistics:
    """Exact union statistics of every normalization layer's input (see the module docstring).

    Args:
        model: the global model (its weights; its statistics buffers are overwritten on a copy).
        client_x: each client's inputs (empty tensors allowed).
        batch_size: chunk size of the passes (does not change the result beyond float rounding).
        copy_model: work on a deep copy (``False``: overwrite ``model``'s buffers in place).
    """
    net = copy.deepcopy(model) if copy_model else model
    layers = dict(norm_layers(net))
    if any(m.running_mean is None for m in layers.values()):
        raise ValueError("exact_statistics needs normalization layers with running statistics buffers")
    flags = [(m, m.training) for m in net.modules()]
    net.eval()
    order: list[str] = []
    try:
        result: ExactStatistics | None = None
        for step in range(max(1, len(layers))):
            per_client: list[dict[str, _Moments]] = []
            with torch.no_grad():
                for x in client_x:
                    with recording_moments(net, order if step == 0 else None) as rec:
                        for chunk in x.split(batch_size):
                            net(chunk)
                    per_client.append(rec)
            clients = {name: [rec[name].result() for rec in per_client] for name in layers}
            union: dict[str, Moments] = {}
            for name, moments in clients.items():
                present = [m for m in moments if m is not None]
                if not present:
                    continue
                total, mu, var = pooled_stats(torch.stack([m.count for m in present]),
                                              torch.stack([m.mean for m in present]), torch.stack([m.var for m in present]))
                union[name] = Moments(total, mu, var)
            result = ExactStatistics(union, clients)
            if step < len(order):
                _set_statistics(layers[order[step]], union[order[step]])
        assert result is not None
        return result
    finally:
        for m, flag in flags:
            m.training = flag


def standardized_distance(
    mean: torch.Tensor, var: torch.Tensor, ref: Moments, eps: float = 1e-5
) -> tuple[float, float]:
    """Distance of statistics ``(mean, var)`` from the reference, averaged over channels:
    the mean shift in units of the reference standard deviation, ``|μ − μ*| / sqrt(σ*² + ε)``,
    and the absolute log variance ratio, ``|log((σ² + ε) / (σ*² + ε))|`` (0 when equal; 0.1 is
    a 10% scale error of the normalised activations' variance)."""
    m, v = mean.double(), var.double()
    scale = (ref.var + eps).sqrt()
    shift = ((m - ref.mean).abs() / scale).mean()
    logratio = ((v.clamp_min(0) + eps) / (ref.var + eps)).log().abs().mean()
    return float(shift), float(logratio)
