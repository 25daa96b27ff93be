"""Running fednorm past one process: the simulator's clients spread over ``torch.distributed``
ranks (``fednorm launch`` / ``torchrun -m fednorm.distributed``), and the engine's cross-client
reductions as collectives."""

from .comm import DistributedClientComm, all_reduce_sum
from .runtime import DistributedSimulation, host_of, init_distributed

__all__ = ["DistributedClientComm", "DistributedSimulation", "all_reduce_sum", "host_of", "init_distributed"]
