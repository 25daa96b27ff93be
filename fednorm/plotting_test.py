"""Every plot of fednorm (fednorm.plotting, fednorm.report.figures): rounds and clients on
whole-number ticks, accuracy in percent, and legends of long or many labels kept whole, below
the plot, with every entry drawn differently."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fednorm.plotting as plotting
import fednorm.report.figures as report_figures
from fednorm.report.collect import Run, group_runs


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every matplotlib figure the plot functions make (they save and drop them)."""
    made: list[Any] = []
    real = plotting._figure

    def keep(figsize: tuple[float, float]) -> Any:
        made.append(real(figsize))
        return made[-1]

    monkeypatch.setattr(plotting, "_figure", keep)
    monkeypatch.setattr(report_figures, "_figure", keep)
    return made


def _drawn(fig: Any) -> Any:
    """``fig`` drawn on an Agg canvas (a pyplot-free Figure has none): ticks and extents as saved."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    return fig


def _integer_axes(fig: Any) -> list[tuple[str, list[float]]]:
    """(label, ticks inside the view) of each round or client axis of ``fig``."""
    _drawn(fig)
    out = []
    for ax in fig.axes:
        for label, axis, lim in ((ax.get_xlabel(), ax.xaxis, ax.get_xlim()), (ax.get_ylabel(), ax.yaxis, ax.get_ylim())):
            if label in ("round", "client"):
                out.append((label, [t for t in axis.get_majorticklocs() if lim[0] <= t <= lim[1]]))
    return out


def _history(rounds: int = 2) -> list[dict[str, Any]]:
    return [{"round": r, "test_accuracy": 0.3 + 0.1 * r, "test_loss": 1.0 / r, "train_loss": 1.2 / r, "mean_client_accuracy": 0.5,
             "diag/grad/cosine": 0.9, "diag/acc/gap": 0.02 * r} for r in range(1, rounds + 1)]


def test_round_and_client_axes_have_integer_ticks_in_every_plot(tmp_path: Path, figures: list[Any]) -> None:
    """Two rounds are the case that drew ticks at 1.25, 1.5, 1.75: every plot, each its round
    (or client) axis, only whole numbers."""
    plotting.plot_accuracy(_history(), tmp_path / "a.png")
    plotting.plot_comparison({"fedavg+bn": _history(), "fedbn+bn": _history()}, tmp_path / "c.png")
    plotting.plot_histogram(np.array([[3, 1, 0], [0, 2, 2]]), tmp_path / "h.png")
    runs = [Run(tmp_path / f"r{i}", {"method": m, "norm": "bn", "dataset": "digits", "seed": 0},
                {"status": "completed", "final_test_accuracy": 0.5, "final_accuracy[mnist]": 0.6}, _history())
            for i, m in enumerate(("fedavg", "fedbn"))]
    variants = group_runs(runs)
    report_figures.curve_figures(variants, tmp_path)
    report_figures.diagnostics_figure(variants, tmp_path)
    checked = [(label, ticks) for fig in figures for label, ticks in _integer_axes(fig)]
    assert {label for label, _ in checked} == {"round", "client"} and len(checked) >= 6, checked
    for label, ticks in checked:
        assert ticks and all(float(t).is_integer() for t in ticks), (label, ticks)


def test_diagnostics_accuracy_gap_is_drawn_in_percent(tmp_path: Path, figures: list[Any]) -> None:
    runs = [Run(tmp_path / "r", {"method": "fedavg", "norm": "bn", "seed": 0}, {"status": "completed"}, _history(3))]
    report_figures.diagnostics_figure(group_runs(runs), tmp_path)
    gap = next(ax for ax in figures[0].axes if "recalibrating" in ax.get_title())
    assert "percentage points" in gap.get_title()
    np.testing.assert_allclose(gap.lines[0].get_ydata(), [2.0, 4.0, 6.0])  # 0.02 * round, in percentage points


def _png_size(path: Path) -> tuple[int, int]:
    return struct.unpack(">II", path.read_bytes()[16:24])


def test_a_legend_of_many_long_labels_is_kept_whole_below_the_plot(tmp_path: Path) -> None:
    """Twelve curves with labels of 60–90 characters: the legend sits under the axes, the saved
    file holds all of it, every label is there in full (wrapped, not cut), and no two curves share
    colour, marker and line style."""
    labels = [f"fedavg+bn (partition=dirichlet, alpha=0.{i}, rounds=500, method_args.mode=round_average_{i})"[: 60 + 3 * i]
              for i in range(12)]
    curves = {label: ([1, 2, 3], [10.0 + i, 20.0 + i, 30.0 + i], [1.0, 1.0, 1.0]) for i, label in enumerate(labels)}
    fig = _drawn(plotting.curves_figure(curves, title="digits"))
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    assert [" ".join(t.get_text().split("\n")) for t in legend.get_texts()] == labels
    ax = fig.axes[0]
    below = legend.get_window_extent(renderer)
    assert below.y1 <= ax.get_window_extent(renderer).y0  # under the axes: no curve hidden behind it
    assert below.y0 < 0  # past the figure's own canvas: only a tight save keeps it ...
    path = plotting.plot_curves(curves, tmp_path / "c.png", title="digits")
    width, height = _png_size(path)
    assert height >= (fig.bbox.height - below.y0) * 110 / fig.dpi - 2  # ... and the file holds it all
    assert width >= below.width * 110 / fig.dpi - 2
    styles = {(line.get_color(), line.get_marker(), line.get_linestyle()) for line in ax.lines}
    assert len(styles) == 12
