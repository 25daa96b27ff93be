"""Per-round normalization diagnostics (issue 22): which BatchNorm failure is at work.

``diagnostics: every:N`` (``fednorm run --diagnostics every:N``) adds ``diag/...`` metrics to the
evaluated rounds of metrics.jsonl (:mod:`fednorm.diagnostics.runner` lists them): statistics
mismatch against the exact union statistics, the clients' gradient deviation from centralized
BN, accuracy with recalibrated statistics, HBN's batch weights and FedBN's local spread.
"""

from .gradients import GradientDeviation, gradient_deviation
from .plot import layer_mean, plot_diagnostics
from .runner import PROBE_PER_CLIENT, Diagnostics, parse_schedule
from .statistics import ExactStatistics, Moments, exact_statistics, norm_layers, standardized_distance

__all__ = [
    "Diagnostics",
    "ExactStatistics",
    "GradientDeviation",
    "Moments",
    "PROBE_PER_CLIENT",
    "exact_statistics",
    "gradient_deviation",
    "layer_mean",
    "norm_layers",
    "parse_schedule",
    "plot_diagnostics",
    "standardized_distance",
]
