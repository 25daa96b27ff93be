"""Running fednorm past one process: cross-client reductions over ``torch.distributed``."""

from .comm import DistributedClientComm, all_reduce_sum

__all__ = ["DistributedClientComm", "all_reduce_sum"]
