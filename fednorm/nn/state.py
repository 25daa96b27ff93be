"""Select a model's tensors by the type of the module that owns them, never by key substring.

FedBN's code keeps a tensor local when ``'bn'`` appears in its state-dict key, which breaks on
any model whose layers are named differently; fednorm asks the module instead.
"""

from __future__ import annotations

from typing import Callable, Iterable, Literal

import torch
from torch import nn

__all__ = ["state_keys", "batch_norm_keys", "floating_keys"]

Which = Literal["all", "parameters", "buffers"]


def state_keys(
    model: nn.Module,
    predicate: Callable[[nn.Module], bool],
    *,
    which: Which = "all",
    names: Iterable[str] | None = None,
) -> set[str]:
    """State-dict keys of the tensors directly owned by modules for which ``predicate`` holds.

    Args:
        model: the model whose ``state_dict`` keys are returned.
        predicate: selects modules, e.g. ``lambda m: isinstance(m, _BatchNorm)``.
        which: ``"parameters"``, ``"buffers"`` or ``"all"``.
        names: if given, only tensors with these local names (e.g. ``("weight", "bias")``).
    """
    wanted = None if names is None else set(names)
    keys: set[str] = set()
    for mod_name, module in model.named_modules():
        if not predicate(module):
            continue
        prefix = f"{mod_name}." if mod_name else ""
        tensors: list[tuple[str, torch.Tensor | None]] = []
        if which in ("all", "parameters"):
            tensors += list(module._parameters.items())
        if which in ("all", "buffers"):
            tensors += [(n, b) for n, b in module._buffers.items() if n not in module._non_persistent_buffers_set]
        for name, tensor in tensors:
            if tensor is None or (wanted is not None and name not in wanted):
                continue
            keys.add(prefix + name)
    return keys


def batch_norm_keys(model: nn.Module, *, which: Which = "all") -> set[str]:
    """Keys of every tensor owned by a ``_BatchNorm`` subclass (affine, statistics, counter)."""
    return state_keys(model, lambda m: isinstance(m, nn.modules.batchnorm._BatchNorm), which=which)


def floating_keys(state: dict[str, torch.Tensor]) -> set[str]:
    """The keys of ``state`` whose tensors are floating point (``num_batches_tracked`` is not)."""
    return {k for k, v in state.items() if v.is_floating_point()}
