"""Python API: run or compare experiments from a notebook, with the same results as the CLI.

Example:
    >>> import fednorm
    >>> result = fednorm.run(dataset="digits", partition="iid", rounds=5, out="runs/demo")
    >>> result.summary["final_test_accuracy"]
    >>> table = fednorm.compare(rounds=10, variants=[{"norm": "bn"}, {"norm": "gn"}])

The modules: :mod:`~fednorm.api.runs` (one run), :mod:`~fednorm.api.comparison` (several
variants), :mod:`~fednorm.api.inputs` (the config and the user's model or data),
:mod:`~fednorm.api.resume` (resuming a run), :mod:`~fednorm.api.stop` (stopping one cleanly) and
:mod:`~fednorm.api.tools` (evaluate, diagnose and analyze a finished run, of your own model or data too).
"""

from __future__ import annotations

# DEFAULT_VARIANTS, record_data, record_model, RESUMABLE_OVERRIDES and STOP_FILE_ENV are public
# names of fednorm.api outside __all__ (the CLI, fednorm.seeds and the reproduce runner read them).
from .comparison import DEFAULT_VARIANTS, CompareResult, compare, plan_variants, variant_label  # noqa: F401
from .inputs import check_device, record_data, record_model, resolve_config  # noqa: F401
from .resume import RESUMABLE_OVERRIDES  # noqa: F401
from .runs import RunResult, run
from .stop import STOP_FILE_ENV  # noqa: F401
from .tools import analyze, diagnose, evaluate

__all__ = ["RunResult", "CompareResult", "run", "compare", "evaluate", "diagnose", "analyze", "resolve_config", "variant_label",
           "check_device", "plan_variants"]
