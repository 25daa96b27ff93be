"""A built-in callback that records the run's partition in ``RUN_DIR/partition.json``: each
client's training label counts (and, under feature shift, its data source), so a report can show
the label distribution without loading the dataset again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .callback import Callback

__all__ = ["PartitionRecord", "PARTITION_FILE"]

PARTITION_FILE = "partition.json"


class PartitionRecord(Callback):
    """Writes ``partition.json`` when a run directory starts (kept as it is when resuming)."""

    def on_run_start(self, sim: Any, run_dir: Path | None) -> None:
        if run_dir is None or (Path(run_dir) / PARTITION_FILE).exists():
            return
        data, cfg = sim.data, sim.config
        y = data.train_y.detach().cpu().long()
        hist = [torch.bincount(y[ix.detach().cpu().long()], minlength=data.num_classes).tolist() for ix in data.client_train]
        sources = ([data.domain_names[d] for d in data.client_domain]
                   if data.client_domain is not None and data.domain_names is not None else None)
        record = {"dataset": cfg.dataset, "partition": cfg.partition, "num_clients": cfg.num_clients, "seed": cfg.seed,
                  "num_classes": data.num_classes, "train_label_counts": hist, "client_sources": sources}
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / PARTITION_FILE).write_text(json.dumps(record) + "\n")
