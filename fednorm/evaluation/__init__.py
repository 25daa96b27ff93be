"""A finished run's model evaluated on another test set (``fednorm evaluate``)."""

from .test_sets import evaluate_run, evaluate_run_on, wilson_interval

__all__ = ["evaluate_run", "evaluate_run_on", "wilson_interval"]
