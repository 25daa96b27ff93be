"""fednorm's Flower ServerApp: ``fednorm run`` with the clients on Flower SuperNodes.

Run config (``[tool.flwr.app.config]`` of the app, ``flwr run --run-config``):

- ``config``: the experiment's YAML file (as ``fednorm run --config``): a path relative to the app
  directory (it travels inside the app's FAB, as ``fednorm flower-app`` writes it) or an absolute
  path on the SuperLink's host;
- ``overrides``: optional inline YAML/JSON mapping of config fields, e.g. ``"{rounds: 5}"``;
- ``out``: the run directory, written on the SuperLink's host (default: ``runs/<...>``);
- ``resume``: a run directory to continue from its latest checkpoint (then ``config`` is ignored);
- ``num-nodes``: SuperNodes to wait for; they must be started with
  ``--node-config "partition-id=I num-partitions=N"``;
- ``timeout``: seconds one exchange may take; ``node-wait``: seconds to wait for the SuperNodes;
- ``secure-aggregation``: aggregate the updates with Flower's SecAgg+ (``fednorm.flower.secure``).

The round loop is fednorm's own (:func:`fednorm.api.run` with ``FlowerSimulation``), so the
run directory, checkpoints and metrics are those of ``fednorm run``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from .. import yaml_io
from ..api import RunResult, run
from ..config import ExperimentConfig, load_config
from ..errors import ConfigError
from .runtime import simulation_factory, wait_for_nodes

__all__ = ["app", "run_on_grid", "config_from_run_config", "make_server_app"]

DEFAULTS: dict[str, Any] = {"config": "", "overrides": "", "out": "", "resume": "", "num-nodes": 2, "timeout": 600.0,
                            "node-wait": 120.0, "secure-aggregation": False}


def app_dir(grid: Grid) -> Path | None:
    """Where the SuperLink unpacked this run's app (FAB), if it did."""
    try:
        from flwr.common.config import get_project_dir

        r = grid.run
        return get_project_dir(r.fab_id, r.fab_version, r.fab_hash) if r.fab_id else None
    except Exception:  # no FAB (run_simulation) or another flwr layout
        return None


def parse_overrides(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """The run config's ``overrides`` mapping (empty when unset)."""
    text = str(run_config.get("overrides") or "").strip()
    if not text:
        return {}
    loaded = yaml_io.safe_load(text)
    if not isinstance(loaded, dict):
        raise ConfigError(f"run config 'overrides' must be a YAML/JSON mapping, got {text!r}")
    return loaded


def config_from_run_config(run_config: Mapping[str, Any], base: Path | None = None) -> ExperimentConfig:
    """The experiment described by a run config's ``config`` (relative paths are taken from
    ``base``, the app directory) and ``overrides``."""
    overrides = parse_overrides(run_config)
    out = str(run_config.get("out") or "")
    if out:
        overrides["out"] = out
    path = str(run_config.get("config") or "")
    if path and not Path(path).is_absolute() and base is not None and (base / path).is_file():
        path = str(base / path)
    from ..plugins import load_plugins

    load_plugins()  # a plugin's method or model, named in the run config (FEDNORM_PLUGINS)
    return load_config(Path(path) if path else None, overrides)


def run_on_grid(grid: Grid, config: ExperimentConfig | None, *, num_nodes: int, timeout: float = 600.0,
                node_wait: float = 120.0, write: bool = True, resume: str | Path | None = None,
                resume_overrides: Mapping[str, Any] | None = None, secure: bool = False) -> RunResult:
    """``fednorm.api.run`` with the clients on the grid's nodes (waits for ``num_nodes``).
    With ``resume`` (a run directory), continue it; ``resume_overrides`` may change the fields
    that ``fednorm run --resume`` allows (e.g. ``rounds``)."""
    nodes = wait_for_nodes(grid, num_nodes, node_wait)
    factory = simulation_factory(grid, nodes, timeout, secure=secure)
    if resume:
        return run(resume=resume, simulation=factory, progress=False, **dict(resume_overrides or {}))
    return run(config, simulation=factory, write=write, progress=False, overwrite=True)  # as before: out is the app's


def make_server_app(config: ExperimentConfig | None = None, *, num_nodes: int | None = None, write: bool = True,
                    results: list[RunResult] | None = None, **options: Any) -> ServerApp:
    """A ServerApp for one experiment. With ``config`` (for ``run_simulation``, whose run config
    is empty) it runs that; otherwise it reads the run config (deployment). Finished runs are
    appended to ``results`` when given (``run_simulation`` runs the ServerApp in a thread of the
    calling process)."""
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        rc = {**DEFAULTS, **dict(context.run_config), **options}
        cfg = config
        resume = str(rc["resume"] or "") or None
        if cfg is None and resume is None:
            cfg = config_from_run_config(rc, app_dir(grid))
        result = run_on_grid(grid, cfg, num_nodes=int(num_nodes or rc["num-nodes"]), timeout=float(rc["timeout"]),
                             node_wait=float(rc["node-wait"]), write=write, resume=resume,
                             resume_overrides=parse_overrides(rc) if resume else None,
                             secure=str(rc["secure-aggregation"]).lower() in ("true", "1", "yes"))
        if results is not None:
            results.append(result)
        s = result.summary
        acc = s.get("final_test_accuracy")  # a fraction in summary.json; a person reads percent
        print(f"fednorm: {s['method']}+{s['norm']} {s['status']} after {s['rounds']} rounds, final test accuracy "
              f"{'n/a' if acc is None else f'{100 * acc:.2f}%'}, run directory {result.out_dir}", flush=True)

    return server


app = make_server_app()
