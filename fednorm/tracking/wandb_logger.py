"""Weights & Biases in offline mode (``--log wandb``): the config, the metrics of every round and
the summary go to ``RUN_DIR/wandb/offline-run-*``, which ``wandb sync`` uploads later. Offline
by default, so a run never needs a network or an account; ``log_args: {wandb: {mode: online}}``
logs live. Needs ``pip install 'fednorm[wandb]'``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .callback import Callback
from .values import client_scalars, require, round_scalars, summary_scalars

__all__ = ["WandbLogger"]


class WandbLogger(Callback):
    """Args:
        project: the W&B project (default: ``fednorm``).
        mode: ``offline`` (default), ``online`` or ``disabled``.
        dir: the folder that holds ``wandb/`` (default: the run directory).
        name: the run's name (default: the run directory's name).
    """

    def __init__(self, project: str = "fednorm", mode: str = "offline", dir: str | None = None, name: str | None = None) -> None:
        require("wandb", "wandb", "wandb")
        if mode not in ("offline", "online", "disabled"):
            raise ConfigError(f"log_args.wandb.mode must be offline, online or disabled, got {mode!r}")
        self.project, self.mode, self.dir, self.name = project, mode, dir, name
        self.run: Any = None

    def on_run_start(self, sim: Any, run_dir: Path | None) -> None:
        import wandb

        where = self.dir or (str(run_dir) if run_dir is not None else None)
        if where is not None:
            Path(where).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=self.project, mode=self.mode, dir=where, reinit="create_new",
                              name=self.name or (run_dir.name if run_dir is not None else None),
                              config=sim.config.recorded(), settings=wandb.Settings(silent=True))

    def on_round_end(self, record: Any, sim: Any) -> None:
        values: dict[str, float] = {**round_scalars(record), **(client_scalars(record) if record.metrics else {})}
        self.run.log({**values, "round": record.server_round}, step=record.server_round)

    def on_run_end(self, sim: Any, summary: dict[str, Any], run_dir: Path | None) -> None:
        if self.run is None:
            return
        for k, v in summary_scalars(summary).items():
            self.run.summary[k] = v
        self.run.summary["status"] = summary.get("status")
        self.run.finish(exit_code=0 if summary.get("status") == "completed" else 1)
