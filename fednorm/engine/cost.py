"""Which executor ``executor: auto`` picks on a CPU: the cost of one client's local step.

The vectorized executor wins where per-step framework overhead dominates (small models, small
batches: the HBN paper's B = 4), because it runs a round's clients as one grouped call. Where one
client's step is already a large computation, the grouped convolutions it uses are slower on CPU
than the same convolutions run client by client. Measured side by side with
``benchmarks/executors.py`` (CIFAR-10, one thread, 2026-11-25; vectorized / sequential samples/s):

======================  ===  ========================  =====================
model                    B   multiply-adds per step     vectorized / sequential
======================  ===  ========================  =====================
Simple-CNN               4   12 M                       2.90×
Simple-CNN              16   46 M                       1.94×
ResNet-20                4   164 M                      1.93×
ResNet-20               16   656 M                      1.21×
LN paper's CNN          32   470 M                      0.60×
FedBN paper's CNN       32   2.0 G                      0.84×
FBN paper's CNN         32   3.1 G                      0.71×
ResNet-20              128   5.2 G                      0.68×
======================  ===  ========================  =====================

So on a CPU ``auto`` runs clients one by one when the batch is above 16 and a step costs at least
:data:`SEQUENTIAL_MACS` multiply-adds; everywhere else, and on GPUs, it runs them stacked. The
choice depends only on the model, the input shape and the batch size, never on a timing, so the
same config picks the same executor on every machine (the two agree to float rounding).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SEQUENTIAL_BATCH", "SEQUENTIAL_MACS", "forward_macs", "prefers_sequential"]

#: Batch sizes above this may run sequentially (every measured B ≤ 16 favoured the stacked form).
SEQUENTIAL_BATCH = 16
#: Multiply-adds of one client's step (batch × per-sample forward) from which a CPU runs clients
#: one by one.
SEQUENTIAL_MACS = 100e6


@torch.no_grad()
def forward_macs(model: nn.Module, example: torch.Tensor) -> int:
    """Multiply-adds of one forward pass of ``model`` per sample of ``example``: convolutions and
    linear layers, the operations that dominate; norms, activations and pooling are left out."""
    total = 0

    def conv_hook(module: nn.Conv2d, args: tuple, out: torch.Tensor) -> None:
        nonlocal total
        k = module.kernel_size[0] * module.kernel_size[1] * (module.in_channels // module.groups)
        total += out[0].numel() * k

    def linear_hook(module: nn.Linear, args: tuple, out: torch.Tensor) -> None:
        nonlocal total
        total += module.in_features * module.out_features * (out[0].numel() // module.out_features)

    handles = []
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            handles.append(m.register_forward_hook(conv_hook))
        elif isinstance(m, nn.Linear):
            handles.append(m.register_forward_hook(linear_hook))
    training = model.training
    try:
        model.eval()
        model(example[:1])
    finally:
        model.train(training)
        for h in handles:
            h.remove()
    return total


def prefers_sequential(model: nn.Module, example: torch.Tensor, batch_size: int, device: torch.device) -> str | None:
    """Why ``auto`` should run this setting's clients one by one (``None``: stacked)."""
    if device.type != "cpu" or batch_size <= SEQUENTIAL_BATCH:
        return None
    try:
        step = forward_macs(model, example) * batch_size
    except (RuntimeError, ValueError):  # a model that cannot run this probe: keep the default
        return None
    if step < SEQUENTIAL_MACS:
        return None
    return (f"one client's step at batch {batch_size} is {step / 1e6:.0f}M multiply-adds, where a CPU runs clients faster "
            f"one by one than as grouped calls (fednorm/engine/cost.py)")
