"""Local training of one client: the batch plan and the SGD loop.

Kept free of any notion of rounds or servers so the sequential executor, a future
vectorized executor and a distributed worker share the same rules: the same batches for the
same (seed, round, client), a fresh optimiser every round (HBN's, FedBN's and FedTAN's code
all re-create it), optional gradient clipping (HBN's code clips at 10), and DSGD's
persistent client momentum.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import DivergenceError
from ..nn.nf import adaptive_grad_clip_

__all__ = ["LocalSpec", "LocalResult", "batch_plan", "read_losses", "small_clients_message", "train_local"]


@dataclass(frozen=True)
class LocalSpec:
    """How a client trains in one round (resolved from the experiment config)."""

    batch_size: int
    epochs: int = 1
    steps: int | None = None
    drop_last: bool = False
    momentum: float = 0.0
    weight_decay: float = 0.0
    max_grad_norm: float | None = None
    agc_clip: float | None = None  # adaptive gradient clipping (FedWon), before max_grad_norm
    agc_skip: frozenset[str] = frozenset()  # parameters AGC leaves alone (the classifier)
    dsgd: bool = False
    augment: bool = False
    crop_padding: int = 4
    crop_fill: tuple[float, ...] | None = None  # per channel; None: zero padding
    channels_last: bool = False


@dataclass
class LocalResult:
    loss_sum: float = 0.0
    num_seen: int = 0
    steps: int = 0
    momentum: dict[str, torch.Tensor] | None = None
    # train_local(read=False): the step losses still on the device, their batch sizes and the
    # DivergenceError's place, until read_losses reads them (loss_sum is 0.0 until then)
    pending: tuple[torch.Tensor | None, list[int], str] | None = None

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.num_seen if self.num_seen else float("nan")


def batch_plan(
    num_samples: int,
    batch_size: int,
    *,
    epochs: int = 1,
    steps: int | None = None,
    drop_last: bool = False,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> list[torch.Tensor]:
    """Positions (into a client's index array) of each local mini-batch.

    With ``steps``, batches are consecutive slices of a stream of fresh permutations, so a
    client with fewer than ``steps * batch_size`` samples reshuffles between passes (the LN
    paper's "fresh shuffled pass"); a client smaller than one batch uses all its samples in
    each step. Otherwise ``epochs`` shuffled passes; a trailing batch of one sample is dropped
    when the pass has other batches, because BatchNorm cannot normalise a single value.

    The permutations are drawn on the CPU from ``generator``, so a run draws the same batches
    on every device; ``device`` is where the returned index tensors go (the data's device).
    """
    if num_samples <= 0:
        return []
    if device is not None and torch.device(device).type != "cpu":
        return [b.to(device) for b in batch_plan(num_samples, batch_size, epochs=epochs, steps=steps,
                                                 drop_last=drop_last, generator=generator)]
    if steps is not None:
        bs = min(batch_size, num_samples)
        stream: list[torch.Tensor] = []
        have = 0
        while have < steps * bs:
            stream.append(torch.randperm(num_samples, generator=generator))
            have += num_samples
        flat = torch.cat(stream)
        return [flat[i * bs : (i + 1) * bs] for i in range(steps)]
    per_epoch = len(batch_sizes(num_samples, batch_size, drop_last=drop_last))  # the trailing-batch rule, in one place
    plan: list[torch.Tensor] = []
    for _ in range(epochs):
        perm = torch.randperm(num_samples, generator=generator)
        plan.extend(perm.split(batch_size)[:per_epoch])
    return plan


def batch_sizes(num_samples: int, batch_size: int, *, epochs: int = 1, steps: int | None = None,
                drop_last: bool = False) -> list[int]:
    """The sizes of :func:`batch_plan`'s batches, without drawing them.

    The generator picks which samples a batch holds, never how many, so bookkeeping that needs
    only the counts (samples trained, a synchronised step's total batch) costs no permutation
    and, on a GPU, no copy to the device.
    """
    if num_samples <= 0:
        return []
    if steps is not None:
        return [min(batch_size, num_samples)] * steps
    full, rest = divmod(num_samples, batch_size)
    epoch = [batch_size] * full + ([rest] if rest else [])
    if len(epoch) > 1 and (drop_last and epoch[-1] < batch_size or epoch[-1] == 1):
        epoch = epoch[:-1]
    return epoch * epochs


def small_clients_message(sizes: Sequence[int], batch_size: int) -> str | None:
    """The warning for clients holding fewer samples than one batch, else None.

    :func:`batch_plan` gives such a client batches of all its samples (a smaller batch than the
    config says, and for BatchNorm noisier statistics), so a run says so once rather than not at all.
    """
    small = [n for n in sizes if 0 < n < batch_size]
    if not small:
        return None
    return (f"batch_size={batch_size} exceeds the training samples of {len(small)} of {len(sizes)} clients "
            f"(the smallest has {min(small)}); each of them trains on batches of all its samples instead")


@torch.no_grad()
def _sgd_step(params: list[torch.Tensor], buffers: list[torch.Tensor | None], lr: float, momentum: float,
              weight_decay: float) -> None:
    """One step of ``torch.optim.SGD(params, lr, momentum, weight_decay)`` (no dampening, no
    Nesterov), the same arithmetic as its per-tensor CPU path, written out because constructing
    the first ``torch.optim.SGD`` of a process imports ``torch._dynamo`` (about a second)."""
    for i, p in enumerate(params):
        g = p.grad
        if g is None:
            continue
        if weight_decay:
            g = g.add(p, alpha=weight_decay)
        if momentum:
            buf = buffers[i]
            if buf is None:
                buffers[i] = buf = torch.clone(g).detach()
            else:
                buf.mul_(momentum).add_(g)
            g = buf
        p.add_(g, alpha=-lr)


def _dsgd_step(
    params: list[tuple[str, nn.Parameter]], lr: float, spec: LocalSpec, momentum: dict[str, torch.Tensor] | None
) -> dict[str, torch.Tensor]:
    """One DSGD client step: m <- beta*m + (1-beta)*g, w <- w - lr*m (byzfl's convention for the
    FBN paper's DSGD, Guerraoui et al., 2024, App. B)."""
    beta = spec.momentum
    new_m: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, p in params:
            g = torch.zeros_like(p) if p.grad is None else p.grad
            if spec.weight_decay:
                g = g + spec.weight_decay * p
            prev = momentum.get(name) if momentum else None
            m = g.clone() if prev is None and beta == 0 else (
                (1 - beta) * g if prev is None else beta * prev + (1 - beta) * g
            )
            p.add_(m, alpha=-lr)
            new_m[name] = m
    return new_m


def _closure(
    model: nn.Module, params: list[torch.Tensor], xb: torch.Tensor, yb: torch.Tensor,
    loss_hook: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None,
) -> Callable[[], torch.Tensor]:
    """The step's loss recomputed at the model's current weights, gradients included."""

    def closure() -> torch.Tensor:
        for p in params:
            p.grad = None
        loss = F.cross_entropy(model(xb), yb)
        total = loss_hook(model, loss) if loss_hook is not None else loss
        total.backward()
        return loss.detach()

    return closure


def train_local(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    plan: list[torch.Tensor],
    *,
    lr: float,
    spec: LocalSpec,
    generator: torch.Generator | None = None,
    momentum: dict[str, torch.Tensor] | None = None,
    loss_hook: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None,
    grad_hook: Callable[[nn.Module, Callable[[], torch.Tensor]], None] | None = None,
    where: str = "",
    read: bool = True,
) -> LocalResult:
    """Run ``plan``'s mini-batches of SGD on ``(x, y)`` in place on ``model``.

    Args:
        model: trained in place (put in train mode).
        x, y: the samples the plan indexes: the client's own, or the whole dataset with the plan's
            batches mapped to the client's rows (the sequential executor: no copy of its data).
        plan: index tensors into ``x``, e.g. from :func:`batch_plan`.
        lr: learning rate of this round.
        spec: local optimisation settings.
        generator: draws the augmentation's random crops and flips.
        momentum: DSGD's persistent client momentum (name -> tensor), if ``spec.dsgd``.
        loss_hook: maps (model, data loss) to the loss to minimise (FedProx, MOON, ...).
        grad_hook: called after each step's backward pass with the model and a closure that
            recomputes the step's loss and its gradients on the same batch (clearing ``.grad``
            first); it may replace the gradients the step uses (FedSAM's second pass).
        where: "round R, client C, method M", named in a DivergenceError.
        read: sum and check the step losses before returning; ``False`` leaves them on the device
            in ``pending`` for :func:`read_losses`, which reads several clients' in one copy (a
            step whose training raises still reads its client's at once).

    Raises:
        DivergenceError: the loss became NaN or Inf (with ``read=False``: from :func:`read_losses`).
    """
    from ..data.transforms import random_crop_flip

    model.train()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    buffers: list[torch.Tensor | None] = [None] * len(params)  # a fresh optimiser every round
    result = LocalResult()
    # Each step's loss, kept on the data's device so that no step waits for it; read once when the
    # steps are done (_read_losses), which sums them and checks them as each step did. Held in the
    # loss's own dtype (exact, and a float64 buffer does not exist on every device, e.g. MPS).
    losses: torch.Tensor | None = None
    sizes: list[int] = []
    try:
        for batch in plan:
            xb = x.index_select(0, batch)
            yb = y.index_select(0, batch)
            if spec.augment:
                xb = random_crop_flip(xb, padding=spec.crop_padding, generator=generator, fill=spec.crop_fill)
            if spec.channels_last and xb.dim() == 4:
                xb = xb.contiguous(memory_format=torch.channels_last)
            loss = F.cross_entropy(model(xb), yb)
            if losses is None:
                losses = torch.empty(len(plan), dtype=loss.dtype, device=loss.device)
            losses[result.steps] = loss.detach()
            sizes.append(len(batch))
            total = loss_hook(model, loss) if loss_hook is not None else loss
            for p in params:
                p.grad = None
            total.backward()
            if grad_hook is not None:
                grad_hook(model, _closure(model, params, xb, yb, loss_hook))
            if spec.agc_clip:
                adaptive_grad_clip_([p for n, p in named if n not in spec.agc_skip], spec.agc_clip)
            if spec.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, spec.max_grad_norm)
            if spec.dsgd:
                result.momentum = _dsgd_step(named, lr, spec, momentum)
            else:
                _sgd_step(params, buffers, lr, spec.momentum, spec.weight_decay)
            result.num_seen += len(batch)
            result.steps += 1
    except Exception:
        _read_losses(losses, sizes, where)  # a step after a divergence may fail on its NaNs: that is the cause
        raise
    if read:
        result.loss_sum = _read_losses(losses, sizes, where)
    else:
        result.pending = (losses, sizes, where)
    return result


def _read_losses(losses: torch.Tensor | None, sizes: list[int], where: str) -> float:
    """The summed loss of :func:`train_local`'s steps (``losses[t]`` times ``sizes[t]``, added in
    step order on the host, as each step once did), read from the device once; raises
    :class:`~fednorm.errors.DivergenceError` for the first step whose loss was not finite."""
    if losses is None:  # no step computed a loss
        return 0.0
    return _sum_losses(losses[: len(sizes)].tolist(), sizes, where)


def _sum_losses(values: list[float], sizes: list[int], where: str) -> float:
    total = 0.0
    for step, (value, size) in enumerate(zip(values, sizes), start=1):
        if not math.isfinite(value):
            raise DivergenceError(f"non-finite training loss ({value}) at {where or 'local training'}, step {step}")
        total += value * size
    return total


def read_losses(results: Sequence[LocalResult]) -> None:
    """Sum and check the pending step losses of several :func:`train_local` calls (``read=False``)
    with one read from the device, result by result in order, with :func:`train_local`'s own
    arithmetic: each ``loss_sum`` is what reading it there gave, and the first non-finite loss
    raises the DivergenceError that call would have raised."""
    waiting = [r for r in results if r.pending is not None]
    held = [(r, r.pending[0][: len(r.pending[1])]) for r in waiting if r.pending[0] is not None]
    dtype = functools.reduce(torch.promote_types, (t.dtype for _, t in held)) if held else None
    values = iter(torch.cat([t.to(dtype) for _, t in held]).tolist() if held else [])  # exact: a wider float
    for r in waiting:
        losses, sizes, where = r.pending
        if losses is not None:
            r.loss_sum = _sum_losses([next(values) for _ in sizes], sizes, where)
        r.pending = None
