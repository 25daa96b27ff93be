"""A Flower app directory for fednorm: what ``flwr run DIR`` packages and submits.

The directory holds only a ``pyproject.toml``: its components point at fednorm's ServerApp and
ClientApp, which must be importable (fednorm installed) where the SuperLink and SuperNodes run.
Connection settings (addresses, TLS) belong in ``$FLWR_HOME/config.toml``, not here: flwr 1.41
rewrites an app's ``[tool.flwr.federations]`` table, so none is written.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["write_app", "check_round_based", "FLWR_VERSION"]

FLWR_VERSION = "1.41.0"


def check_round_based(method_name: str, requires_lockstep: bool) -> None:
    """Refuse lockstep methods (FedTAN): they synchronise clients inside every local step, which
    Flower's round-based messages cannot carry."""
    from ..errors import ConfigError

    if requires_lockstep:
        raise ConfigError(
            f"method '{method_name}' synchronises its clients inside every local step, which Flower's "
            "round-based messages cannot do; run it in-process (`fednorm run`) or over torch.distributed "
            "(`fednorm launch` / torchrun)"
        )


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def write_app(directory: str | Path, *, config: str | Path | None = None, out: str | Path | None = None,
              num_nodes: int = 2, timeout: float = 600.0, node_wait: float = 120.0) -> Path:
    """Write ``directory/pyproject.toml`` with the run config's defaults. ``config`` is a YAML
    file inside ``directory`` (kept relative: it travels in the app's FAB) or elsewhere (made
    absolute: the ServerApp then reads it on the SuperLink's host). Returns the file."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    cfg = ""
    if config:
        full = Path(config).resolve()
        cfg = str(full.relative_to(root.resolve())) if full.is_relative_to(root.resolve()) else str(full)
    text = f"""# A Flower app that runs fednorm experiments (written by `fednorm flower-app`).
# flwr run {root} <superlink-connection> --run-config "config='/path/exp.yaml' out='/path/run'"

[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fednorm-flower"
version = "1.0.0"
description = "fednorm experiments on a Flower federation"
license = "Apache-2.0"
dependencies = ["flwr[simulation]=={FLWR_VERSION}", "fednorm"]

[tool.flwr.app]
publisher = "fednorm"

[tool.flwr.app.components]
serverapp = "fednorm.flower.server_app:app"
clientapp = "fednorm.flower.client_app:app"

[tool.flwr.app.config]
config = {_toml_str(cfg)}        # the experiment's YAML file: relative to this directory, or absolute on the SuperLink's host
overrides = ""     # inline YAML mapping of config fields, e.g. "{{rounds: 5}}"
out = {_toml_str(str(out or ""))}           # run directory on the SuperLink's host (default: runs/...)
resume = ""        # a run directory to continue from its latest checkpoint
num-nodes = {int(num_nodes)}      # SuperNodes, started with --node-config "partition-id=I num-partitions=N"
timeout = {float(timeout)}    # seconds one exchange may take
node-wait = {float(node_wait)}  # seconds to wait for the SuperNodes
secure-aggregation = false  # aggregate updates and statistics with Flower's SecAgg+ (FedAvg, FedBN, SiloBN, HBN, FBN; docs/privacy.md)
"""
    path = root / "pyproject.toml"
    path.write_text(text)
    return path
