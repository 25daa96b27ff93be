"""Server-side FL optimizers: FedAvgM, FedAdam and FedYogi (FedOpt, Reddi et al. 2021).

The server treats the aggregated change of the model as a pseudo-gradient,
``Δ = aggregated − global`` (Reddi et al., arXiv:2003.00295, Algorithm 2), and applies an optimizer
step to the global model. Only *learnable parameters* go through it: BatchNorm running
statistics, ``num_batches_tracked`` and HBN's global statistics take the aggregated value as it
is. Pushing statistics through Adam's normalised step is what makes "FedAdam + BN" crash in
other frameworks (the HBN paper reports the crash and uses GN for its FedAdam base in Table 4,
Chen et al., 2025, Sec. 4.2); the LN paper's released FedYogi also covers only ``parameters()``.

Moments are kept in float64 and the result is cast back to the parameter's dtype.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ..registry import Registry
from .checks import check_number

__all__ = [
    "SERVER_OPTIMIZERS",
    "ServerOptimizer",
    "FedAvgM",
    "FedAdam",
    "FedYogi",
    "get_server_optimizer",
    "list_server_optimizers",
    "register_server_optimizer",
]

SERVER_OPTIMIZERS: Registry[type["ServerOptimizer"]] = Registry("server optimizer")
register_server_optimizer = SERVER_OPTIMIZERS.register


def list_server_optimizers(include: Any = None, exclude: Any = None) -> list[str]:
    return SERVER_OPTIMIZERS.list(include, exclude)


def get_server_optimizer(name: str, **config: Any) -> "ServerOptimizer":
    """Build a server optimizer from its name and its options (``server_opt_args``)."""
    return SERVER_OPTIMIZERS.build_from_config(name, "server_opt_args", config)



class ServerOptimizer:
    """Base class: the new value of each parameter from its old value and its pseudo-gradient.

    Subclasses implement :meth:`step_tensor`; the state (moments) is a dict per parameter key.
    """

    name: ClassVar[str] = "none"

    def __init__(self) -> None:
        self.moments: dict[str, dict[str, torch.Tensor]] = {}

    def step(self, old: dict[str, torch.Tensor], aggregated: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """New values of the keys of ``aggregated`` (all learnable parameters)."""
        out = {}
        for key, new in aggregated.items():
            x = old[key].double()
            delta = new.double() - x  # Δ_t = mean_i(x_i) − x_t (Reddi et al., Alg. 2)
            out[key] = self.step_tensor(key, x, delta).to(new.dtype)
        return out

    def step_tensor(self, key: str, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return x + delta

    def state_dict(self) -> dict[str, Any]:
        return {"moments": {k: {n: t.detach().cpu().clone() for n, t in m.items()} for k, m in self.moments.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.moments = {k: {n: t.to(torch.float64) for n, t in m.items()} for k, m in state.get("moments", {}).items()}

    def hparams(self) -> dict[str, Any]:
        return {}


@register_server_optimizer("none")
class NoServerOptimizer(ServerOptimizer):
    """The aggregate becomes the global model (FedAvg)."""

    def step(self, old: dict[str, torch.Tensor], aggregated: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return aggregated


@register_server_optimizer("fedavgm")
class FedAvgM(ServerOptimizer):
    """FedAvgM (Hsu, Qi & Brown 2019, arXiv:1909.06335): server momentum on the averaged update.

    ``m ← β·m + Δ``, ``x ← x + η·m``. With β = 0 and η = 1 it is FedAvg.

    Args:
        server_lr: eta. (default: 0.1)
        momentum: beta. (default: 0.9)
        Hsu et al. find that the effective rate η/(1 − β) is what matters; the defaults make it 1,
        the long-run step of FedAvg. The LN paper's code has FedAvgM but reports no setting.
    """

    name = "fedavgm"

    def __init__(self, server_lr: float = 0.1, momentum: float = 0.9) -> None:
        super().__init__()
        self.server_lr = check_number("fedavgm server_lr", server_lr, 0.0, low_open=True)
        self.momentum = check_number("fedavgm momentum", momentum, 0.0, 1.0)

    def step_tensor(self, key: str, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        state = self.moments.setdefault(key, {"m": torch.zeros_like(x)})
        state["m"] = self.momentum * state["m"] + delta
        return x + self.server_lr * state["m"]

    def hparams(self) -> dict[str, Any]:
        return {"server_lr": self.server_lr, "momentum": self.momentum}


class _AdaptiveServerOptimizer(ServerOptimizer):
    """Shared by FedAdam and FedYogi: ``m ← β1·m + (1−β1)·Δ``, a second moment ``v``, and
    ``x ← x + η·m/(√v + τ)``; ``m₀ = 0``, ``v₀ = τ²``, no bias correction (Reddi et al. Alg. 2; the
    LN paper's released code; Zhang et al., 2024, App. C.4).

    Args:
        server_lr: eta. (default: 0.01)
        beta1: (default: 0.9)
        beta2: (default: 0.99)
        tau: adaptivity epsilon; also sets v₀ = τ². (default: 1e-3)
        The defaults are the LN paper's FedYogi setting, used for FedAdam too.
    """

    def __init__(self, server_lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3) -> None:
        super().__init__()
        self.server_lr = check_number(f"{self.name} server_lr", server_lr, 0.0, low_open=True)
        self.beta1 = check_number(f"{self.name} beta1", beta1, 0.0, 1.0)
        self.beta2 = check_number(f"{self.name} beta2", beta2, 0.0, 1.0)
        self.tau = check_number(f"{self.name} tau", tau, 0.0, low_open=True)

    def second_moment(self, v: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def step_tensor(self, key: str, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        state = self.moments.setdefault(key, {"m": torch.zeros_like(x), "v": torch.full_like(x, self.tau**2)})
        state["m"] = self.beta1 * state["m"] + (1 - self.beta1) * delta
        state["v"] = self.second_moment(state["v"], delta)
        return x + self.server_lr * state["m"] / (state["v"].sqrt() + self.tau)

    def hparams(self) -> dict[str, Any]:
        return {"server_lr": self.server_lr, "beta1": self.beta1, "beta2": self.beta2, "tau": self.tau}


@register_server_optimizer("fedadam")
class FedAdam(_AdaptiveServerOptimizer):
    """FedAdam (Reddi et al. 2021): ``v ← β2·v + (1−β2)·Δ²``."""

    name = "fedadam"

    def second_moment(self, v: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return self.beta2 * v + (1 - self.beta2) * delta**2


@register_server_optimizer("fedyogi")
class FedYogi(_AdaptiveServerOptimizer):
    """FedYogi (Reddi et al. 2021): ``v ← v − (1−β2)·Δ²·sign(v − Δ²)`` (as in Zhang et al., 2024,
    App. C.4)."""

    name = "fedyogi"

    def second_moment(self, v: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        d2 = delta**2
        return v - (1 - self.beta2) * d2 * torch.sign(v - d2)


# Short spellings: ``--server-opt yogi`` reads as naturally as ``fedyogi``.
SERVER_OPTIMIZERS.add("avgm", FedAvgM)
SERVER_OPTIMIZERS.add("adam", FedAdam)
SERVER_OPTIMIZERS.add("yogi", FedYogi)
