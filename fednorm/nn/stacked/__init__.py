"""Stacked models: K clients' copies of a network held inside its layers.

At the papers' small batch sizes (HBN: 4) per-step framework overhead, not arithmetic, bounds
training speed, so running clients one after another wastes most of the machine. A stacked
model keeps every activation in a *client-concatenated channel* layout ``[B, K·C, ...]``
(client k owns channels ``k·C .. (k+1)·C − 1``) and every parameter as ``[K, *shape]``:

- ``Conv2d`` becomes one grouped convolution (``groups = K·g``), each client its own filters;
- ``BatchNorm`` over ``K·C`` channels computes exactly each client's per-channel batch
  statistics, and its running statistics are ``[K, C]`` buffers;
- ``GroupNorm(G, C)`` becomes ``GroupNorm(K·G, K·C)``, whose groups never straddle clients;
- ``Linear`` is one batched matrix product over ``[K, B, in]``;
- element-wise ops, pooling and ``Flatten`` need no change, because flattening
  ``[B, K·C, H, W]`` gives client-major ``[B, K·C·H·W]``.

The stacked model's ``state_dict`` has the base model's keys with a leading client axis, which
is exactly the ``[K, ...]`` layout methods aggregate over. ``K`` is read from the parameters at
call time, so a stacked model also runs any subset of its clients through
``torch.func.functional_call``. Cross-client statistics (FedTAN, FBN) are reductions of the
``[K, C]`` view over the client axis.

A model whose forward code reshapes across channels in a way this layout does not follow would
silently compute something else, so :func:`stack_model` verifies the stacked forward against
the base model client by client before it is used, and refuses otherwise.

The modules: :mod:`~fednorm.nn.stacked.layout` (the client layout), :mod:`~fednorm.nn.stacked.layers`
(conv, linear, shortcut), :mod:`~fednorm.nn.stacked.norms` (BatchNorm with FedTAN's synchronised
step, GroupNorm, FN, and the switches the engine sets), :mod:`~fednorm.nn.stacked.fbn`,
:mod:`~fednorm.nn.stacked.hbn` (with HBN's statistics pass) and :mod:`~fednorm.nn.stacked.convert`
(:func:`stack_model`).
"""

from __future__ import annotations

from .convert import stack_model
from .fbn import StackedFederatedBatchNorm, attach_stacked_fbn_recorders, detach_stacked_fbn_recorders
from .hbn import StackedHybridBatchNorm, collect_stacked_hbn_statistics
from .layers import ClientPadShortcut, StackedConv2d, StackedLinear, StackedScaledStdConv2d, StackedStdConv2d
from .layout import NotStackableError, from_client_layout, to_client_layout
from .norms import (
    ClientFeatureNorm,  # noqa: F401  (public, though not in __all__: kept importable from here)
    StackedBatchNorm,
    StackedGroupNorm,
    forward_clients,
    set_client_comm,
    set_forward_clients,
    set_frozen_statistics,
    set_row_mask,
)

__all__ = [
    "NotStackableError",
    "StackedConv2d",
    "StackedStdConv2d",
    "StackedScaledStdConv2d",
    "StackedLinear",
    "StackedBatchNorm",
    "StackedFederatedBatchNorm",
    "StackedHybridBatchNorm",
    "StackedGroupNorm",
    "ClientPadShortcut",
    "stack_model",
    "set_client_comm",
    "set_row_mask",
    "set_frozen_statistics",
    "set_forward_clients",
    "forward_clients",
    "attach_stacked_fbn_recorders",
    "collect_stacked_hbn_statistics",
    "detach_stacked_fbn_recorders",
    "to_client_layout",
    "from_client_layout",
]
