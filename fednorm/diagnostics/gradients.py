"""Gradient deviation: how far the clients' p-weighted gradient is from centralized BatchNorm's.

FedTAN (Wang et al., 2023, Sec. 3.1) traces FedAvg+BN's bias to each client's gradient being computed
through its own batch statistics: on the union of the clients' batches the p-weighted sum of the
clients' gradients differs from the gradient of centralized BN on the union batch (its B_i
terms). This module measures that difference on a probe batch drawn across clients, at the
current global weights:

* the **centralized** gradient: the union probe batch through the model with every
  normalization layer computing training-mode BatchNorm with the union batch's own statistics;
* the **clients'** gradient ``Σ p_i g_i`` (``p_i = b_i / Σ b``, the probe counts): each client's
  slice through the model as the method trains it (``"local"``: the layers' own training
  forward, i.e. BN with the client's batch statistics, HBN's hybrid mix with the client's alpha,
  FBN with the shared statistics), or, for FedTAN's synchronised step (``"synchronised"``), with
  every BN layer computed by :func:`fednorm.nn.functional.cross_client_batch_norm`, the
  cross-client BN of FedTAN's Algorithms 2 and 3, whose gradient equals the centralized one.

Both are gradients of the mean cross-entropy over the shared trainable parameters. Dropout is
off (evaluation mode) so that the two passes see the same network; normalization layers run in
training mode.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Callable, Iterator, Literal, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..nn.fbn import FederatedBatchNorm, recording_fbn_statistics
from ..nn.functional import cross_client_batch_norm
from .statistics import norm_layers

__all__ = ["GradientDeviation", "gradient_deviation"]

ClientMode = Literal["local", "synchronised"]


class GradientDeviation(dict):
    """``{"cosine": ..., "rel_error": ..., "norm_ratio": ...}`` of the clients' gradient against
    the centralized one (cosine 1 and errors 0 when they agree)."""


@contextlib.contextmanager
def _replaced_norm(model: nn.Module, fn: Callable[[_BatchNorm, torch.Tensor], torch.Tensor]) -> Iterator[None]:
    handles = [m.register_forward_hook(lambda mod, args, _out: fn(mod, args[0])) for _, m in norm_layers(model)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _centralized_bn(m: _BatchNorm, x: torch.Tensor) -> torch.Tensor:
    return F.batch_norm(x, None, None, m.weight, m.bias, True, 0.0, m.eps)


def _grads(model: nn.Module, names: list[str], loss: torch.Tensor) -> torch.Tensor:
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
    return torch.cat([(torch.zeros_like(params[n]) if g is None else g).reshape(-1).double() for n, g in zip(names, grads)])


def _train_norms_only(model: nn.Module) -> None:
    model.eval()
    for _, m in norm_layers(model):
        m.train()


def gradient_deviation(
    model: nn.Module,
    global_state: dict[str, torch.Tensor],
    client_states: Sequence[dict[str, torch.Tensor]],
    xs: Sequence[torch.Tensor],
    ys: Sequence[torch.Tensor],
    params: list[str],
    mode: ClientMode = "local",
) -> GradientDeviation:
    """Cosine, relative error ``|g − g*| / |g*|`` and norm ratio ``|g| / |g*|`` of the clients'
    p-weighted gradient ``g`` against the centralized gradient ``g*`` (module docstring).

    Args:
        model: a working model (a deep copy is used; nothing of it changes).
        global_state: the global model's state (the centralized reference's weights).
        client_states: each client's full model state (global tensors plus its local ones).
        xs, ys: each client's probe samples (at least 2 each).
        params: names of the parameters compared (the shared trainable ones).
        mode: how the clients compute their gradient: ``"local"`` or ``"synchronised"``.
    """
    net = copy.deepcopy(model)
    counts = torch.tensor([float(len(x)) for x in xs], dtype=torch.float64)
    p = counts / counts.sum()
    x_all, y_all = torch.cat(list(xs)), torch.cat(list(ys))

    net.load_state_dict(global_state)
    _train_norms_only(net)
    with _replaced_norm(net, _centralized_bn):
        central = _grads(net, params, F.cross_entropy(net(x_all), y_all))

    if mode == "synchronised":
        sizes = [len(x) for x in xs]

        def synced(m: _BatchNorm, x: torch.Tensor) -> torch.Tensor:
            return torch.cat(cross_client_batch_norm(list(x.split(sizes)), m.weight, m.bias, eps=m.eps))

        net.load_state_dict(global_state)
        _train_norms_only(net)
        with _replaced_norm(net, synced):
            out = net(x_all)
            loss = sum(p[i] * F.cross_entropy(o, y) for i, (o, y) in enumerate(zip(out.split(sizes), ys)))
            clients = _grads(net, params, loss)  # type: ignore[arg-type]
    elif mode == "local":
        clients = torch.zeros_like(central)
        fbn = any(isinstance(m, FederatedBatchNorm) for m in net.modules())
        for i, (state, x, y) in enumerate(zip(client_states, xs, ys)):
            net.load_state_dict(state)
            _train_norms_only(net)
            with recording_fbn_statistics(net) if fbn else contextlib.nullcontext():
                clients += p[i] * _grads(net, params, F.cross_entropy(net(x), y))
    else:
        raise ValueError(f"unknown client mode '{mode}' (local, synchronised)")
    ref = central.norm()
    return GradientDeviation(
        cosine=float(clients @ central / (clients.norm() * ref).clamp_min(1e-300)),
        rel_error=float((clients - central).norm() / ref.clamp_min(1e-300)),
        norm_ratio=float(clients.norm() / ref.clamp_min(1e-300)),
    )
