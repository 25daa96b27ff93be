"""A finished or stopped run rebuilt from its directory, for work on its weights after training
(scoring on another test set, diagnostics): its config, its latest checkpoint, on a device this
machine has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError

__all__ = ["simulation_from_run"]


def simulation_from_run(run_dir: str | Path, *, data_dir: str | None = None, device: str | None = None,
                        what: str = "load") -> tuple[Any, dict[str, Any]]:
    """``(Simulation, checkpoint)`` of ``run_dir`` with its latest checkpoint loaded.

    ``device``: where to rebuild it (default: the run's, or the CPU for a run made on a GPU and
    reloaded where there is none; a model's outputs differ between devices only by rounding).
    ``what`` names the caller in the error for a folder that is not a run directory."""
    from ..config import load_config
    from .checkpoint import load_latest
    from .simulator import Simulation

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"cannot {what} {run_dir}: no config.yaml there (is it a fednorm run directory?)")
    overrides: dict[str, Any] = {"out": None}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    cfg = load_config(run_dir / "config.yaml", overrides)
    if device is None and cfg.device.startswith("cuda") and not torch.cuda.is_available():
        device = "cpu"
    if device is not None:
        cfg = cfg.model_copy(update={"device": device})
    checkpoint = load_latest(run_dir)
    sim = Simulation(cfg)
    sim.load_state_dict(checkpoint)
    return sim, checkpoint
