"""What a run is given: its config (an object, a mapping or a YAML file), its device, and a user's
own model or data, recorded in the config as ``user:NAME`` (:mod:`fednorm.data.provenance`,
:mod:`fednorm.models.user`) so a run never claims to have trained on something else."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from ..config import ExperimentConfig, load_config
from ..data.federated import FederatedData
from ..models.user import UserModel

__all__ = ["resolve_config", "check_device", "check_data_type", "split_model", "record_data", "record_model"]


def resolve_config(config: ExperimentConfig | Mapping[str, Any] | str | Path | None = None, **overrides: Any) -> ExperimentConfig:
    """A config from an object, a mapping or a YAML path, with keyword overrides applied."""
    if isinstance(config, ExperimentConfig):
        base = config.model_dump()
        base.update({k: v for k, v in overrides.items() if v is not None})
        return load_config(None, base)
    if isinstance(config, (str, Path)):
        return load_config(config, overrides)
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
    (:mod:`fednorm.data.provenance`), so the run never claims to have trained on the config's dataset."""
    from ..data.provenance import USER_PREFIX, data_name, data_recipe, describe_data

    if data.recipe is not None and data.recipe == data_recipe(cfg):
        return cfg
    tag = f"{USER_PREFIX}:{data_name(data)}"
    recorded = cfg.model_copy(update={"dataset": tag, "partition": tag, "dataset_args": describe_data(data),
                                      "num_clients": data.num_clients, "partition_args": {}, "data_dir": None})
    return load_config(None, recorded.model_dump())  # validated: the name is spelled as config.yaml reads it back


def record_model(cfg: ExperimentConfig, user: UserModel) -> ExperimentConfig:
    """``cfg`` recording a user's module: ``model: user:ClassName`` with its description in
    ``model_args``, and the norm the method needs where ``norm`` was left at ``bn``."""
    from ..errors import ConfigError
    from ..models.user import is_user_model, method_norm

    if cfg.model_args and not is_user_model(cfg.model):
        raise ConfigError(f"model_args ({', '.join(map(str, cfg.model_args))}) are options of a registry model's builder; "
                          "build your module with its options before passing it as model=")
    return resolve_config(cfg, model=user.tag(), model_args=user.describe(), norm=method_norm(cfg.method, cfg.norm))
