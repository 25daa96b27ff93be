"""fednorm: federated learning with normalization layers on non-IID data.

Quick use::

    import fednorm
    result = fednorm.run(dataset="digits", partition="dirichlet", alpha=0.3, rounds=20, norm="gn")
    print(result.summary["final_test_accuracy"])
    table = fednorm.compare(rounds=20, variants=[{"norm": "bn"}, {"norm": "gn"}], out="runs/cmp")
    print(table.markdown())
"""

from .api import CompareResult, RunResult, analyze, compare, diagnose, evaluate, run
from .config import ExperimentConfig, load_config
from .data import FederatedData, build_federated_data, list_datasets, list_partitions, load_dataset
from .engine.adapt import adapt
from .engine.simulator import Simulation
from .methods import get_method, list_methods
from .models import get_model, list_models
from .nn import get_norm_layer, list_norms
from .version import __version__
from . import seeds  # noqa: E402 - fednorm.seeds.run_seeds after `import fednorm`, as the docs write it

__all__ = [
    "__version__",
    "CompareResult",
    "RunResult",
    "compare",
    "run",
    "evaluate",
    "diagnose",
    "analyze",
    "adapt",
    "ExperimentConfig",
    "load_config",
    "FederatedData",
    "build_federated_data",
    "list_datasets",
    "list_partitions",
    "load_dataset",
    "Simulation",
    "get_method",
    "list_methods",
    "get_model",
    "list_models",
    "get_norm_layer",
    "list_norms",
]
