"""One line that says which network a run trains and how big it is, printed when a run starts.

The size follows the input (``image_size``, ``channels`` of the data), so a user who brings
64×64 images sees at once that the first linear layer of a digits CNN has grown.
"""

from __future__ import annotations

from typing import Any, Callable

from torch import nn

__all__ = ["count_parameters", "describe_model", "announcing"]


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """``(all, trainable)`` parameter counts (buffers such as BN statistics excluded)."""
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


def describe_model(model: nn.Module, name: str, norm: str, info: Any) -> str:
    """``"model fedbn_cnn+bn: 14,313,034 parameters, input 3×28×28, 10 classes"``."""
    total, trainable = count_parameters(model)
    frozen = f" ({trainable:,} trainable)" if trainable != total else ""
    h, w = info.image_size
    return f"model {name}+{norm}: {total:,} parameters{frozen}, input {info.in_channels}×{h}×{w}, {info.num_classes} classes"


def announcing(factory: Callable[..., Any]) -> Callable[..., Any]:
    """A simulation factory that prints :func:`describe_model` once the simulation is built."""

    def build(config: Any, *args: Any, **kwargs: Any) -> Any:
        sim = factory(config, *args, **kwargs)
        print(describe_model(sim.model, config.model, config.norm, sim.data.info), flush=True)
        return sim

    return build
