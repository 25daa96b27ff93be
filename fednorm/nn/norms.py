"""The norm registry: build any normalization layer as ``norm_layer(C)``, by name or by class.

Every norm in fednorm is built by a *norm builder* with one signature,
``builder(num_features, *, spatial=True, **kwargs) -> nn.Module``: the channel count comes
first, as in timm's ``create_norm``, so swapping BN for GN or HBN never changes a model's code,
and ``spatial=False`` asks for the variant that normalizes ``(N, C)`` features produced by a
``nn.Linear`` (``BatchNorm1d`` instead of ``BatchNorm2d``). Builders live in :data:`NORMS`;
:func:`get_norm_layer` resolves a string, class, ``functools.partial`` or callable into such a
builder, :func:`norm_modules` finds normalization layers by module type (never by name), and
:func:`convert_norm` replaces every BatchNorm of a trained or built model, in the manner of
``torch.nn.SyncBatchNorm.convert_sync_batchnorm``. Later modules register further norms
(``hbn``, ``fbn``, ...) with :func:`register_norm`.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Union

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

from ..registry import Registry

__all__ = [
    "NORMS",
    "NORM_TYPES",
    "NormLayer",
    "NormSpec",
    "register_norm",
    "list_norms",
    "get_norm_layer",
    "create_batch_norm",
    "create_group_norm",
    "create_layer_norm",
    "create_identity",
    "is_batch_norm",
    "norm_modules",
    "convert_norm",
]

#: A norm builder: ``norm_layer(num_features, *, spatial=True) -> nn.Module``.
NormLayer = Callable[..., nn.Module]

#: Anything :func:`get_norm_layer` accepts.
NormSpec = Union[str, type, functools.partial, Callable[..., nn.Module], None]

#: Module types counted as normalization layers by :func:`norm_modules`. HBN/FBN layers
#: subclass ``_BatchNorm`` (STYLE.md "Layers"), so they are covered without being listed.
NORM_TYPES: tuple[type[nn.Module], ...] = (_BatchNorm, nn.GroupNorm, nn.LayerNorm, _InstanceNorm)

NORMS: Registry[NormLayer] = Registry("norm")
register_norm = NORMS.register


def list_norms(include: Any = None, exclude: Any = None) -> list[str]:
    """Sorted names of the registered norms, optionally filtered by fnmatch patterns.

    Examples:
        >>> list_norms()[:4]  # doctest: +SKIP
        ['bn', 'gn', 'ln', 'none']
    """
    return NORMS.list(include, exclude)


# --------------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------------


@register_norm("bn")
def create_batch_norm(
    num_features: int,
    *,
    spatial: bool = True,
    eps: float = 1e-5,
    momentum: float | None = 0.1,
    affine: bool = True,
    track_running_stats: bool = True,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """Plain BatchNorm, the FedAvg+BN baseline of every paper (e.g. Chen et al., 2025, Sec. 4.1;
    Li et al., 2021, Sec. 5).

    Args:
        num_features: number of channels C.
        spatial: ``True`` gives ``nn.BatchNorm2d`` for ``(N, C, H, W)`` inputs, ``False`` gives
            ``nn.BatchNorm1d`` for ``(N, C)`` features (FedBN's FC layers, FedTAN's MNIST MLP).
        eps, momentum, affine, track_running_stats, device, dtype: as in ``torch.nn.BatchNorm2d``
            (default: torch's, ``eps=1e-5``, ``momentum=0.1``).

    Returns:
        ``nn.BatchNorm2d`` or ``nn.BatchNorm1d``. Training mode normalizes with the biased batch
        variance; the running variance is updated with the unbiased one (torch semantics).
    """
    cls = nn.BatchNorm2d if spatial else nn.BatchNorm1d
    return cls(
        num_features,
        eps=eps,
        momentum=momentum,
        affine=affine,
        track_running_stats=track_running_stats,
        device=device,
        dtype=dtype,
    )


@register_norm("gn")
def create_group_norm(
    num_features: int,
    *,
    spatial: bool = True,
    num_groups: int = 2,
    eps: float = 1e-5,
    affine: bool = True,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """GroupNorm with the channel count first (timm's order).

    The default ``num_groups=2`` is the LN paper's FedGN (Zhang et al., 2024, Sec. 5.3) and the
    HBN authors' released code's GN; the FedTAN paper does not state its ResNet-20-GN's group
    count (Wang et al., 2023, Sec. 6.5). GroupNorm uses per-sample statistics in both training and
    evaluation modes and keeps no running statistics.

    Args:
        num_features: number of channels C; must be divisible by ``num_groups``.
        spatial: ignored for the layer type: ``nn.GroupNorm`` accepts ``(N, C, *)``, so on
            ``(N, C)`` features it normalizes each group of ``C / num_groups`` features.
        num_groups: number of groups G (default: 2).
        eps, affine, device, dtype: as in ``torch.nn.GroupNorm`` (per-channel affine).

    Raises:
        ValueError: if ``num_features`` is not divisible by ``num_groups``.
    """
    del spatial  # GroupNorm is rank-agnostic
    if not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(f"gn: num_groups must be a positive integer, got {num_groups!r}")
    if num_features % num_groups != 0:
        divisors = [g for g in range(1, min(num_features, 64) + 1) if num_features % g == 0]
        raise ValueError(
            f"gn: num_features (C={num_features}) must be divisible by num_groups "
            f"(G={num_groups}); GroupNorm splits the C channels into G equal groups. "
            f"Pass norm_args={{'num_groups': G}} with G in {divisors}."
        )
    return nn.GroupNorm(num_groups, num_features, eps=eps, affine=affine, device=device, dtype=dtype)


@register_norm("ln")
def create_layer_norm(
    num_features: int,
    *,
    spatial: bool = True,
    eps: float = 1e-5,
    affine: bool = True,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """Layer norm as the papers use it: ``nn.GroupNorm(1, C)``.

    On a conv map this normalizes each sample over all of C×H×W (HBN's "LN" and the LN
    paper's FedLN on conv maps, as the authors' released code builds them); on ``(N, C)`` features it is
    ``nn.LayerNorm(C)``'s normalization. The affine transform is per channel (GroupNorm's), not
    per element as ``nn.LayerNorm((C, H, W))`` would be, so the layer is independent of the input
    size. ``affine=False`` gives the LN paper's "FedLN – static".

    Args:
        num_features: number of channels C.
        spatial: ignored for the layer type (GroupNorm accepts ``(N, C, *)``).
        eps, affine, device, dtype: as in ``torch.nn.GroupNorm``.
    """
    del spatial
    return nn.GroupNorm(1, num_features, eps=eps, affine=affine, device=device, dtype=dtype)


@register_norm("none")
def create_identity(num_features: int, *, spatial: bool = True) -> nn.Module:
    """No normalization: ``nn.Identity`` (the "vanilla" networks of Zhang et al., 2024, App. C.1).

    Args:
        num_features: ignored, accepted so that every norm is ``norm_layer(C)``.
        spatial: ignored.
    """
    del num_features, spatial
    return nn.Identity()


# --------------------------------------------------------------------------------------------
# Resolution of user-given norm specifications
# --------------------------------------------------------------------------------------------

# torch's dimension-specific BatchNorm classes and their (spatial, flat) siblings.
_BN_SIBLINGS: tuple[type[nn.Module], type[nn.Module]] = (nn.BatchNorm2d, nn.BatchNorm1d)
_BN_CLASSES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_IN_CLASSES = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)


def _accepts_spatial(fn: Callable[..., Any]) -> bool:
    """Whether ``fn``'s signature names a ``spatial`` parameter (``**kwargs`` does not count)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False
    param = params.get("spatial")
    return param is not None and param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD)


def _build_from_class(cls: type[nn.Module], num_features: int, *, spatial: bool = True, **kwargs: Any) -> nn.Module:
    """Build a torch (or user) module class as a norm builder; see :func:`get_norm_layer`."""
    if issubclass(cls, nn.modules.lazy.LazyModuleMixin):
        raise TypeError(
            f"{cls.__name__} is lazy and takes no num_features; pass its non-lazy class "
            f"(fednorm models compute every size from input_size)"
        )
    if cls in _BN_CLASSES:
        return _BN_SIBLINGS[0 if spatial else 1](num_features, **kwargs)
    if cls in _IN_CLASSES:
        if not spatial:
            raise ValueError(
                f"{cls.__name__} cannot normalize (N, C) features from a Linear layer: each sample "
                f"has one value per channel. Use another norm (e.g. 'ln') for the fully connected layers."
            )
        return nn.InstanceNorm2d(num_features, **kwargs)
    if cls is nn.GroupNorm:
        # torch's order is (num_groups, num_channels); the norm-builder contract is C first.
        return create_group_norm(num_features, spatial=spatial, **kwargs)
    if cls is nn.LayerNorm:
        if spatial:
            raise ValueError(
                "nn.LayerNorm(C) on an (N, C, H, W) map would normalize over the last (W) axis, "
                "not over channels. Use norm='ln' (GroupNorm(1, C): normalizes over C×H×W, as "
                "the papers do)."
            )
        return nn.LayerNorm(num_features, **kwargs)
    if _accepts_spatial(cls):
        return cls(num_features, spatial=spatial, **kwargs)
    return cls(num_features, **kwargs)


def _build_from_callable(fn: Callable[..., nn.Module], num_features: int, *, spatial: bool = True, **kwargs: Any) -> nn.Module:
    """Call a user callable as a norm builder, passing ``spatial`` only if it names it."""
    if _accepts_spatial(fn):
        return fn(num_features, spatial=spatial, **kwargs)
    return fn(num_features, **kwargs)


def get_norm_layer(norm: NormSpec, **kwargs: Any) -> NormLayer:
    """Resolve a norm specification into a builder called as ``norm_layer(C, spatial=...)``.

    This is timm's ``get_norm_layer`` with fednorm's builder contract (STYLE.md "Layers"):

    * a **string** is looked up in :data:`NORMS` (case-insensitive, ``-`` = ``_``) and ``kwargs``
      are bound with ``functools.partial``;
    * **None** means ``"none"`` (no normalization; unlike torchvision, where None means BN);
    * a **class** is wrapped. torch's dimension-specific classes follow ``spatial``:
      ``nn.BatchNorm1d/2d/3d`` give ``BatchNorm2d`` for maps and ``BatchNorm1d`` for ``(N, C)``;
      ``nn.InstanceNorm*d`` gives ``InstanceNorm2d`` and rejects ``spatial=False``.
      ``nn.GroupNorm`` is called channel-first (``num_groups`` from kwargs, default 2);
      ``nn.LayerNorm`` is accepted only for ``spatial=False`` (use ``"ln"`` for maps); lazy
      classes are rejected (they cannot take ``C``). Any other
      class receives ``spatial`` only if its ``__init__`` names it; otherwise ``spatial`` is
      ignored and the class must accept every input rank it is used with (rank-agnostic classes
      such as ``nn.SyncBatchNorm`` or ``nn.Identity``);
    * a **functools.partial** with keyword arguments only has them merged with ``kwargs`` and
      its function resolved as above (so ``partial(nn.BatchNorm2d, eps=1e-3)`` still follows
      ``spatial``); a partial with positional arguments, e.g. ``partial(nn.GroupNorm, 4)``, is
      called as is, ``p(C)``;
    * any other **callable** is called as ``f(C, spatial=spatial, **kwargs)`` if it names a
      ``spatial`` parameter, else as ``f(C, **kwargs)``. A builder returned by this function is a
      valid input, so resolution is idempotent.

    Args:
        norm: the specification.
        **kwargs: options bound into the builder (e.g. ``num_groups=4``, ``momentum=0.01``).

    Returns:
        A callable ``norm_layer(num_features, *, spatial=True) -> nn.Module``.

    Raises:
        UnknownNameError: for an unregistered name (the message suggests the closest one).
        TypeError: for anything that is neither a string, None, nor a callable.

    Examples:
        >>> get_norm_layer("gn", num_groups=4)(64).num_groups
        4
        >>> type(get_norm_layer(nn.BatchNorm2d)(30, spatial=False)).__name__
        'BatchNorm1d'
    """
    if norm is None:
        norm = "none"
    if isinstance(norm, str):
        builder = NORMS.get_builder(norm)
        return functools.partial(builder, **kwargs) if kwargs else builder
    if isinstance(norm, functools.partial) and not norm.args:
        return get_norm_layer(norm.func, **{**norm.keywords, **kwargs})
    if isinstance(norm, type):
        if not issubclass(norm, nn.Module):
            raise TypeError(f"norm class must be an nn.Module subclass, got {norm.__qualname__}")
        return functools.partial(_build_from_class, norm, **kwargs)
    if isinstance(norm, nn.Module):
        raise TypeError(
            f"norm must build a new layer per use; got the module instance {norm!r}. "
            f"Pass its class (e.g. {type(norm).__name__}) or a registered name instead."
        )
    if callable(norm):
        if _accepts_spatial(norm):  # already a norm builder
            return functools.partial(norm, **kwargs) if kwargs else norm
        return functools.partial(_build_from_callable, norm, **kwargs)
    raise TypeError(
        f"norm must be a registered name, None, an nn.Module class, a functools.partial or a "
        f"callable, got {type(norm).__name__} ({norm!r})"
    )


# --------------------------------------------------------------------------------------------
# Inspection and conversion
# --------------------------------------------------------------------------------------------


def is_batch_norm(module: nn.Module) -> bool:
    """Whether ``module`` is a BatchNorm (any ``nn.modules.batchnorm._BatchNorm`` subclass).

    This covers ``BatchNorm1d/2d/3d``, ``SyncBatchNorm`` and fednorm's HBN/FBN layers, which
    subclass ``_BatchNorm`` (STYLE.md "Layers"), but not GroupNorm, LayerNorm or InstanceNorm.
    """
    return isinstance(module, _BatchNorm)


def norm_modules(model: nn.Module, types: tuple[type[nn.Module], ...] = NORM_TYPES) -> list[tuple[str, nn.Module]]:
    """The normalization layers of ``model``, selected by module type, never by name.

    Args:
        model: the model to scan (the root itself is included if it is a norm).
        types: module types to select (default: ``NORM_TYPES``: BatchNorm incl. subclasses,
            GroupNorm, LayerNorm, InstanceNorm).

    Returns:
        ``(qualified_name, module)`` pairs in ``named_modules`` order (the root is named ``""``).
    """
    return [(name, m) for name, m in model.named_modules() if isinstance(m, types)]


def _reference_tensor(module: nn.Module) -> torch.Tensor | None:
    for tensor in list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)):
        if tensor.is_floating_point():
            return tensor
    return None


def _copy_state(old: _BatchNorm, new: nn.Module) -> None:
    """Copy affine parameters and running statistics where ``new`` has matching slots."""
    with torch.no_grad():
        for name in ("weight", "bias"):
            src = getattr(old, name, None)
            dst = getattr(new, name, None)
            if isinstance(src, torch.Tensor) and isinstance(dst, nn.Parameter) and dst.shape == src.shape:
                dst.copy_(src)
                dst.requires_grad_(src.requires_grad)
        if isinstance(new, _BatchNorm):
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                src = getattr(old, name, None)
                dst = getattr(new, name, None)
                if isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor) and dst.shape == src.shape:
                    dst.copy_(src)


def _convert(module: nn.Module, norm_layer: NormLayer) -> nn.Module:
    if isinstance(module, _BatchNorm):
        # BatchNorm1d normalizes (N, C) or (N, C, L) features; 2d/3d/Sync are spatial.
        spatial = not isinstance(module, nn.BatchNorm1d)
        new = norm_layer(module.num_features, spatial=spatial)
        ref = _reference_tensor(module)
        if ref is not None:
            new = new.to(device=ref.device, dtype=ref.dtype)
        _copy_state(module, new)
        new.train(module.training)
        return new
    for name, child in module.named_children():
        converted = _convert(child, norm_layer)
        if converted is not child:
            module.add_module(name, converted)
    return module


def convert_norm(module: nn.Module, to: NormSpec, **norm_kwargs: Any) -> nn.Module:
    """Replace every BatchNorm in ``module`` by the norm ``to``; mutates ``module`` in place.

    Follows ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``: recurse over ``named_children``,
    match with ``isinstance(_BatchNorm)`` (so ``BatchNorm1d/2d/3d``, ``SyncBatchNorm`` and
    subclasses), build the new layer from the old ``num_features`` (``spatial=False`` for
    ``BatchNorm1d``), move it to the old layer's device and dtype, copy ``weight``/``bias`` under
    ``no_grad`` when the new layer has affine parameters of the same shape (and keep their
    ``requires_grad``), copy ``running_mean``/``running_var``/``num_batches_tracked`` when the new
    layer is itself a BatchNorm, and carry the ``training`` flag. Non-BN norms are left alone.

    Like torch (and unlike Opacus, which clones first), the conversion is **in place**: the
    children of ``module`` are replaced, and the same object is returned — except when the root
    itself is a BatchNorm, in which case the new layer is returned and must be used instead.
    Optimizers built before the call hold the old parameters and must be rebuilt.

    Args:
        module: a model or a single BatchNorm layer.
        to: any norm specification accepted by :func:`get_norm_layer`, e.g. ``"gn"``.
        **norm_kwargs: bound into the new norm (e.g. ``num_groups=4``). The defaults are the
            registry's (``"gn"``: 2 groups, the papers' value) rather than GN's ``gcd(32, C)``.

    Returns:
        ``module`` (converted) or, if ``module`` is a BatchNorm, its replacement.

    Examples:
        >>> model = convert_norm(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)), "gn")
        >>> type(model[1]).__name__, model[1].num_groups
        ('GroupNorm', 2)
    """
    return _convert(module, get_norm_layer(to, **norm_kwargs))
