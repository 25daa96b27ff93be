"""A user's own ``nn.Module`` as a fednorm model: ``fednorm.run(model=net, data=data, method="fedbn")``.

A module object cannot live in a config (a run must be described by its ``config.yaml``), so a
run records it as ``model: user:NAME`` with :meth:`UserModel.describe` in ``model_args`` (its
class, parameter count and a fingerprint of its structure), as data given from Python is recorded
(:mod:`fednorm.data.provenance`). The ``user`` prefix of the model registry resolves to a builder
that takes the module from :func:`using_model`, the context :func:`fednorm.run` sets while it
builds the simulation; with none set (``fednorm run --resume``, ``fednorm evaluate``) it refuses
with the way to pass the model from Python.

The builder never touches the user's module: it deep-copies an instance (the run starts from its
weights) or calls a factory (a class or zero-argument function, called under the run's seeded
initialisation, so each seed starts from its own weights). The copy's BatchNorm layers are
converted to the config's ``norm`` as ``--norm`` converts a registry model's: ``bn`` keeps them
as they are, ``hbn``/``fbn``/``gn``/... replace each one, keeping its ``eps`` and ``affine``.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import hashlib
import inspect
from typing import Any, Callable, Iterator, Union

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import ConfigError
from ..nn.norms import convert_norm, create_batch_norm

__all__ = ["USER_PREFIX", "UserModel", "ModelSource", "is_user_model", "user_model_error", "using_model", "method_norm"]

USER_PREFIX = "user"

#: What ``fednorm.run(model=...)`` accepts besides a registry name.
ModelSource = Union[nn.Module, Callable[[], nn.Module]]

#: The norm a method needs when the user's model comes with plain BatchNorm (``norm`` left at
#: ``bn``): HBN and FBN train only their own layers, converted from the model's BatchNorm.
_METHOD_NORMS = {"hbn": "hbn", "fbn": "fbn"}


def method_norm(method: str, norm: str) -> str:
    """The norm a user's model runs with: ``norm``, or the method's own where ``norm`` is the
    default ``bn`` and the method cannot train plain BatchNorm (``hbn``, ``fbn``)."""
    return _METHOD_NORMS.get(method.split(".", 1)[0], norm) if norm == "bn" else norm


def is_user_model(name: str) -> bool:
    return isinstance(name, str) and name.split(":", 1)[0].strip().lower() == USER_PREFIX and ":" in name


def user_model_error(name: str, run_dir: str | None = None) -> ConfigError:
    """The refusal to rebuild ``user:NAME`` from a config."""
    where = run_dir or "RUN_DIR"
    return ConfigError(f"model '{name}' is an nn.Module given from Python, which no command can rebuild from the config: "
                       f"work with this run from Python, giving the same model (to resume: fednorm.run(resume='{where}', model=...))")


def _structure(module: nn.Module) -> str:
    """A fingerprint of the architecture: module class names and state shapes and dtypes, not
    values (trained weights differ from the initial ones, the architecture a resume needs does
    not), nor the modules defining the classes (a notebook's class may move into a package)."""
    h = hashlib.blake2b(digest_size=16)
    for name, m in module.named_modules():
        h.update(f"{name}:{type(m).__qualname__};".encode())
    for key, t in module.state_dict().items():
        h.update(f"{key}:{tuple(t.shape)}:{t.dtype};".encode())
    return "blake2b:" + h.hexdigest()


class UserModel:
    """A user's module or module factory, checked once, with what a run records about it.

    Args:
        source: an ``nn.Module`` (deep-copied for each run: the run starts from its weights) or a
            zero-argument callable returning one (a class or a lambda, called per run under the
            run's seeded initialisation).

    Raises:
        ConfigError: for anything else, a wrapped module (DataParallel) or a lazy module, one line.
    """

    def __init__(self, source: ModelSource) -> None:
        if isinstance(source, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            raise ConfigError(f"model: pass the module inside the {type(source).__name__} wrapper (model=net.module); "
                              "fednorm places the clients itself")
        if not isinstance(source, nn.Module) and not callable(source):
            raise ConfigError(f"model must be a registry name, an nn.Module or a function returning one; got a "
                              f"{type(source).__name__} object")
        self.source = source
        if self.is_factory:
            with torch.random.fork_rng(devices=[]):  # the factory's draws here must not move the user's RNG stream
                example = self.instance()
        else:
            example = _check_lazy(source)
        self.name = type(example).__name__
        self.qualname = f"{type(example).__module__}.{type(example).__qualname__}"
        self.structure = _structure(example)
        self.parameters = sum(p.numel() for p in example.parameters())

    @property
    def is_factory(self) -> bool:
        return not isinstance(self.source, nn.Module)

    def instance(self) -> nn.Module:
        """A new module: a deep copy of the instance, or the factory's result."""
        if isinstance(self.source, nn.Module):
            module = copy.deepcopy(self.source)
        else:
            module = self.source()
            if not isinstance(module, nn.Module):
                raise ConfigError(f"model: the factory {getattr(self.source, '__name__', self.source)!r} returned a "
                                  f"{type(module).__name__}, not an nn.Module; pass a class or a function that builds one")
        return _check_lazy(module)

    def describe(self) -> dict[str, Any]:
        """What a run records in ``model_args``: enough to recognise the architecture again."""
        return {"class": self.qualname, "given": "factory" if self.is_factory else "instance",
                "parameters": int(self.parameters), "structure": self.structure}

    def tag(self) -> str:
        return f"{USER_PREFIX}:{self.name.replace(':', '_')}"

    def check_same(self, recorded: dict[str, Any], run_dir: str, verb: str = "resume") -> None:
        """Refuse a model whose architecture is not the one the run at ``run_dir`` recorded
        (``verb``: what the caller does with the run, for the message)."""
        if recorded.get("structure") != self.structure:
            raise ConfigError(f"cannot {verb} {run_dir}: the model given ({self.qualname}, {self.parameters:,} parameters) "
                              f"is not the architecture it trained ({recorded.get('class')}, "
                              f"{int(recorded.get('parameters') or 0):,} parameters)")

    def build(self, norm_layer: Callable[..., nn.Module], method: str, norm: str, *, keeps_bn_special: bool) -> nn.Module:
        """A new module with its BatchNorm layers converted to ``norm_layer``, checked for layers
        ``method`` cannot handle.

        Args:
            keeps_bn_special: whether the method treats BatchNorm differently from other state
                (keeps it local, freezes or synchronises it): then a norm layer that keeps running
                statistics without being a BatchNorm would be mishandled silently, so it is refused.
        """
        module = self.instance()
        bns = [(n, m) for n, m in module.named_modules() if isinstance(m, _BatchNorm)]
        if keeps_bn_special:
            for n, m in module.named_modules():
                if not isinstance(m, _BatchNorm) and any("running" in b for b, _ in m.named_buffers(recurse=False)):
                    raise ConfigError(
                        f"model: layer '{n}' ({type(m).__name__}) keeps running statistics but is not a BatchNorm, so method "
                        f"'{method}' cannot tell them from weights: subclass nn.BatchNorm2d (or _BatchNorm) for it")
        if norm in _METHOD_NORMS.values() and not bns:
            raise ConfigError(f"model: method '{method}' trains its {norm.upper()} layers, converted from the model's "
                              f"BatchNorm, and {self.name} has none: add nn.BatchNorm2d/BatchNorm1d where it should normalize")
        if _keeps_batch_norm(norm_layer):
            return module
        untracked = [n for n, m in bns if not m.track_running_stats]
        if untracked and norm in _METHOD_NORMS.values():
            import warnings

            warnings.warn(f"model: {len(untracked)} BatchNorm layer(s) ('{untracked[0]}'{', ...' if len(untracked) > 1 else ''}) "
                          f"have track_running_stats=False, but method '{method}' keeps global statistics in its {norm.upper()} "
                          "layers (they start at mean 0, variance 1): the converted layers track them", stacklevel=2)
        for n, m in bns:
            if isinstance(m, nn.BatchNorm3d):
                raise ConfigError(f"model: layer '{n}' (BatchNorm3d) has no '{norm}' version (fednorm's norms take 2-D to 4-D "
                                  "inputs); keep norm 'bn' or use BatchNorm2d/1d")
            try:
                new = convert_norm(m, _carrying(norm_layer, m))
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"model: layer '{n}' ({type(m).__name__}) cannot become norm '{norm}': {exc}") from None
            if n:
                parent, _, child = n.rpartition(".")
                module.get_submodule(parent).add_module(child, new)
            else:
                module = new
        return module


def _check_lazy(module: nn.Module) -> nn.Module:
    """``module``, unless a lazy layer of it has no weights yet (they take their shapes from the
    first batch, which a federation's clients would each see differently)."""
    lazy = next(((n, m) for n, m in module.named_modules() if isinstance(m, nn.modules.lazy.LazyModuleMixin)
                 and m.has_uninitialized_params()), None)  # type: ignore[operator]
    if lazy is not None:
        raise ConfigError(f"model: layer '{lazy[0]}' ({type(lazy[1]).__name__}) has no weights yet; run one batch "
                          "through the model before passing it, or use the non-lazy layer")
    return module


def _keeps_batch_norm(norm_layer: Callable[..., nn.Module]) -> bool:
    """Whether ``norm_layer`` is plain ``bn`` with no options: then the user's layers stay as
    they are (their own eps, momentum, affine and statistics)."""
    return norm_layer is create_batch_norm


def _carrying(norm_layer: Callable[..., nn.Module], old: _BatchNorm) -> Callable[..., nn.Module]:
    """``norm_layer`` with the old layer's ``eps`` and ``affine``, where it takes them and the
    config's ``norm_args`` did not set them."""
    try:
        params = inspect.signature(norm_layer).parameters
    except (TypeError, ValueError):
        return norm_layer
    bound = getattr(norm_layer, "keywords", {}) or {}
    carry = {k: getattr(old, k) for k in ("eps", "affine") if k in params and k not in bound}
    return functools.partial(norm_layer, **carry) if carry else norm_layer


_ACTIVE: contextvars.ContextVar[tuple[UserModel, Any] | None] = contextvars.ContextVar("fednorm_user_model", default=None)


@contextlib.contextmanager
def using_model(model: UserModel | None, config: Any) -> Iterator[None]:
    """Make ``model`` the one ``user:NAME`` builds while a simulation of ``config`` is built
    (per thread: stacked runs build theirs side by side)."""
    token = _ACTIVE.set((model, config) if model is not None else None)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


class _UserModelBuilder:
    """The registry entry behind ``user:NAME``: the module of :func:`using_model`, converted."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *, num_classes: int, in_channels: int, input_size: Any, norm_layer: Callable[..., nn.Module],
                 **recorded: Any) -> nn.Module:
        active = _ACTIVE.get()
        if active is None:
            raise user_model_error(f"{USER_PREFIX}:{self.name}")
        model, config = active
        if recorded.get("structure") not in (None, model.structure):
            model.check_same(recorded, str(getattr(config, "out", None) or "the run"))
        return model.build(norm_layer, config.method, config.norm, keeps_bn_special=_keeps_bn_special(config))


def _keeps_bn_special(config: Any) -> bool:
    """Whether ``config``'s method handles BatchNorm state apart from the other state (every
    method but plain FedAvg with its default policy, which averages every buffer alike)."""
    return config.method != "fedavg" or config.buffers not in (None, "global") or config.affine not in (None, "global")


def _register() -> None:
    from .registry import MODELS

    MODELS.add_prefix(USER_PREFIX, _UserModelBuilder)  # so that a recorded run's config validates


_register()
