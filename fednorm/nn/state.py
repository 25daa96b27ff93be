"""Select a model's tensors by the type of the module that owns them, never by key substring.

FedBN's code keeps a tensor local when ``'bn'`` appears in its state-dict key, which breaks on
any model whose layers are named differently; fednorm asks the module instead.
"""

from __future__ import annotations

from typing import Callable, Iterable, Literal

import torch
from torch import nn

__all__ = ["state_keys", "batch_norm_keys", "floating_keys", "classifier_head"]

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


def classifier_head(model: nn.Module, name: str | None = None) -> nn.Linear:
    """The model's classifier: the ``nn.Linear`` that maps the penultimate features to the logits.

    Methods and analyses that treat the classifier apart (a personal head, FedPer; the features it
    reads, the LN paper's analyses) find it here rather than assume an attribute: fednorm's own
    models name it ``head``, a user's model may call it ``fc`` or ``classifier[-1]``.

    Args:
        model: the model.
        name: the head's module name in ``model.named_modules()`` (e.g. ``"fc"``,
            ``"classifier.3"``). Default: ``model.head`` where that is an ``nn.Linear``, else the
            last ``nn.Linear`` the model registers (a ``Sequential``'s last layer; a custom
            module's last ``Linear`` attribute, which is its classifier when it is defined last).

    Returns:
        The head module itself (not a copy), so ``state_keys(model, lambda m: m is head)``
        selects its tensors.

    Raises:
        ValueError: ``name`` names no ``nn.Linear`` of the model, or the model has no ``nn.Linear``
            at all (pass ``name``, or give the model a linear classifier).

    Example:
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
        >>> classifier_head(net) is net[3]
        True
        >>> sorted(state_keys(net, lambda m: m is classifier_head(net)))
        ['3.bias', '3.weight']
    """
    modules = dict(model.named_modules())
    if name is not None:
        found = modules.get(name)
        if not isinstance(found, nn.Linear):
            linears = [n for n, m in modules.items() if isinstance(m, nn.Linear)]
            what = "no module" if found is None else f"a {type(found).__name__}, not an nn.Linear"
            raise ValueError(f"head '{name}' is {what} of {type(model).__name__}; its nn.Linear layers are "
                             f"{linears or 'none'}")
        return found
    head = getattr(model, "head", None)
    if isinstance(head, nn.Linear):
        return head
    linears = [m for m in modules.values() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(f"{type(model).__name__} has no nn.Linear layer to serve as its classifier head: name the "
                         "head's module (head='...') or end the model in an nn.Linear")
    return linears[-1]
