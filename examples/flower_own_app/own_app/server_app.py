"""Your ServerApp: Flower's strategy loop with a fednorm method's server side.

Run config (``[tool.flwr.app.config]``, ``flwr run --run-config``): ``method`` (``fedbn``,
``silobn``, ``hbn``, ``fbn``, ``fedavg``), ``method-args`` (JSON of the method's options),
``num-rounds``, ``lr``, ``local-epochs``, ``batch-size``, ``num-nodes``, ``seed``, ``out`` (where
to save the final model, on the SuperLink's host; empty: not saved).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result

from fednorm.flower import MethodStrategy

from .task import make_model

DEFAULTS: dict[str, Any] = {"method": "fedbn", "method-args": "", "num-rounds": 3, "lr": 0.05, "local-epochs": 1,
                            "batch-size": 32, "num-nodes": 2, "seed": 0, "timeout": 600.0, "out": ""}

app = ServerApp()


def run(grid: Grid, run_config: Mapping[str, Any]) -> Result:
    """Train with the run config's method on the grid's nodes; Flower's ``Result``."""
    config = {**DEFAULTS, **dict(run_config)}
    torch.manual_seed(int(config["seed"]))  # the initial model
    model = make_model(str(config["method"]))
    nodes = int(config["num-nodes"])
    strategy = MethodStrategy(str(config["method"]), model, method_args=json.loads(str(config["method-args"]) or "{}"),
                              min_available_nodes=nodes, min_train_nodes=nodes, min_evaluate_nodes=nodes)
    train_config = ConfigRecord({"lr": float(config["lr"]), "local-epochs": int(config["local-epochs"]),
                                 "batch-size": int(config["batch-size"])})
    return strategy.start(grid, ArrayRecord(model.state_dict()), num_rounds=int(config["num-rounds"]),
                          timeout=float(config["timeout"]), train_config=train_config)


@app.main()
def main(grid: Grid, context: Context) -> None:
    result = run(grid, context.run_config)
    out = str(context.run_config.get("out") or "")
    if out:
        torch.save(result.arrays.to_torch_state_dict(), out)  # FedBN: the shared tensors; BatchNorm stays on the clients
