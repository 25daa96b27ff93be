"""Plots of run metrics (matplotlib, Agg backend: works without a display).

The run plots draw on :class:`matplotlib.figure.Figure` directly, without importing pyplot
(about 0.7 s of a short run's start-up on CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

__all__ = ["plot_accuracy", "plot_comparison", "plot_curves", "plot_histogram"]


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _figure(figsize: tuple[float, float]) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=figsize)


def plot_accuracy(history: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Test accuracy (and mean per-client accuracy) and train loss against rounds."""
    rounds = [h["round"] for h in history]
    fig = _figure((10, 4))
    ax1, ax2 = fig.subplots(1, 2)
    ax1.plot(rounds, [100 * h["test_accuracy"] for h in history], marker=".", label="test (global)")
    if any(h.get("mean_client_accuracy") is not None for h in history):
        ax1.plot(rounds, [100 * (h.get("mean_client_accuracy") or np.nan) for h in history], ls="--", label="mean per-client")
    ax1.set_xlabel("round")
    ax1.set_ylabel("accuracy (%)")
    ax1.grid(alpha=0.3)
    ax1.legend()
    ax2.plot(rounds, [h["train_loss"] for h in history], marker=".", label="train")
    ax2.plot(rounds, [h["test_loss"] for h in history], marker=".", label="test")
    ax2.set_xlabel("round")
    ax2.set_ylabel("loss")
    ax2.set_yscale("log")
    ax2.grid(alpha=0.3)
    ax2.legend()
    if title:
        fig.suptitle(title)
    # Fixed margins that fit these labels: tight_layout measured every text first, a third of
    # the plot's time (0.4 s of a one-round run on a loaded core).
    fig.subplots_adjust(left=0.07, right=0.985, bottom=0.13, top=0.88 if title else 0.95, wspace=0.3)
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def plot_curves(curves: dict[str, tuple[Sequence[int], Sequence[float], Sequence[float] | None]], path: str | Path,
                title: str = "", ylabel: str = "test accuracy (%)") -> Path:
    """One curve per label: (rounds, values, a ±band or ``None``); values in the units shown."""
    fig = _figure((7, 4.5))
    ax = fig.subplots()
    for label, (rounds, values, band) in curves.items():
        (line,) = ax.plot(rounds, values, marker=".", label=label)
        if band is not None:
            ax.fill_between(rounds, [v - b for v, b in zip(values, band)], [v + b for v, b in zip(values, band)],
                            color=line.get_color(), alpha=0.2)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def plot_comparison(histories: dict[str, Sequence[dict[str, Any]]], path: str | Path, title: str = "") -> Path:
    """One test-accuracy curve per variant."""
    return plot_curves({label: ([h["round"] for h in history], [100 * h["test_accuracy"] for h in history], None)
                        for label, history in histories.items()}, path, title)


def plot_histogram(hist: np.ndarray, path: str | Path, title: str = "") -> Path:
    """Stacked bars of each client's label counts."""
    from matplotlib import colormaps

    num_clients, num_classes = hist.shape
    fig = _figure((max(6, 0.35 * num_clients + 2), 4))
    ax = fig.subplots()
    bottom = np.zeros(num_clients)
    cmap = colormaps["tab10" if num_classes <= 10 else "tab20"]
    for c in range(num_classes):
        ax.bar(np.arange(num_clients), hist[:, c], bottom=bottom, color=cmap(c % cmap.N), label=str(c), width=0.85)
        bottom += hist[:, c]
    ax.set_xlabel("client")
    ax.set_ylabel("samples")
    if num_classes <= 20:
        ax.legend(title="class", bbox_to_anchor=(1.01, 1), loc="upper left", fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path
