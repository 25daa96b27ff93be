"""fednorm experiments on Flower's simulation engine in this process (``flwr.simulation.run_simulation``, Ray).

flwr 1.41 deprecates ``flwr.simulation.run_simulation`` in favour of ``flwr run`` against a
SuperLink with the simulation runtime; this wrapper keeps the in-process route (a
:class:`~fednorm.api.RunResult` back in Python) and lets Flower's deprecation warning through.
"""

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

    It calls ``flwr.simulation.run_simulation``, which flwr 1.41 deprecates (its warning is
    logged, not suppressed) and a later flwr may remove. The route Flower recommends, with the
    same apps and the same results (``tests/test_flower.py`` checks both against the in-process
    simulator), is an app directory and ``flwr run`` against a simulation SuperLink
    (docs/deploy.md)::

        fednorm flower-app myapp --config my.yaml --out runs/flower --num-nodes 2
        flower-superlink --insecure --simulation --host 127.0.0.1 --port 9092 --disable-runtime-dependency-installation &
        flwr run myapp sim --federation-config "num-supernodes=2 client-resources-num-cpus=1 init-args-num-cpus=2"
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
