"""The engine's cross-client reduction as a ``torch.distributed`` collective.

A norm layer that aggregates statistics over clients (FedTAN's synchronised BatchNorm, FBN) calls
``comm.sum(t)`` on a tensor whose leading axis is the clients it holds. In one process that is
``t.sum(0)`` (:class:`~fednorm.nn.comm.LocalClientComm`); here each process first sums its own
clients, then all-reduces across processes, so the same layer code runs with clients spread over
ranks (gloo on CPU, NCCL on GPU).

The reduction must stay differentiable: FedTAN's backward pass aggregates the gradients with
respect to the pooled mean and variance (Algorithm 3). Every rank uses the reduced value in its
own loss, and the federated objective is the sum of the ranks' losses, so the gradient reaching
each rank's input is the sum of the gradients of all ranks' outputs: the backward of an
all-reduce-sum is again an all-reduce-sum.
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
    """``sum`` over this process's clients (leading axis), then over every rank of ``group``.

    Counts the reductions and the bytes this rank sends, for communication accounting.
    """

    def __init__(self, group=None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("DistributedClientComm needs an initialised torch.distributed process group")
        self.group = group
        self.num_reductions = 0
        self._bytes = 0

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        local = t.sum(dim=0) if t.dim() else t
        self.num_reductions += 1
        self._bytes += local.numel() * local.element_size()
        return all_reduce_sum(local, self.group)

    @property
    def bytes_sent(self) -> int:
        return self._bytes
