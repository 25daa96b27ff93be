"""The reproduction report's plots: each table's curves and its bars beside the paper's figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from .report_markdown import STAT_LABEL

__all__ = ["plot_table"]


def plot_table(t: Mapping[str, Any], out: Path) -> list[Path]:
    """``plots/<table>_curves.png`` (each cell's curves, all seeds, the paper's number dashed) and
    ``plots/<table>_bars.png`` (ours mean ± std beside the paper, per column)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = out / "plots"
    folder.mkdir(parents=True, exist_ok=True)
    rows, cols = t["rows"], t["columns"]
    cells = {(c["row"], c["column"]): c for c in t["cells"]}
    written = []
    height = 1.9 * len(rows) + 1
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(2.4 * len(cols) + 1, height), squeeze=False,
                             sharex=True, sharey=True)
    for i, r in enumerate(rows):
        for j, col in enumerate(cols):
            ax = axes[i][j]
            c = cells[(r["id"], col["id"])]
            for run in c["runs"]:
                if run["curve"]:
                    xs, ys = zip(*run["curve"])
                    ax.plot(xs, ys, lw=1, label=f"seed {run['seed']}")
            if c.get("paper") is not None:
                ax.axhline(c["paper"], color="k", ls="--", lw=0.8)
            if not c["runs"]:
                ax.text(0.5, 0.5, "skipped" if c["status"] == "skipped" else "not run", ha="center", va="center",
                        transform=ax.transAxes, fontsize=8, color="gray")
            if i == 0:
                ax.set_title(col["label"], fontsize=9)
            if j == 0:
                ax.set_ylabel(f"{r['label']}\nacc (%)", fontsize=8)
            if i == len(rows) - 1:
                ax.set_xlabel("round", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
    fig.suptitle(f"{t['table']}: accuracy (%) per evaluation, every seed; dashed: the paper", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / height))  # half an inch for the title above the column titles
    path = folder / f"{t['table']}_curves.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    written.append(path)

    stat = t["compare"][0]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(cols) * max(1, len(rows)) / 3 + 2), 3.6))
    width = 0.8 / max(1, len(rows))
    for i, r in enumerate(rows):
        xs, ys, es, ps = [], [], [], []
        for j, col in enumerate(cols):
            c = cells[(r["id"], col["id"])]
            s = c["stats"].get(stat) or {}
            x = j - 0.4 + width * (i + 0.5)
            if s.get("mean") is not None:
                xs.append(x)
                ys.append(s["mean"])
                es.append(s.get("std") or 0.0)
            if c.get("paper") is not None:
                ps.append((x, c["paper"]))
        bars = ax.bar(xs, ys, width, yerr=es, capsize=2, label=r["label"])
        if ps:
            px, py = zip(*ps)
            ax.scatter(px, py, marker="_", s=160, color="k", linewidths=2, zorder=3)
    ax.set_xticks(range(len(cols)))
    ax.set_xticklabels([c["label"] for c in cols], fontsize=8)
    ax.set_ylabel(f"{STAT_LABEL[stat]} accuracy (%)")
    ax.set_title(f"{t['table']}: ours (bars, mean ± std over seeds) and the paper (black —)", fontsize=9)
    ax.legend(fontsize=7, ncol=min(4, len(rows)))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = folder / f"{t['table']}_bars.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    written.append(path)
    return written
