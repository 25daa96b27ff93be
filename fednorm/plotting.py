"""Plots of run metrics (matplotlib, Agg backend: works without a display).

The run plots draw on :class:`matplotlib.figure.Figure` directly, without importing pyplot
(about 0.7 s of a short run's start-up on CPU). Conventions every plot of fednorm follows:
accuracy in percent, a round (or client) axis with whole-number ticks only
(:func:`integer_ticks`), and legends of long or many labels below the axes with the figure
saved to fit them (:func:`legend_below`), so no entry is clipped; curves beyond ten differ in
marker and line style as well as colour (:func:`curve_style`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

__all__ = ["curve_style", "curves_figure", "integer_ticks", "legend_below", "plot_accuracy", "plot_comparison", "plot_curves",
           "plot_histogram"]

LEGEND_WRAP = 48  # characters per legend line: a longer label wraps rather than widening the figure
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_LINESTYLES = ("-", "--", "-.", ":")


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _figure(figsize: tuple[float, float]) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=figsize)


def integer_ticks(ax: Any, axis: str = "x") -> None:
    """Ticks at whole numbers only on ``axis`` (rounds, clients): matplotlib's default puts ticks
    at 1.5 and 2.5 on a two-round run."""
    from matplotlib.ticker import MaxNLocator

    # steps 1, 2, 5, 10: ticks at 0, 50, 100 rather than the 0, 60, 120 integer=True alone picks
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))


def curve_style(i: int) -> dict[str, Any]:
    """The ``i``-th curve's colour, marker and line style: tab10's colours repeat after ten
    curves, so the marker (8) and, after 40 curves, the line style tell them apart."""
    from matplotlib import colormaps

    return {"color": colormaps["tab10"](i % 10), "marker": _MARKERS[i % len(_MARKERS)],
            "linestyle": _LINESTYLES[(i // 40) % len(_LINESTYLES)]}


def _wrap(label: str, width: int = LEGEND_WRAP) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(label, width, break_on_hyphens=False)) or label


def legend_below(fig: Any, handles: Sequence[Any], labels: Sequence[str], *, fontsize: float = 8) -> Any:
    """A figure legend under the plots, labels wrapped at :data:`LEGEND_WRAP` characters, in as
    many columns as fit the figure's width; save with ``bbox_inches="tight"`` so it is kept whole
    (a legend inside the axes hid curves, and one to the side was cut off at the figure's edge)."""
    labels = [_wrap(label) for label in labels]
    longest = max((len(line) for label in labels for line in label.splitlines()), default=1)
    width_chars = fig.get_figwidth() * 72 / (0.55 * fontsize)  # characters of this font that fit the figure
    ncol = max(1, min(len(labels), int(width_chars // (longest + 6))))
    return fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol, fontsize=fontsize, frameon=False)


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
    integer_ticks(ax1)
    integer_ticks(ax2)
    if title:
        fig.suptitle(title)
    # Fixed margins that fit these labels: tight_layout measured every text first, a third of
    # the plot's time (0.4 s of a one-round run on a loaded core).
    fig.subplots_adjust(left=0.07, right=0.985, bottom=0.13, top=0.88 if title else 0.95, wspace=0.3)
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def curves_figure(curves: dict[str, tuple[Sequence[int], Sequence[float], Sequence[float] | None]], title: str = "",
                  ylabel: str = "test accuracy (%)") -> Any:
    """The figure of :func:`plot_curves`, unsaved (save it with ``bbox_inches="tight"``)."""
    fig = _figure((7, 4.5))
    ax = fig.subplots()
    for i, (label, (rounds, values, band)) in enumerate(curves.items()):
        style = curve_style(i)
        ax.plot(rounds, values, markersize=4, markevery=max(1, len(rounds) // 15), label=label, **style)
        if band is not None:
            ax.fill_between(rounds, [v - b for v, b in zip(values, band)], [v + b for v, b in zip(values, band)],
                            color=style["color"], alpha=0.15)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    integer_ticks(ax)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    if curves:
        legend_below(fig, *ax.get_legend_handles_labels())
    return fig


def plot_curves(curves: dict[str, tuple[Sequence[int], Sequence[float], Sequence[float] | None]], path: str | Path,
                title: str = "", ylabel: str = "test accuracy (%)") -> Path:
    """One curve per label: (rounds, values, a ±band or ``None``); values in the units shown.
    The legend goes under the plot (:func:`legend_below`), every label whole."""
    path = Path(path)
    curves_figure(curves, title, ylabel).savefig(path, dpi=110, bbox_inches="tight")
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
    integer_ticks(ax)
    integer_ticks(ax, "y")
    if num_classes <= 20:
        ax.legend(title="class", bbox_to_anchor=(1.01, 1), loc="upper left", fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the legend right of the axes is kept whole
    return path
