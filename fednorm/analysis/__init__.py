"""Analysis tools of the LN paper (Zhang et al., 2024, Sec. 4.3): feature vs class-embedding norms,
feature collapse, local overfitting on a one-class client, and ``fednorm analyze RUN_DIR``."""

from .metrics import (
    class_embedding_norms,
    collapse_report,
    effective_rank,
    extract_features,
    local_overfitting,
    norm_report,
    per_class_accuracy,
    sample_per_class,
    singular_values,
    toggle_feature_norm,
)
from .run import analyze_run, format_table, pick_one_class_client

__all__ = [
    "class_embedding_norms",
    "collapse_report",
    "effective_rank",
    "extract_features",
    "local_overfitting",
    "norm_report",
    "per_class_accuracy",
    "sample_per_class",
    "singular_values",
    "toggle_feature_norm",
    "analyze_run",
    "format_table",
    "pick_one_class_client",
]
