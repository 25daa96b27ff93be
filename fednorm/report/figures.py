"""The report's figures, as PNG files beside ``report.md`` (``report.html`` embeds the same files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..plotting import _figure, curve_style, integer_ticks, legend_below, plot_histogram
from ..seeds import plot_seed_comparison
from .collect import Variant

__all__ = ["Figure", "curve_figures", "diagnostic_curves", "diagnostics_figure", "domain_figure", "partition_figures"]

MAX_PARTITIONS = 4  # label-distribution plots per report (a compare over 3 seeds has 3 partitions)


class Figure:
    """A figure file and its caption."""

    def __init__(self, path: Path, caption: str) -> None:
        self.path, self.caption = path, caption


def _setting(config: dict[str, Any]) -> str:
    """The data a variant trains on (one curve figure each): dataset, partition and its skew, clients."""
    skew = {"dirichlet": f"dirichlet alpha={config.get('alpha')}", "quantity": f"quantity alpha={config.get('alpha')}",
            "dirichlet_client": f"dirichlet per client alpha={config.get('alpha')}",
            "classes": f"classes, {config.get('classes_per_client')} classes/client", "gamma": f"gamma={config.get('gamma')}"}
    part = str(config.get("partition"))
    n = config.get("num_clients")
    return f"{config.get('dataset')}, {skew.get(part, part)}, {n} client{'' if n == 1 else 's'}"


def curve_figures(variants: list[Variant], out: Path) -> list[Figure]:
    """Test accuracy against rounds, mean ± std over each variant's completed runs; one figure
    per setting (dataset, partition, clients)."""
    by_setting: dict[str, list[Variant]] = {}
    for v in variants:
        if any(r.history for r in v.completed):
            by_setting.setdefault(_setting(v.config), []).append(v)
    figures = []
    for i, (setting, group) in enumerate(by_setting.items()):
        path = out / f"curves_{i}.png"
        histories = {v.label: {j: r.history for j, r in enumerate(v.completed) if r.history} for v in group}
        plot_seed_comparison(histories, path, title=setting)
        n = sorted({len(h) for h in histories.values()})
        runs = f"{n[0]}" if len(n) == 1 else f"{n[0]}–{n[-1]}"
        figures.append(Figure(path, f"Test accuracy per round on {setting}: mean over {runs} run(s) per variant, "
                                    "band ± sample std."))
    return figures


def domain_figure(variants: list[Variant], out: Path) -> Figure | None:
    """Grouped bars: each variant's final accuracy per data source (feature-shift runs), ± std."""
    rows = [(v, {k[len("final_accuracy["):-1]: st for k, st in v.stats.items() if k.startswith("final_accuracy[")})
            for v in variants]
    rows = [(v, d) for v, d in rows if d]
    if not rows:
        return None
    sources = sorted({s for _, d in rows for s in d})
    fig = _figure((max(6.0, 1.1 * len(sources) * max(1, len(rows)) / 2 + 3), 4.5))
    ax = fig.subplots()
    width = 0.8 / len(rows)
    x = np.arange(len(sources))
    hatches = ("", "//", "..", "xx")  # past ten variants tab10's colours repeat: the hatch tells them apart
    for i, (v, d) in enumerate(rows):
        means = [100 * d[s].mean if s in d else np.nan for s in sources]
        stds = [100 * d[s].std if s in d else 0.0 for s in sources]
        ax.bar(x + (i - (len(rows) - 1) / 2) * width, means, width, yerr=stds, capsize=3, label=v.label,
               color=curve_style(i)["color"], hatch=hatches[(i // 10) % len(hatches)], edgecolor="white")
    ax.set_xticks(x, sources)
    ax.set_ylabel("final accuracy (%), clients' own test splits")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    legend_below(fig, *ax.get_legend_handles_labels())
    path = out / "domains.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return Figure(path, "Final accuracy per data source: the mean over the source's clients' own test accuracies, "
                        "mean ± std over runs.")


def partition_figures(variants: list[Variant], out: Path) -> list[Figure]:
    """Each distinct partition's per-client label counts (from the runs' ``partition.json``)."""
    seen: dict[str, list[str]] = {}
    records: dict[str, dict[str, Any]] = {}
    for v in variants:
        for r in v.runs:
            if r.partition is None:
                continue
            key = repr((r.partition.get("dataset"), r.partition.get("train_label_counts")))
            records.setdefault(key, r.partition)
            if v.label not in seen.setdefault(key, []):
                seen[key].append(v.label)
    figures = []
    for i, (key, rec) in enumerate(list(records.items())[:MAX_PARTITIONS]):
        path = out / f"partition_{i}.png"
        cfg = next(r.config for v in variants for r in v.runs if r.partition is not None
                   and repr((r.partition.get("dataset"), r.partition.get("train_label_counts"))) == key)
        detail = {"dirichlet": f"alpha={cfg.get('alpha')}", "classes": f"{cfg.get('classes_per_client')} classes per client",
                  "gamma": f"gamma={cfg.get('gamma')}"}.get(str(rec.get("partition")), "")
        title = f"{rec.get('dataset')}: {rec.get('partition')} {detail}, seed {rec.get('seed')}".replace("  ", " ")
        plot_histogram(np.asarray(rec["train_label_counts"]), path, title=title)
        used = seen[key]
        users = ", ".join(used[:6]) + (f" and {len(used) - 6} more" if len(used) > 6 else "")
        sources = rec.get("client_sources")
        src = f" Clients' sources: {', '.join(f'{c}={s}' for c, s in enumerate(sources))}." if sources else ""
        figures.append(Figure(path, f"Training labels per client, {title} (used by {users}).{src}"))
    if len(records) > MAX_PARTITIONS:
        figures[-1].caption += f" {len(records) - MAX_PARTITIONS} more partition(s) not shown."
    return figures


#: The diagnostics the report compares across variants (``--diagnostics``, fednorm.diagnostics):
#: (metric or prefix averaged over layers, panel title).
DIAGNOSTIC_PANELS = (
    ("diag/grad/cosine", "gradient cosine to centralized BN (1 = none)"),
    ("diag/acc/gap", "accuracy gained by recalibrating the statistics (percentage points)"),
    ("diag/stats/agg_mean_shift/", "aggregated running mean vs the union's, in sigma (layer mean)"),
    ("diag/stats/client_mean_shift/", "clients' batch means vs the union's, in sigma (layer mean)"),
)

PERCENT_PANELS = ("diag/acc/gap",)  # accuracy differences, recorded as fractions, drawn in percentage points


def _diag_value(row: dict[str, Any], key: str) -> float | None:
    """A diagnostic of one evaluation: the metric itself, or for a ``.../`` prefix the mean over layers."""
    if not key.endswith("/"):
        v = row.get(key)
        return float(v) if isinstance(v, (int, float)) else None
    values = [float(v) for k, v in row.items() if k.startswith(key) and isinstance(v, (int, float))]
    return float(np.mean(values)) if values else None


def diagnostic_curves(variants: list[Variant]) -> dict[str, list[tuple[str, list[int], list[float]]]]:
    """Per panel of :data:`DIAGNOSTIC_PANELS`: (variant label, rounds, values) for every variant
    that recorded it, the values the mean over its completed runs at the rounds all of them have."""
    curves: dict[str, list[tuple[str, list[int], list[float]]]] = {key: [] for key, _ in DIAGNOSTIC_PANELS}
    for v in variants:
        for key, _ in DIAGNOSTIC_PANELS:
            per_run = []
            for r in v.completed:
                points = {row["round"]: _diag_value(row, key) for row in r.history if "round" in row}
                per_run.append({k: x for k, x in points.items() if x is not None})
            common = sorted(set.intersection(*(set(p) for p in per_run))) if per_run else []
            if common:
                curves[key].append((v.label, common, [float(np.mean([p[k] for p in per_run])) for k in common]))
    return curves


def diagnostics_figure(variants: list[Variant], out: Path) -> Figure | None:
    """The normalization diagnostics of every variant that recorded them, one panel per
    diagnostic (:func:`diagnostic_curves`); ``None`` when no run recorded any."""
    curves = diagnostic_curves(variants)
    panels = [(key, title) for key, title in DIAGNOSTIC_PANELS if curves[key]]
    if not panels:
        return None
    fig = _figure((5.0 * len(panels), 4.0))
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    order = {v.label: i for i, v in enumerate(variants)}  # a variant keeps its style in every panel
    handles: dict[str, Any] = {}
    for ax, (key, title) in zip(axes, panels):
        scale = 100.0 if key in PERCENT_PANELS else 1.0
        for label, rounds, values in curves[key]:
            (handles[label],) = ax.plot(rounds, [scale * v for v in values], markersize=3, label=label, **curve_style(order[label]))
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("round")
        integer_ticks(ax)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    ordered = sorted(handles, key=order.__getitem__)
    legend_below(fig, [handles[label] for label in ordered], ordered)
    path = out / "diagnostics.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return Figure(path, "Normalization diagnostics (--diagnostics; docs/diagnostics.md), mean over each variant's "
                        "completed runs: how far the clients' gradient is from centralized BN's, the accuracy a "
                        "statistics recalibration would add, and how far the aggregated and the clients' means are "
                        "from the exact statistics of the union of the clients' data.")
