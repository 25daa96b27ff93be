"""Exact statistics of every normalization layer's input on the union of the clients' data.

The reference of the statistics diagnostics: what centralized BatchNorm on all the clients' data
would normalise with, under the current global weights. Every layer's statistics depend on how
the layers before it normalise, so the reference is the fixed point in which *each* layer
normalises with the exact (biased) union statistics of its input, which is what training-mode
BatchNorm does with the whole union as one batch. It is computed in L statistics passes
(L normalization layers, evaluation mode, so every layer normalises with its buffers): pass k
runs the data up to the first layer in forward order whose statistics are not yet set, records
its input there (every layer before it already normalising with its exact statistics), and sets
them. Moments are taken per batch with
:func:`fednorm.nn.hbn.batch_moments` (float64) and pooled exactly with
:func:`fednorm.nn.functional.pooled_stats`, per client and then over clients (HBN's Eq. 8 code).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..nn.functional import pooled_stats
from ..nn.hbn import batch_moments

__all__ = ["Moments", "ExactStatistics", "norm_layers", "exact_statistics", "standardized_distance"]


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


def _set_statistics(layer: _BatchNorm, m: Moments) -> None:
    with torch.no_grad():
        layer.running_mean.copy_(m.mean)  # type: ignore[union-attr]
        layer.running_var.copy_(m.var)  # type: ignore[union-attr]


class _Stop(Exception):
    """Ends a statistics pass once the layer it is for has been recorded."""


def exact_statistics(
    model: nn.Module, client_x: Sequence[torch.Tensor], *, batch_size: int = 512, channels_last: bool = False,
    progress: Callable[[int, int, str], None] | None = None,
) -> ExactStatistics:
    """Exact union statistics of every normalization layer's input (see the module docstring).

    Pass k runs each client's data (no gradient, evaluation mode) up to the first layer whose
    statistics are not yet set, records that layer's input and stops there, so a pass costs
    only the network's prefix up to its layer; the layer's buffers then take the union's
    statistics. The model's buffers are set on a deep copy; ``model`` is unchanged.

    Args:
        model: the global model (its weights and, for layers not reached, nothing else).
        client_x: each client's inputs (empty tensors allowed).
        batch_size: chunk size of the passes (does not change the result beyond float rounding).
        channels_last: feed 4-D batches channels-last (faster convolutions and pooling on CPU).
        progress: called as ``progress(k, L, layer)`` after the k-th of the L passes (a deep
            network's passes over a large union take minutes on a CPU).
    """
    net = copy.deepcopy(model)
    layers = dict(norm_layers(net))
    if any(m.running_mean is None for m in layers.values()):
        raise ValueError("exact_statistics needs normalization layers with running statistics buffers")
    net.eval()
    union: dict[str, Moments] = {}
    clients: dict[str, list[Moments | None]] = {}
    current: list[tuple[str, _Moments] | None] = [None]

    def hook(_m: nn.Module, args: tuple[torch.Tensor, ...], name: str) -> None:
        if name in union:
            return
        if current[0] is None:
            current[0] = (name, _Moments())
        if current[0][0] == name:
            current[0][1].add(args[0])
        raise _Stop

    handles = [m.register_forward_pre_hook(lambda mod, args, name=name: hook(mod, args, name)) for name, m in layers.items()]
    try:
        for _ in range(len(layers)):
            target: str | None = None
            per_client: list[Moments | None] = []
            with torch.no_grad():
                for x in client_x:
                    current[0] = None if target is None else (target, _Moments())
                    for chunk in x.split(batch_size):
                        if channels_last and chunk.dim() == 4:
                            chunk = chunk.contiguous(memory_format=torch.channels_last)
                        try:
                            net(chunk)
                        except _Stop:
                            pass
                    if current[0] is not None:
                        target = current[0][0]
                    per_client.append(None if current[0] is None else current[0][1].result())
            if target is None:  # no layer left that the data reaches
                break
            present = [m for m in per_client if m is not None]
            total, mu, var = pooled_stats(torch.stack([m.count for m in present]),
                                          torch.stack([m.mean for m in present]), torch.stack([m.var for m in present]))
            union[target] = Moments(total, mu, var)
            clients[target] = per_client
            _set_statistics(layers[target], union[target])
            if progress is not None:
                progress(len(union), len(layers), target)
    finally:
        for h in handles:
            h.remove()
    return ExactStatistics(union, clients)


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
