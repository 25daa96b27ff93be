"""FL optimizers that compose with every method: client side (FedProx, SCAFFOLD, MOON, and the
label-skew objectives FedLC, FedRS, FedDecorr, FedSAM's sharpness-aware steps, FedACG's look-ahead start) and
server side (FedAvgM, FedAdam, FedYogi). See :func:`fednorm.optim.compose.compose`."""

from .client import (
    CLIENT_OPTIMIZERS,
    ClientOptimizer,
    FedProx,
    Moon,
    Scaffold,
    get_client_optimizer,
    list_client_optimizers,
    register_client_optimizer,
)
from .compose import OptimizedMethod, build_method, compose
from .objectives import FedDecorr, FedLC, FedRS
from .acg import FedACG
from .sam import FedSAM
from .server import (
    SERVER_OPTIMIZERS,
    FedAdam,
    FedAvgM,
    FedYogi,
    ServerOptimizer,
    get_server_optimizer,
    list_server_optimizers,
    register_server_optimizer,
)

__all__ = [
    "CLIENT_OPTIMIZERS",
    "SERVER_OPTIMIZERS",
    "ClientOptimizer",
    "ServerOptimizer",
    "FedProx",
    "Scaffold",
    "Moon",
    "FedLC",
    "FedRS",
    "FedDecorr",
    "FedSAM",
    "FedACG",
    "FedAvgM",
    "FedAdam",
    "FedYogi",
    "OptimizedMethod",
    "compose",
    "build_method",
    "get_client_optimizer",
    "get_server_optimizer",
    "list_client_optimizers",
    "list_server_optimizers",
    "register_client_optimizer",
    "register_server_optimizer",
]
