"""fednorm experiments on Flower's simulation engine (``flwr.simulation.run_simulation``, Ray)."""

from __future__ import annotations

from typing import Any

from ..api import RunResult
from ..config import ExperimentConfig
from .client_app import app as client_app
from .server_app import make_server_app

__all__ = ["run_simulation"]


def run_simulation(config: ExperimentConfig, *, num_nodes: int = 2, num_cpus: int = 2, cpus_per_node: int = 1,
                   write: bool = True, timeout: float = 600.0, secure: bool = False) -> RunResult:
    """Run ``config`` with its clients on ``num_nodes`` virtual SuperNodes (node ``i`` hosts the
    clients ``c`` with ``c % num_nodes == i``) and return the result, as :func:`fednorm.api.run`.

    ``secure``: aggregate the updates with Flower's SecAgg+ (``fednorm.flower.secure``).
    Ray gets ``num_cpus`` CPUs and runs ⌊num_cpus / cpus_per_node⌋ ClientApps at a time.
    """
    from flwr.simulation import run_simulation as flwr_run_simulation

    results: list[RunResult] = []
    server = make_server_app(config, num_nodes=num_nodes, write=write, results=results, timeout=timeout,
                             **{"secure-aggregation": secure})
    backend: dict[str, Any] = {
        "client_resources": {"num_cpus": cpus_per_node, "num_gpus": 0.0},
        "init_args": {"num_cpus": num_cpus, "include_dashboard": False},
    }
    flwr_run_simulation(server_app=server, client_app=client_app, num_supernodes=num_nodes, backend_config=backend)
    if not results:
        raise RuntimeError("the Flower simulation ended without a result; see the log above for the ServerApp's error")
    return results[0]
