"""Stacked FBN layers (Guerraoui et al. 2024, "Overcoming the Challenges of Batch Normalization in
Federated Learning", §4, Algorithm 2) and the recorders the FBN method reads their batch statistics with."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layout import NotStackableError
from .norms import StackedBatchNorm

__all__ = ["StackedFederatedBatchNorm", "attach_stacked_fbn_recorders", "detach_stacked_fbn_recorders"]


class StackedFederatedBatchNorm(StackedBatchNorm):
    """K clients' FBN layers (:class:`~fednorm.nn.fbn.FederatedBatchNorm`): each client normalises
    with its own row of the shared running statistics (``[K, C]`` buffers), in training as in
    evaluation, so the forward is one ``F.batch_norm`` over ``K·C`` channels in eval mode.

    Training mode adds what the FBN layer adds, per client: each client's batch
    ``(count, mean, biased var)`` in float64; with a recorder attached
    (:func:`attach_stacked_fbn_recorders`, the FBN method's stacked hooks) the buffers stay the
    round-start statistics and every training forward appends
    ``(clients [K'], count [K'], mean [K', C], var [K', C])``, ``clients`` being the rows this pass
    ran (:func:`~fednorm.nn.stacked.norms.set_forward_clients`); without one each client applies
    steps 5–6 of Algorithm 2 in place with ``c = n/(n−1)``, as the single-participant layer does.
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
                    from ..fbn import fbn_local_update

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
