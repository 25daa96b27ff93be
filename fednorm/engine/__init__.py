"""The federated engine: round loop, executors, local training, per-client state, run outputs."""

from .bank import ClientStateBank
from .evaluation import EvalResult, evaluate
from .executor import SequentialExecutor
from .local import LocalResult, LocalSpec, batch_plan, train_local
from .outputs import RunWriter, read_metrics, read_summary
from .rng import derive_seed, numpy_rng, torch_generator
from .simulator import Simulation

__all__ = [
    "ClientStateBank",
    "EvalResult",
    "evaluate",
    "SequentialExecutor",
    "LocalResult",
    "LocalSpec",
    "batch_plan",
    "train_local",
    "RunWriter",
    "read_metrics",
    "read_summary",
    "derive_seed",
    "numpy_rng",
    "torch_generator",
    "Simulation",
]
