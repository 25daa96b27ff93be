"""Resuming a run from its directory: which settings may change, the model and data it must be
given back, and a diverged run's restart with a smaller learning rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ..config import ExperimentConfig
from ..config_roles import RESUMABLE_FIELDS
from ..data.federated import FederatedData
from ..models.user import UserModel
from .inputs import record_data, resolve_config

__all__ = ["RESUMABLE_OVERRIDES", "check_resumable", "model_for_resume", "data_for_resume", "lr_restart", "base_lr"]

# Settings that may change when a run is resumed (how long, what is measured, where it runs and
# writes: fednorm/config_roles.py); every other field must match the checkpoint.
RESUMABLE_OVERRIDES = RESUMABLE_FIELDS


def check_resumable(cfg: ExperimentConfig, saved: Mapping[str, Any], run_dir: Path) -> None:
    from ..errors import ConfigError

    now = cfg.model_dump(mode="json")
    # A field added after the checkpoint was written is absent from it; the run had that
    # field's default behaviour (new fields default to the old behaviour), so compare with it.
    defaults = ExperimentConfig().model_dump(mode="json")
    saved = {**{k: defaults[k] for k in now if k not in saved}, **saved}
    diff = [k for k in now if k not in RESUMABLE_OVERRIDES and now[k] != saved.get(k)]
    if diff:
        detail = ", ".join(f"{k}: checkpoint {saved.get(k)!r} vs now {now[k]!r}" for k in diff)
        raise ConfigError(f"cannot resume {run_dir}: settings differ from the checkpoint ({detail})")


def model_for_resume(cfg: ExperimentConfig, user: UserModel | None, data: FederatedData | None, run_dir: Path) -> None:
    """A run of a user's module resumes only from Python, with a module of the same architecture
    (its weights come from the checkpoint); a run of a registry model takes no module."""
    from ..data.provenance import is_user_dataset
    from ..errors import ConfigError
    from ..models.user import is_user_model, user_model_error

    if not is_user_model(cfg.model):
        if user is not None:
            raise ConfigError(f"cannot resume {run_dir}: it trained model '{cfg.model}' built from its config; leave model out")
        return
    if user is None:
        if is_user_dataset(cfg.dataset) and data is None:
            raise ConfigError(f"cannot resume {run_dir} from its config: model '{cfg.model}' and dataset '{cfg.dataset}' were "
                              f"given from Python; resume from Python with the same model and data: "
                              f"fednorm.run(resume='{run_dir}', model=..., data=...)")
        raise ConfigError(f"cannot resume {run_dir} from its config: {user_model_error(cfg.model, str(run_dir))}")
    user.check_same(cfg.model_args, str(run_dir))


def data_for_resume(cfg: ExperimentConfig, data: FederatedData | None, run_dir: Path) -> ExperimentConfig:
    """Check that a resumed run gets its data back: data given from Python must match the
    fingerprint the run recorded; a run of such data cannot rebuild it from its config."""
    from ..data.provenance import check_same_data, is_user_dataset, user_data_error
    from ..errors import ConfigError

    if is_user_dataset(cfg.dataset):
        if data is None:
            raise ConfigError(str(user_data_error(cfg.dataset, str(run_dir))))
        check_same_data(cfg.dataset_args, data, str(run_dir))
        return cfg
    if data is not None:
        recorded = record_data(cfg, data)
        if recorded.dataset != cfg.dataset:
            raise ConfigError(f"cannot resume {run_dir}: it trained on dataset '{cfg.dataset}' built from its config, and "
                              "the data given was not built from that config; leave data out to rebuild it")
    return cfg


def lr_restart(cfg: ExperimentConfig, lr: float | None, run_dir: Path, done: int) -> ExperimentConfig:
    """A diverged run resumes only with a smaller learning rate from its last good checkpoint
    (the same lr would diverge the same way); the change is recorded in ``lr_restarts``."""
    from ..engine.outputs import read_summary
    from ..errors import ConfigError

    try:
        summary = read_summary(run_dir)
    except (OSError, ValueError):
        summary = {}
    diverged = summary.get("status") == "diverged"
    if lr is None:
        if diverged:
            raise ConfigError(f"{run_dir} diverged; resuming with the same lr diverges again: restart from its last good "
                              f"checkpoint (round {done}) with a smaller one: fednorm run --resume {run_dir} --lr {base_lr(cfg) / 10:g}")
        return cfg
    if not diverged:
        raise ConfigError(f"cannot change lr when resuming {run_dir}: only a diverged run restarts with another lr "
                          "(a new lr is a new run: pass another --out)")
    restarts = [r for r in cfg.lr_restarts if r["round"] < done] + [{"round": done, "lr": float(lr)}]
    return resolve_config(cfg, lr_restarts=restarts)


def base_lr(cfg: ExperimentConfig) -> float:
    """The learning rate the schedule starts from now: the last restart's, else ``lr``."""
    return float(cfg.lr_restarts[-1]["lr"]) if cfg.lr_restarts else cfg.lr
