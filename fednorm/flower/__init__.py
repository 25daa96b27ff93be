"""fednorm on Flower (flwr 1.41, Message API): the same experiments with real Flower processes,
and fednorm's methods as pieces of your own Flower app.

- :mod:`fednorm.flower.server_app` / :mod:`fednorm.flower.client_app`: the ServerApp and
  ClientApp (``app`` in each), for ``flwr run`` against a SuperLink and SuperNodes;
- :func:`run_simulation`: the same apps on Flower's simulation engine (Ray);
- :func:`write_app`: a Flower app directory (``pyproject.toml``) that points at them;
- :class:`MethodStrategy` (your ServerApp), :class:`MethodClient` and :func:`keep_local_mod` (your
  ClientApp): a fednorm method (FedBN, SiloBN, HBN, FBN, ...) with your own apps, model and data.

Needs the ``flower`` extra (``pip install fednorm[flower]``). See docs/deploy.md.
"""

from typing import Any

from .appdir import write_app  # needs no flwr: `fednorm flower-app` works without the extra

__all__ = ["run_simulation", "write_app", "MethodStrategy", "MethodClient", "ClientRound", "keep_local_mod"]

_LAZY = {  # these import flwr, which only the extra installs
    "run_simulation": "simulation",
    "MethodStrategy": "method_strategy",
    "MethodClient": "method_client",
    "ClientRound": "method_client",
    "keep_local_mod": "method_client",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'fednorm.flower' has no attribute '{name}'")
