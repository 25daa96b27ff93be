"""The engine's cross-client reduction as a ``torch.distributed`` collective.

A norm layer that aggregates statistics over clients (FedTAN's synchronised BatchNorm) calls
``comm.reduce(t)`` on a tensor whose leading axis is the clients it holds. In one process that is
``t.sum(0)`` (:class:`~fednorm.nn.comm.LocalClientComm`); here each process first sums its own
clients, then all-reduces across processes, so the same layer code runs with clients spread over
ranks (gloo on CPU, NCCL on GPU).

FedTAN's backward pass aggregates the gradients with respect to the pooled mean and variance
(Algorithm 3) through the same handle (:meth:`~fednorm.nn.comm.ClientComm.shared`). Every rank
uses the reduced value in its own loss, and the federated objective is the sum of the ranks'
losses, so the gradient reaching each rank's input is the sum of the gradients of all ranks'
outputs: the backward of an all-reduce-sum is again an all-reduce-sum. :func:`all_reduce_sum`
is that primitive on its own, for code outside the norm layers.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..nn.comm import ClientComm

__all__ = ["DistributedClientComm", "all_reduce_sum"]


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t: torch.Tensor, group) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        out = t.detach().clone().contiguous()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        g = grad.detach().clone().contiguous()
        dist.all_reduce(g, op=dist.ReduceOp.SUM, group=ctx.group)
        return g, None


def all_reduce_sum(t: torch.Tensor, group=None) -> torch.Tensor:
    """Differentiable sum of ``t`` over the ranks of ``group`` (default: the world)."""
    return _AllReduceSum.apply(t, group)


class DistributedClientComm(ClientComm):
    """Sums over this process's clients (leading axis), then over every rank of ``group``.

    Counts exchanges and bytes in the federated protocol like every
    :class:`~fednorm.nn.comm.ClientComm` (``traffic``, this rank's clients' share), and the bytes
    this rank put into all-reduces (``bytes_sent``).
    """

    def __init__(self, group=None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("DistributedClientComm needs an initialised torch.distributed process group")
        super().__init__()
        self.group = group
        self._bytes = 0

    def _sum_participants(self, local: torch.Tensor) -> torch.Tensor:
        out = local.detach().clone().contiguous()
        self._bytes += out.numel() * out.element_size()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group)
        return out

    @property
    def bytes_sent(self) -> int:
        return self._bytes
