"""How many clients the vectorized executor stacks in one model: its memory budget.

A stacked model of K clients holds, for each client, its parameters and buffers, their
gradients, the optimiser's momentum and one more copy (the state it was loaded from or is
written back to): about :data:`COPIES_PER_CLIENT` × the model's bytes, and a client optimizer's
own copies on top (``ClientOptimizer.stacked_copies``: FedProx and SCAFFOLD 1, MOON 2). The
executor therefore trains at most ``budget // ((4 + extra) × model bytes)`` clients together (and
at most ``max_parallel_clients``), in chunks of that size. Activations and workspace are not counted:
they are what the memory outside the budget is for.

The budget is the config field ``stack_memory_gib`` (GiB, 2**30 bytes). Left at ``None`` it is

- on a CUDA device, :data:`CUDA_FREE_FRACTION` (half) of the device's free memory
  (``torch.cuda.mem_get_info``) when the run builds its executor, after its model and data are
  on the device; the other half is left for activations, cuDNN's workspace and evaluation;
- anywhere else :data:`DEFAULT_BUDGET`, 2 GiB, fednorm's fixed budget before the field existed
  (ResNet-18: 11 clients; FedBN's AlexNet-BN, 57M parameters: 2; torchvision's VGG-19: 1).

The budget changes only how many clients share a stacked model, so results agree to float
rounding whatever it is. A lockstep method (FedTAN) is the exception that makes it matter: all
clients of a round must fit in one stacked model, or the run stops at its first round with an
error naming ``stack_memory_gib`` and the value that would fit them (:func:`lockstep_overflow`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["GIB", "DEFAULT_BUDGET", "CUDA_FREE_FRACTION", "COPIES_PER_CLIENT", "model_bytes", "client_bytes",
           "stack_budget", "clients_that_fit", "gib_needed", "lockstep_overflow"]

GIB = 1 << 30
#: The budget where no CUDA device says how much is free (fednorm's fixed budget before issue 48).
DEFAULT_BUDGET = 2 * GIB
#: The share of a CUDA device's free memory the stacked model may take by default.
CUDA_FREE_FRACTION = 0.5
#: Copies of a client's model a stacked model holds: parameters, gradients, momentum, one more.
COPIES_PER_CLIENT = 4


def model_bytes(model: nn.Module) -> int:
    """Bytes of ``model``'s state dict (parameters and buffers, in their dtype)."""
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def client_bytes(model: nn.Module, extra_copies: int = 0) -> int:
    """What one client costs a stacked model of ``model`` (at least 1), with ``extra_copies`` more
    copies of its state held per client (a client optimizer's)."""
    return max(1, (COPIES_PER_CLIENT + extra_copies) * model_bytes(model))


def stack_budget(gib: float | None, device: torch.device | str) -> int:
    """The budget in bytes: ``gib`` GiB when set, else the default for ``device`` (module docstring)."""
    if gib is not None:
        return int(gib * GIB)
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * CUDA_FREE_FRACTION)
    return DEFAULT_BUDGET


def clients_that_fit(model: nn.Module, budget: int, extra_copies: int = 0) -> int:
    """How many clients of ``model`` a stacked model within ``budget`` bytes holds (at least 1)."""
    return max(1, budget // client_bytes(model, extra_copies))


def gib_needed(clients: int, per_client: int) -> float:
    """GiB that hold ``clients`` of ``per_client`` bytes, rounded up at the third significant digit
    (so the value as written still fits them)."""
    need = clients * per_client / GIB
    scale = 10.0 ** (math.floor(math.log10(need)) - 2)
    return math.ceil(need / scale) * scale


def lockstep_overflow(method: str, clients: int, max_parallel: int, budget: int, per_client: int,
                      copies: int = COPIES_PER_CLIENT) -> str:
    """The error for a lockstep method whose ``clients`` do not fit in one stacked model: which
    limit holds them back (``max_parallel_clients``, ``stack_memory_gib``) and what would do
    (``copies``: the model copies ``per_client`` counts)."""
    fit = min(max_parallel, max(1, budget // per_client))
    why = []
    if max_parallel < clients:
        why.append(f"max_parallel_clients is {max_parallel}; set it to at least {clients}")
    if budget // per_client < clients:
        why.append(f"the stacked model's memory budget (stack_memory_gib) is {budget / GIB:.3g} GiB and one client takes "
                   f"{per_client / GIB:.3g} GiB ({copies} × the model's bytes); set stack_memory_gib to at least "
                   f"{gib_needed(clients, per_client):.3g} on a device with that much memory to spare")
    return (f"method '{method}' synchronises all {clients} clients of a round in one stacked model, but at most {fit} fit: "
            + "; ".join(why))
