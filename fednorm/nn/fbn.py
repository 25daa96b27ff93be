"""Federated BatchNorm (FBN) layers: normalise with the *shared* running statistics, always.

FBN (Guerraoui et al. 2024, "Overcoming the Challenges of Batch Normalization in Federated
Learning", Sec. 4, Algorithm 2) replaces each BatchNorm. In training *and* in
evaluation a layer normalises with its ``running_mean``/``running_var`` buffers, which hold the
statistics shared by every client (step 2), so no gradient flows through batch statistics and
every client applies the same per-channel affine map. The batch statistics only feed the
running-statistics update (steps 4–6), which the FBN method aggregates exactly (Eq. 9–10) so
that the shared statistics equal centralized BatchNorm's running statistics on the union of the
clients' batches.

This module holds the pure functions (:func:`federated_batch_norm`, :func:`fbn_local_update`,
:func:`fbn_aggregate`), the layers :class:`FederatedBatchNorm1d`/:class:`FederatedBatchNorm2d`
(registered as the norm ``"fbn"``) and the recorder the FBN method uses to collect batch
statistics during local training.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .functional import channel_stats
from .norms import register_norm

__all__ = [
    "federated_batch_norm",
    "fbn_local_update",
    "fbn_aggregate",
    "corrected_variance",
    "FederatedBatchNorm",
    "FederatedBatchNorm1d",
    "FederatedBatchNorm2d",
    "create_federated_batch_norm",
    "fbn_modules",
    "attach_fbn_recorders",
    "detach_fbn_recorders",
    "recording_fbn_statistics",
]


def federated_batch_norm(
    input: torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> torch.Tensor:
    """FBN's normalisation (Algorithm 2, step 2): ``(x − ū_run)/sqrt(σ̂²_run + ε)·α + ζ``.

    Identical in training and evaluation mode (FBN paper, Guerraoui et al., 2024, Sec. 4): the running
    statistics are constants, so backpropagation sees a fixed per-channel affine map with
    ``∂y/∂x = α/sqrt(σ̂²_run + ε)`` and no coupling between the samples of a batch. ``training``
    and ``momentum`` are accepted for ``F.batch_norm``'s argument order; the statistics update
    is :func:`fbn_local_update`.
    """
    del training, momentum
    return F.batch_norm(input, running_mean.detach(), running_var.detach(), weight, bias, False, 0.0, eps)


def fbn_local_update(
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    batch_mean: torch.Tensor,
    batch_var: torch.Tensor,
    momentum: float,
    correction: float | torch.Tensor = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A client's local copy of the running statistics (FBN Algorithm 2, steps 5–6).

    ``ū_run^(i) = (1−β)·ū_run + β·ū^(i)`` and ``σ̂²_run^(i) = (1−β)·σ̂²_run + β·c·σ̂^(i)²`` where
    ``batch_var`` is the biased batch variance and ``c`` the unbiasing factor: the paper's
    ``Kn/(Kn−1)`` with the *global* count Kn. The FBN method passes ``c = 1`` on the client and
    lets the server apply ``M/(M−1)`` (it alone knows the global count M; fednorm's choice, docs/fbn.md).
    """
    b = momentum
    return (1 - b) * running_mean + b * batch_mean, (1 - b) * running_var + b * correction * batch_var


def corrected_variance(
    count: torch.Tensor,
    local_mean: torch.Tensor,
    local_var: torch.Tensor,
    shared_var: torch.Tensor,
    mean: torch.Tensor,
    momentum: float,
    decay: torch.Tensor | float,
) -> torch.Tensor:
    """Per-client corrected variance ``v_i`` whose count-weighted mean is Eq. 10 (Guerraoui et al.,
    2024, Sec. 4–5).

    ``v_i = a·σ̂²_run + c·(σ̂²_run^(i) − a·σ̂²_run) + (c/β)·(ū_run^(i) − ū)²`` with ``c = M/(M−1)``,
    ``M = Σ count``, ``a = decay`` (``1 − β`` for a one-step copy). ``local_var`` holds copies
    made with biased batch variances (c = 1), so ``c`` unbiases the batch part only (Eq. 6).
    """
    total = count.double().sum()
    c = total / (total - 1)
    base = decay * shared_var.double()
    return base + c * (local_var.double() - base) + (c / momentum) * (local_mean.double() - mean) ** 2


def fbn_aggregate(
    count: torch.Tensor,
    local_mean: torch.Tensor,
    local_var: torch.Tensor,
    shared_var: torch.Tensor,
    momentum: float,
    *,
    decay: torch.Tensor | float | None = None,
    mean_rule=None,
    var_rule=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Server rule of FBN (Eq. 9–10), generalised to unequal counts and robust aggregators.

    Inputs are the clients' local copies computed with ``c = 1`` (:func:`fbn_local_update` with
    biased batch variances), one row per client. With ``M = ΣK_i``, ``w_i = K_i/M`` and
    ``c = M/(M−1)`` (derived here for unequal batch sizes; exact)::

        ū_run = Σ w_i ū_run^(i)                                                  (Eq. 9)
        v_i   = a·σ̂²_run + c·(σ̂²_run^(i) − a·σ̂²_run) + (c/β)·(ū_run^(i) − ū_run)²
        σ̂²_run = Σ w_i v_i                                                        (Eq. 10)

    where ``a = 1 − β`` (``decay``) undoes the client's share of the old variance so that the
    unbiasing factor applies to the batch variance only, as in Eq. 6. With equal counts and the
    mean this is exactly Eq. 9–10; the result equals centralized BatchNorm's running statistics
    after one step on the union of the batches (FBN App. A; tested in float64).

    Robust FBN (Guerraoui et al., 2024, Sec. 5; the two-stage rule is fednorm's reading):
    ``mean_rule(rows)`` / ``var_rule(rows)`` replace the weighted
    means: ``ū_run = Agg(NNM(ū_run^(i)))``, then ``σ̂²_run = max(Agg(NNM(v_i)), 0)``. Both reduce
    to the weighted mean when they are ``None``.

    Args:
        count: ``[K]`` values per channel in each client's batch (b·H·W); rows with count 0 are
            ignored.
        local_mean, local_var: ``[K, C]`` local copies (``c = 1``).
        shared_var: ``[C]`` the previous shared running variance σ̂²_run.
        momentum: β.
        decay: ``a`` per client (``[K]``) or scalar: ``1 − β`` for one step, ``(1 − β)^E`` for
            the literal E-step copies (default: ``1 − β``).
        mean_rule, var_rule: callables ``[K', D] -> [D]`` (robust aggregators), or None.

    Returns:
        ``(ū_run, σ̂²_run)``, each ``[C]``, float64.
    """
    count = count.to(torch.float64).reshape(-1)
    keep = count > 0
    count, local_mean, local_var = count[keep], local_mean[keep].double(), local_var[keep].double()
    if isinstance(decay, torch.Tensor) and decay.dim() > 0:
        decay = decay.reshape(-1)[keep].double().unsqueeze(-1)
    a = (1.0 - momentum) if decay is None else decay
    w = (count / count.sum()).unsqueeze(-1)
    mean = (w * local_mean).sum(0) if mean_rule is None else mean_rule(local_mean)
    v = corrected_variance(count, local_mean, local_var, shared_var, mean, momentum, a)
    var = (w * v).sum(0) if var_rule is None else var_rule(v).clamp_min(0.0)
    return mean, var


class FederatedBatchNorm(_BatchNorm):
    """Base class of the FBN layers (Guerraoui et al., 2024, Sec. 4, Algorithm 2).

    Subclasses ``_BatchNorm`` so its state-dict keys are BN's and BN checkpoints load; it adds no
    tensors: ``running_mean``/``running_var`` *are* the shared statistics (ū_run, σ̂²_run),
    initialised to (0, 1) as in the paper (App. A/B), so the first round only applies the
    affine map (``initial_pass`` of the FBN method starts from exact statistics instead).

    Training and evaluation both normalise with the running statistics
    (:func:`federated_batch_norm`). What training mode adds is the statistics update:

    * **inside the FBN method** (a recorder is attached, :func:`recording_fbn_statistics`): the
      layer leaves its buffers alone and records each batch's ``(count, mean, biased var)``;
      the method turns them into the client's local copy (steps 5–6) and the server
      aggregates (Eq. 9–10). The buffers therefore stay the round-start shared statistics for
      the whole round.
    * **on its own** (no recorder; one participant): it applies steps 5–6 in place with
      ``c = K/(K−1)``, which is centralized BN's running-statistics update (Algorithm 1) while
      normalising with the running statistics.

    Communication roles: :attr:`stat_buffers` are aggregated by the FBN method's rule, never
    averaged naively. ``weight``/``bias`` are trained and aggregated like other parameters.

    Args:
        num_features: number of channels C.
        eps: added to the variance (default: 1e-5; the paper does not state it).
        momentum: β of steps 5–6 (default: 0.1, PyTorch's; the paper does not state it).
            ``None`` (cumulative averaging) is not supported.
        affine: learn α (scale) and ζ (shift) (default: True).
        device, dtype: factory arguments.
    """

    #: FBN's statistics come from its method; under plain FedAvg they would be averaged naively.
    requires_method: str = "fbn"
    #: Buffers holding the shared statistics (ū_run, σ̂²_run), set by the server (Eq. 9–10).
    stat_buffers: tuple[str, ...] = ("running_mean", "running_var")

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if not (isinstance(momentum, (int, float)) and 0 < momentum <= 1):
            raise ValueError(f"FederatedBatchNorm: momentum (β) must be in (0, 1], got {momentum!r}")
        super().__init__(num_features, eps, momentum, affine, True, device=device, dtype=dtype)
        self._recorder: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None

    @property
    def shared_mean(self) -> torch.Tensor:
        """The shared running mean ū_run, held in the ``running_mean`` buffer."""
        return self.running_mean  # type: ignore[return-value]

    @property
    def shared_var(self) -> torch.Tensor:
        """The shared running variance σ̂²_run, held in the ``running_var`` buffer."""
        return self.running_var  # type: ignore[return-value]

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}"

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if self.training:
            if input.numel() // input.shape[1] < 2:
                raise ValueError(
                    f"Expected more than 1 value per channel when training, got input size {tuple(input.shape)}"
                )
            with torch.no_grad():
                count, mean, var = channel_stats(input.detach().to(torch.float64))  # step 4
                if self._recorder is not None:
                    self._recorder.append((count, mean, var))
                else:
                    c = count / (count - 1)
                    new_mean, new_var = fbn_local_update(
                        self.running_mean.double(), self.running_var.double(), mean, var, float(self.momentum), c  # type: ignore[union-attr]
                    )
                    self.running_mean.copy_(new_mean)  # type: ignore[union-attr]
                    self.running_var.copy_(new_var)  # type: ignore[union-attr]
                self.num_batches_tracked.add_(1)  # type: ignore[union-attr]
        return federated_batch_norm(
            input, self.running_mean, self.running_var, self.weight, self.bias, self.training, 0.0, self.eps  # type: ignore[arg-type]
        )


class FederatedBatchNorm1d(FederatedBatchNorm):
    """FBN for ``(N, C)`` or ``(N, C, L)`` inputs. See :class:`FederatedBatchNorm`.

    Shape:
        - Input: ``(N, C)`` or ``(N, C, L)``; Output: same shape.
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() not in (2, 3):
            raise ValueError(f"expected 2D or 3D input (got {input.dim()}D input)")


class FederatedBatchNorm2d(FederatedBatchNorm):
    """FBN for ``(N, C, H, W)`` inputs; statistics over N×H×W (K = b·H·W values per channel).

    See :class:`FederatedBatchNorm`.

    Shape:
        - Input: ``(N, C, H, W)``; Output: same shape.

    Examples:
        >>> layer = FederatedBatchNorm2d(4).eval()
        >>> bool((layer(torch.ones(2, 4, 3, 3)) == torch.ones(2, 4, 3, 3) / (1 + 1e-5) ** 0.5).all())
        True
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 4:
            raise ValueError(f"expected 4D input (got {input.dim()}D input)")


@register_norm("fbn")
def create_federated_batch_norm(
    num_features: int,
    *,
    spatial: bool = True,
    eps: float = 1e-5,
    momentum: float = 0.1,
    affine: bool = True,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """Norm builder for FBN: ``FederatedBatchNorm2d`` (``spatial=True``) or ``FederatedBatchNorm1d``."""
    cls = FederatedBatchNorm2d if spatial else FederatedBatchNorm1d
    return cls(num_features, eps=eps, momentum=momentum, affine=affine, device=device, dtype=dtype)


def fbn_modules(model: nn.Module) -> list[tuple[str, FederatedBatchNorm]]:
    """``(qualified_name, layer)`` for every FBN layer of ``model``, selected by type."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, FederatedBatchNorm)]


FBNRecords = dict[str, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]


def attach_fbn_recorders(model: nn.Module) -> FBNRecords:
    """Attach a fresh recorder to every FBN layer; returns ``{layer_name: records}``."""
    records: FBNRecords = {}
    for name, layer in fbn_modules(model):
        records[name] = layer._recorder = []
    return records


def detach_fbn_recorders(model: nn.Module) -> None:
    """Detach the recorders: the layers update their own statistics again (single participant)."""
    for _, layer in fbn_modules(model):
        layer._recorder = None


@contextlib.contextmanager
def recording_fbn_statistics(
    model: nn.Module,
) -> Iterator[FBNRecords]:
    """Attach a recorder to every FBN layer: buffers stay fixed, batch statistics are listed.

    Yields ``{layer_name: [(count, mean, biased var), ...]}`` (float64, one entry per
    training-mode forward). Recorders are detached on exit, even after an error.
    """
    records = attach_fbn_recorders(model)
    try:
        yield records
    finally:
        detach_fbn_recorders(model)
