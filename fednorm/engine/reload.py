"""A finished or stopped run rebuilt from its directory, for work on its weights after training
(scoring on another test set, diagnostics, analyses): its config, its latest checkpoint, on a
device this machine has.

A run of a user's own module or data (``fednorm.run(model=net, data=data)``, recorded as
``user:NAME``) cannot be rebuilt from its config alone: the caller gives the same module (its
architecture is checked, its weights come from the checkpoint) and the same data (checked
against the fingerprint the run recorded), as a resume does.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError

__all__ = ["simulation_from_run"]


def simulation_from_run(run_dir: str | Path, *, model: Any = None, data: Any = None, data_dir: str | None = None,
                        device: str | None = None, what: str = "load") -> tuple[Any, dict[str, Any]]:
    """``(Simulation, checkpoint)`` of ``run_dir`` with its latest checkpoint loaded.

    Args:
        run_dir: a run directory (``config.yaml`` + a checkpoint).
        model: the ``nn.Module`` (or factory, or :class:`~fednorm.models.user.UserModel`) of a run
            of the user's own model; ``None`` for a run of a registry model.
        data: the :class:`~fednorm.data.federated.FederatedData` of a run of the user's own data
            (or the data a registry dataset's config builds); ``None`` to build it from the config.
        data_dir: the dataset folder, if not the run's.
        device: where to rebuild it (default: the run's, or the CPU for a run made on a GPU and
            reloaded where there is none; a model's outputs differ between devices only by rounding).
        what: the caller's name (``evaluate``, ``diagnose``, ``analyze``), for its messages: a
            run of the user's model or data names ``fednorm.<what>(run_dir, model=..., data=...)``.

    Raises:
        ConfigError: not a run directory; a run of a user's model or data without them (the
            message names the Python call that takes them); a model or data other than the run's.
    """
    from ..config import load_config
    from ..data.provenance import check_same_data, data_recipe, is_user_dataset
    from ..models.user import UserModel, is_user_model, using_model
    from .checkpoint import load_latest
    from .simulator import Simulation

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"cannot {what} {run_dir}: no config.yaml there (is it a fednorm run directory?)")
    overrides: dict[str, Any] = {"out": None}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    cfg = load_config(run_dir / "config.yaml", overrides)
    user_model, user_data = is_user_model(cfg.model), is_user_dataset(cfg.dataset)
    missing = [f"{kind} '{name}'" for kind, name, own, given in (("model", cfg.model, user_model, model),
                                                                ("dataset", cfg.dataset, user_data, data)) if own and given is None]
    if missing:
        given = [name for name, own in (("model", user_model), ("data", user_data)) if own]
        call = ", ".join(f"{name}=..." for name in given)
        raise ConfigError(f"cannot {what} {run_dir}: its {' and '.join(missing)} came from Python, which no command can "
                          f"rebuild from the config; {what} it from Python with the same {' and '.join(given)}: "
                          f"fednorm.{what}('{run_dir}', {call})")
    user: UserModel | None = None
    if model is not None:
        if not user_model:
            raise ConfigError(f"cannot {what} {run_dir} with model=: it trained model '{cfg.model}', built from its config; "
                              "leave model out")
        user = model if isinstance(model, UserModel) else UserModel(model)
        user.check_same(cfg.model_args, str(run_dir), verb=what)
    if data is not None:
        if user_data:
            check_same_data(cfg.dataset_args, data, str(run_dir), verb=what)
        elif getattr(data, "recipe", None) != data_recipe(cfg):
            raise ConfigError(f"cannot {what} {run_dir} with data=: it trained on dataset '{cfg.dataset}', built from its "
                              "config, and the data given was not built from that config; leave data out to rebuild it")
        data = copy.copy(data)  # the tools replace a test set on the simulation's data: never on the caller's object
    if device is None and cfg.device.startswith("cuda") and not torch.cuda.is_available():
        device = "cpu"
    if device is not None:
        cfg = cfg.model_copy(update={"device": device})
    checkpoint = load_latest(run_dir)
    with using_model(user, cfg):  # the registry's user:NAME builds this module (fednorm/models/user.py)
        sim = Simulation(cfg, data=data)
    sim.load_state_dict(checkpoint)
    return sim, checkpoint
