"""How many torch threads ``fednorm run`` and ``fednorm compare`` use when ``--threads`` is not given.

torch starts one intra-op thread per physical core whether or not the cores are free. On a busy
2-core machine that is ruinous: the README's ``fednorm compare`` took 5m54s with torch's two
threads at load 4 and 20.7 s with one, and one sequential FedAvg round on digits 83 s against
2.3 s. On a quiet machine two threads gained at most 1.53x (vectorized executor, CIFAR-10) and
nothing for the sequential executor (issue 24). So the default is the cores this process may use
(``os.sched_getaffinity``) minus the 1-minute load average, rounded, between 1 and torch's own
default; an explicit ``OMP_NUM_THREADS`` is the user's choice and is kept. The CLI writes the
number into the run's ``config.yaml`` (so ``--resume`` and a repeat from that file use the same
count and stay bit-identical) and ``summary.json`` records the count that ran.
"""

from __future__ import annotations

import os

__all__ = ["usable_cores", "choose_threads"]


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask), else ``os.cpu_count()``."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def choose_threads(torch_default: int | None = None, load: float | None = None, cores: int | None = None) -> tuple[int, str]:
    """The thread count for a run and why, e.g. ``(1, "2 cores, load 3.52")``."""
    import torch

    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads(), f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"
    torch_default = torch_default or torch.get_num_threads()
    cores = cores or usable_cores()
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = 0.0
    free = int(round(cores - load))
    n = max(1, min(torch_default, cores, free))
    return n, f"{cores} cores, load {load:.2f}"
