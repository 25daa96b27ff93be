"""fednorm on Flower (flwr 1.41, Message API): the same experiments with real Flower processes.

- :mod:`fednorm.flower.server_app` / :mod:`fednorm.flower.client_app`: the ServerApp and
  ClientApp (``app`` in each), for ``flwr run`` against a SuperLink and SuperNodes;
- :func:`run_simulation`: the same apps on Flower's simulation engine (Ray);
- :func:`write_app`: a Flower app directory (``pyproject.toml``) that points at them.

Needs the ``flower`` extra (``pip install fednorm[flower]``). See docs/deploy.md.
"""

from typing import Any

from .appdir import write_app  # needs no flwr: `fednorm flower-app` works without the extra

__all__ = ["run_simulation", "write_app"]


def __getattr__(name: str) -> Any:
    if name == "run_simulation":
        from .simulation import run_simulation

        return run_simulation
    raise AttributeError(f"module 'fednorm.flower' has no attribute '{name}'")
