"""TensorBoard event files (``--log tensorboard``): ``RUN_DIR/tensorboard`` by default.

Scalars per round (``train_loss``, ``lr``; on evaluation rounds the test metrics and traffic),
per client (``client_accuracy/<id>``) and histograms of the normalization layers' running
statistics and of HBN's mixing weights on evaluation rounds. Written with
:class:`torch.utils.tensorboard.SummaryWriter`, which needs the ``tensorboard`` package
(``pip install 'fednorm[tensorboard]'``). View with ``tensorboard --logdir RUN_DIR``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .callback import Callback
from .values import client_scalars, norm_tensors, require, round_scalars, summary_scalars

__all__ = ["TensorBoardLogger"]


class TensorBoardLogger(Callback):
    """Args:
        log_dir: where the event files go (default: ``RUN_DIR/tensorboard``).
        histograms: write the normalization histograms (default: True).
    """

    def __init__(self, log_dir: str | None = None, histograms: bool = True) -> None:
        require("tensorboard", "tensorboard", "tensorboard")
        self.log_dir = log_dir
        self.histograms = histograms
        self.writer: Any = None

    def on_run_start(self, sim: Any, run_dir: Path | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        where = self.log_dir or (run_dir / "tensorboard" if run_dir is not None else None)
        if where is None:
            raise ConfigError("--log tensorboard needs a run directory (out) or log_args: {tensorboard: {log_dir: DIR}}")
        self.writer = SummaryWriter(log_dir=str(where))
        cfg = sim.config
        self.writer.add_text("config", "```\n" + cfg.to_yaml() + "```", global_step=sim.server_round)

    def on_round_end(self, record: Any, sim: Any) -> None:
        step = record.server_round
        for name, value in round_scalars(record).items():
            self.writer.add_scalar(name, value, step)
        if record.metrics:
            for name, value in client_scalars(record).items():
                self.writer.add_scalar(name, value, step)
            if self.histograms:
                for name, values in norm_tensors(sim).items():
                    self.writer.add_histogram(name, values.cpu().numpy(), step)
        self.writer.flush()

    def on_run_end(self, sim: Any, summary: dict[str, Any], run_dir: Path | None) -> None:
        if self.writer is None:
            return
        for name, value in summary_scalars(summary).items():
            self.writer.add_scalar(f"summary/{name}", value, sim.server_round)
        self.writer.close()
