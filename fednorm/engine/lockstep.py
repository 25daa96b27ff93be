"""One synchronised local step of all clients in a stacked model (FedTAN's first step).

FedTAN (Wang et al., 2023, Sec. 5, Algorithms 1–3) makes the first local step of every round
exact centralized BatchNorm training on the union of the clients' batches: each BN layer's mean, then variance
around that mean, are aggregated across clients in the forward pass, and the gradients with
respect to them in the backward pass. In a stacked model the clients are channel blocks of one
network, so the aggregation is a reduction over the client axis inside
:class:`~fednorm.nn.stacked.StackedBatchNorm` and autograd carries the backward half.

Two details make the step exact for any batch sizes:

- clients with fewer samples than the largest batch are padded by repeating their own rows,
  and a row mask keeps the padded rows out of every statistic and of the loss;
- the loss is ``Σ_i p_i F_i`` with ``p_i = B_i / ΣB`` (the weights that make the pooled
  statistics the union's), so autograd gives client ``i`` the gradient ``p_i ∇F_i``; each
  client's rows are then divided by ``p_i``. The p-weighted sum of the client gradients is the
  centralized gradient on the union batch (tested in float64 to ~1e-12).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from ..nn.stacked import set_row_mask, to_client_layout

__all__ = ["synced_loss", "scale_client_grads"]


def synced_loss(
    forward: Callable[[torch.Tensor], torch.Tensor],
    net: torch.nn.Module,
    xs: Sequence[torch.Tensor],
    ys: Sequence[torch.Tensor],
    *,
    channels_last: bool = False,
    total_batch: int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward every client's batch through ``forward`` in one stacked pass.

    Args:
        forward: the stacked model's forward (``net`` itself or a ``functional_call`` on it).
        net: the stacked model whose BN layers are synchronised (for the row mask).
        xs, ys: each client's batch (``B_i × ...``) and labels.
        channels_last: convert 4-d input to channels-last memory format.
        total_batch: the samples of *all* the step's clients, these and those on other
            processes (default: those in ``xs``), which normalise the weights ``p_i``. Every
            party knows the batch sizes in advance (they follow from the clients' dataset sizes
            and the batch plan), as the paper's server knows its ``p_i``: no exchange. A tensor
            gives each client's own total: the clients of several runs in one model, each run
            synchronised among its own clients (``fednorm.nn.comm.GroupedClientComm``).

    Returns:
        ``(losses, total, p)``: each client's mean loss ``F_i`` ``[K]``, the loss to
        differentiate ``Σ p_i F_i``, and the client weights ``p`` ``[K]``.
    """
    sizes = [len(x) for x in xs]
    k, bmax = len(xs), max(sizes)
    padded = [x if len(x) == bmax else x[torch.arange(bmax) % len(x)] for x in xs]
    x = to_client_layout(torch.stack(padded))
    if channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    size_t = torch.tensor(sizes, dtype=x.dtype, device=x.device)
    mask = torch.arange(bmax, device=x.device).unsqueeze(1) < size_t.unsqueeze(0)  # [B, K]
    ragged = min(sizes) < bmax  # known on the host: no read of the mask
    set_row_mask(net, mask if ragged else None, total_rows=total_batch, row_sizes=sizes)
    try:
        logits = forward(x)
    finally:
        set_row_mask(net, None)
    logits = logits.reshape(bmax, k, -1).transpose(0, 1)  # [K, B, classes]
    y = torch.stack([yb if len(yb) == bmax else yb[torch.arange(bmax) % len(yb)] for yb in ys])
    per_sample = F.cross_entropy(logits.reshape(k * bmax, -1), y.reshape(-1), reduction="none").view(k, bmax)
    if ragged:
        per_sample = per_sample * mask.t().to(per_sample.dtype)
    losses = per_sample.sum(dim=1) / size_t
    if isinstance(total_batch, torch.Tensor):
        p = size_t / total_batch.to(dtype=size_t.dtype, device=size_t.device)
    else:
        p = size_t / (size_t.sum() if total_batch is None else float(total_batch))
    return losses, (p * losses).sum(), p


@torch.no_grad()
def scale_client_grads(params: dict[str, torch.Tensor], scale: torch.Tensor) -> None:
    """Multiply each client's gradient rows (leading axis) by ``scale[k]``."""
    for p in params.values():
        if p.grad is not None:
            p.grad.mul_(scale.to(p.grad.dtype).view(-1, *([1] * (p.dim() - 1))))
