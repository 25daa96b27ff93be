"""The model registry: ``get_model("resnet20", norm="gn", num_classes=10)``.

Builders are keyword-only functions registered with ``@register_model()`` (timm, torchvision
``_api.py``). They receive ``num_classes``, ``in_channels``, ``input_size`` and a ``norm_layer``
already resolved by :func:`fednorm.nn.norms.get_norm_layer`, plus their own options.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from torch import nn

from ..nn.norms import NormSpec, get_norm_layer
from ..registry import Registry

__all__ = ["MODELS", "register_model", "list_models", "get_model"]

MODELS: Registry[Callable[..., nn.Module]] = Registry("model")
register_model = MODELS.register


def list_models(include: Any = None, exclude: Any = None) -> list[str]:
    """Sorted names of the registered models, optionally filtered by fnmatch patterns."""
    return MODELS.list(include, exclude)


def get_model(
    name: str,
    *,
    num_classes: int = 10,
    in_channels: int = 3,
    input_size: int | Sequence[int] = 32,
    norm: NormSpec = "bn",
    norm_args: dict[str, Any] | None = None,
    feature_norm: bool = False,
    **kwargs: Any,
) -> nn.Module:
    """Build a registered model.

    Args:
        name: registered model name (see :func:`list_models`); case-insensitive.
        num_classes: number of logits (default: 10).
        in_channels: input channels (default: 3; 1 for grayscale digits).
        input_size: input height and width, an int or ``(H, W)`` (default: 32). Flatten sizes
            are computed from it.
        norm: any norm specification accepted by ``get_norm_layer`` (default: ``"bn"``);
            ``"none"`` or ``None`` builds the model without normalization layers.
        norm_args: options of the norm (e.g. ``{"num_groups": 4}``).
        feature_norm: wrap the model with the LN paper's feature normalization before the
            head (``sqrt(d) * z / ||z||``; :func:`fednorm.nn.feature_norm.with_feature_norm`).
            ``norm="fn"`` implies it (with no norm in the body); other LN-paper variants
            (``ln_before``, ``ln_reduced``, ``fn_inside_*``) set model options such as
            ``norm_position`` (see ``fednorm.nn.ln_variants``).
        **kwargs: model-specific options (``None`` values are dropped so that builder
            defaults apply).

    Returns:
        The model, a :class:`~fednorm.models.base.ClassifierModel`.

    Raises:
        UnknownNameError: for an unknown model or norm name, with a suggestion.
    """
    if "norm_layer" in kwargs:
        raise TypeError("get_model() takes norm=... and norm_args=...; do not pass norm_layer")
    norm_layer = get_norm_layer(norm, **(norm_args or {}))
    # Norm names that imply a placement (the LN paper's variants, fednorm/nn/ln_variants.py).
    from ..nn.ln_variants import norm_placement

    placement = norm_placement(norm_layer)
    fn_options = placement.pop("feature_norm", None)
    ws_options = placement.pop("weight_standardization", None)
    if placement:
        import inspect

        accepted = inspect.signature(MODELS.get_builder(name)).parameters
        for key, value in placement.items():
            if key not in accepted:
                raise ValueError(
                    f"norm {norm!r} needs a model with a '{key}' option (ln_cnn, resnet18, ln_resnet18); "
                    f"model {name!r} has none"
                )
            if kwargs.get(key) is not None and kwargs[key] != value:
                raise ValueError(f"norm {norm!r} sets {key}={value!r}, but model_args asks for {key}={kwargs[key]!r}")
            kwargs[key] = value
    model = MODELS.build(
        name,
        num_classes=num_classes,
        in_channels=in_channels,
        input_size=input_size,
        norm_layer=norm_layer,
        **kwargs,
    )
    if ws_options is not None:  # gn_ws: every Conv2d weight-standardized (fednorm/nn/weight_std.py)
        from ..nn.weight_std import convert_weight_standardization

        model = convert_weight_standardization(model, **ws_options)
    if feature_norm or fn_options is not None:
        from ..nn.feature_norm import with_feature_norm

        model = with_feature_norm(model, **(fn_options or {}))
    return model
