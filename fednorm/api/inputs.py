"""What a run is given: its config (an object, a mapping or a YAML file), its device, and a user's
own model or data, recorded in the config as ``user:NAME`` (:mod:`fednorm.data.provenance`,
:mod:`fednorm.models.user`) so a run never claims to have trained on something else."""

from __future__ import annotations

import os
from typing import Any, Mapping

import torch

from ..config import ExperimentConfig, load_config
from ..data.federated import FederatedData
from ..models.user import UserModel

__all__ = ["resolve_config", "check_device", "check_data_type", "split_model", "record_data", "check_data_fields", "record_model"]


def resolve_config(config: ExperimentConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None, **overrides: Any) -> ExperimentConfig:
    """A config from an object, a mapping or a YAML path (``str`` or any ``os.PathLike``), with
    keyword overrides applied."""
    if isinstance(config, ExperimentConfig):
        base = config.model_dump()
        base.update({k: v for k, v in overrides.items() if v is not None})
        return load_config(None, base)
    if isinstance(config, (str, os.PathLike)):
        return load_config(os.fspath(config), overrides)
    merged = dict(config or {})
    merged.update({k: v for k, v in overrides.items() if v is not None})
    return load_config(None, merged)


def check_device(device: str) -> None:
    """Raise :class:`ConfigError` unless tensors can be made on ``device`` with this torch build
    (``cuda`` on a CPU build, a GPU index that does not exist, ``mps`` off Apple silicon)."""
    from ..errors import ConfigError

    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(f"unknown device '{device}' ({exc})") from None
    if dev.type == "cuda":
        if torch.version.cuda is None and torch.version.hip is None:
            raise ConfigError(
                f"device '{device}': this torch build ({torch.__version__}) has no CUDA support; install a CUDA build "
                "of torch (https://pytorch.org/get-started/locally/) or use --device cpu"
            )
        count = torch.cuda.device_count()
        if count == 0:
            raise ConfigError(f"device '{device}': torch sees no CUDA GPU on this machine; use --device cpu")
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"device '{device}' does not exist: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
        return
    if dev.type == "cpu":
        return
    try:
        torch.empty(1, device=dev)
    except (RuntimeError, AssertionError, NotImplementedError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"device '{device}' is not usable with this torch build ({torch.__version__}): {first}") from None


def check_data_type(data: Any) -> None:
    from ..errors import ConfigError

    if data is not None and not isinstance(data, FederatedData):
        raise ConfigError(f"data must be a fednorm.FederatedData, got {type(data).__name__}; build one from your tensors "
                          "or datasets (FederatedData.from_tensors / from_datasets, docs/data.md) or leave data out to "
                          "build it from the config")


def split_model(config: Any, overrides: dict[str, Any], model: Any) -> tuple[Any, UserModel | None]:
    """``model=`` as a registry name (a config field) or a user's module (kept out of the config:
    :class:`~fednorm.models.user.UserModel`); a module inside a mapping config counts too."""
    if model is None and isinstance(config, Mapping) and "model" in config and not isinstance(config["model"], str):
        config = dict(config)
        model = config.pop("model")
    if model is None:
        return config, None
    if isinstance(model, str):
        overrides["model"] = model
        return config, None
    return config, model if isinstance(model, UserModel) else UserModel(model)


def record_data(cfg: ExperimentConfig, data: FederatedData) -> ExperimentConfig:
    """``cfg`` recording what ``data`` is: unchanged when ``data`` was built from ``cfg``'s data
    fields, else ``dataset``/``partition`` ``user:NAME`` with its description and fingerprint
    (:mod:`fednorm.data.provenance`), its client count and its own augmentation flag, so the run
    never claims to have trained on the config's dataset. The data fields that do not apply to
    such data are left at their defaults (:meth:`ExperimentConfig.recorded` leaves them out of
    ``config.yaml``); :func:`check_data_fields` refuses them set beside it."""
    from ..config_roles import USER_DATA_NOT_APPLICABLE
    from ..data.provenance import USER_PREFIX, data_name, data_recipe, describe_data

    if data.recipe is not None and data.recipe == data_recipe(cfg):
        return cfg
    tag = f"{USER_PREFIX}:{data_name(data)}"
    defaults = {k: ExperimentConfig.model_fields[k].get_default(call_default_factory=True) for k in USER_DATA_NOT_APPLICABLE}
    recorded = cfg.model_copy(update={**defaults, "dataset": tag, "partition": tag, "dataset_args": describe_data(data),
                                      "num_clients": data.num_clients, "augment": bool(data.augment)})
    return load_config(None, recorded.model_dump())  # validated: the name is spelled as config.yaml reads it back


def check_data_fields(cfg: ExperimentConfig, data: FederatedData) -> None:
    """Refuse, in one line, data fields set beside data that was not built from them: ``data=``
    fixes the samples, the clients' splits and the augmentation, so ``dataset``, ``partition``,
    ``alpha``, ``num_clients``, ``augment``, ``data_dir``, ... would be recorded without having
    applied (:data:`fednorm.config_roles.USER_DATA_FIELDS`). A field left at its default, or
    equal to what the data has (its client count, its augmentation), is fine.

    Raises:
        ConfigError: such a field is set to anything else.
    """
    from ..config_roles import USER_DATA_FIELDS, is_user_name
    from ..data.provenance import data_recipe
    from ..errors import ConfigError

    if is_user_name(cfg.dataset) or (data.recipe is not None and data.recipe == data_recipe(cfg)):
        return  # already recorded (a comparison's variant), or built from these very fields
    fields = ExperimentConfig.model_fields
    same = {"num_clients": data.num_clients, "augment": bool(data.augment)}
    bad = [k for k in USER_DATA_FIELDS
           if getattr(cfg, k) != fields[k].get_default(call_default_factory=True) and getattr(cfg, k) != same.get(k, object())]
    if not bad:
        return
    given = ", ".join(f"{k}={getattr(cfg, k)!r}" for k in bad)
    if bad == ["augment"]:
        raise ConfigError(f"augment={cfg.augment!r} does not apply to data given as data= (it has augment={bool(data.augment)}): "
                          f"the data carries its own augmentation; build it with FederatedData.from_tensors(..., "
                          f"augment={cfg.augment!r}) (or from_datasets) and leave augment out")
    raise ConfigError(f"{given} {'does' if len(bad) == 1 else 'do'} not apply to data given as data=: its samples, clients and splits are fixed "
                      f"(FederatedData.from_tensors/from_datasets, augment there too); leave "
                      f"{'it' if len(bad) == 1 else 'them'} out, or leave data out to build the data from the config")


def record_model(cfg: ExperimentConfig, user: UserModel) -> ExperimentConfig:
    """``cfg`` recording a user's module: ``model: user:ClassName`` with its description in
    ``model_args``, and the norm the method needs where ``norm`` was left at ``bn``."""
    from ..errors import ConfigError
    from ..models.user import is_user_model, method_norm

    if cfg.model_args and not is_user_model(cfg.model):
        raise ConfigError(f"model_args ({', '.join(map(str, cfg.model_args))}) are options of a registry model's builder; "
                          "build your module with its options before passing it as model=")
    return resolve_config(cfg, model=user.tag(), model_args=user.describe(), norm=method_norm(cfg.method, cfg.norm))
