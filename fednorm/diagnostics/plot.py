"""Plots of the ``diag/...`` metrics of one or more runs (matplotlib Figure, no pyplot)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["plot_diagnostics", "layer_mean"]


def layer_mean(record: Mapping[str, Any], prefix: str) -> float:
    """Mean over layers of the metrics ``<prefix>/<layer>`` in one record (NaN if none)."""
    values = [v for k, v in record.items() if k.startswith(prefix + "/") and isinstance(v, (int, float))]
    return float(np.mean(values)) if values else float("nan")


def plot_diagnostics(histories: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path, title: str = "") -> Path:
    """Four panels against rounds, one curve per run (label -> metrics history): the aggregated
    statistics' and the clients' statistics' log-variance mismatch with the exact union
    statistics (mean over layers), the gradient's relative error against centralized BN, and
    the test accuracy with aggregated (solid) and recalibrated (dashed) statistics."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 7.5))
    axes = fig.subplots(2, 2).ravel()
    panels = [
        ("aggregated statistics vs exact: |log var ratio|", lambda h: layer_mean(h, "diag/stats/agg_var_logratio")),
        ("clients' statistics vs exact: |log var ratio|", lambda h: layer_mean(h, "diag/stats/client_var_logratio")),
        ("gradient vs centralized BN: relative error", lambda h: h.get("diag/grad/rel_error", np.nan)),
    ]
    for label, history in histories.items():
        rows = [h for h in history if "diag/seconds" in h]
        if not rows:
            continue
        rounds = [h["round"] for h in rows]
        for ax, (_, fn) in zip(axes, panels):
            ax.plot(rounds, [fn(h) for h in rows], marker=".", label=label)
        line = axes[3].plot(rounds, [100 * h.get("diag/acc/aggregated", np.nan) for h in rows], marker=".", label=label)[0]
        axes[3].plot(rounds, [100 * h.get("diag/acc/recalibrated", np.nan) for h in rows], ls="--", color=line.get_color())
    for ax, (name, _) in zip(axes, panels):
        ax.set_title(name, fontsize=9)
    axes[3].set_title("test accuracy (%): aggregated (solid), recalibrated (dashed)", fontsize=9)
    for ax in axes:
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path
