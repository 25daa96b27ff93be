"""HBN's toy (Chen et al., 2025, Sec. 3.1, Fig. 2): two 2-D clusters under local, global and hybrid normalisation.

The two clusters stand for the activations of two clients (as drawn in Fig. 2 and the authors'
README): cluster 1 has 300 points ``N((5, 5), 0.4²·I₂)``, cluster 2 has 200 points
``N((−1, −1), 1.2²·I₂)``. Each scheme normalises every coordinate (a "channel") of a cluster, with no affine parameters:

* **local** (Fig. 2b): ``nn.BatchNorm1d`` in training mode on the cluster alone (its batch
  statistics), what BN/GN/LN do on a client;
* **global** (Fig. 2c): the statistics of both clusters pooled with HBN's server rule (Eq. 8:
  :func:`~fednorm.nn.functional.pooled_stats`, Bessel's ``N − 1``), applied by
  :class:`~fednorm.nn.hbn.HybridBatchNorm1d` in evaluation mode;
* **hybrid** (Fig. 2d, Eq. 9): :class:`~fednorm.nn.hbn.HybridBatchNorm1d` in training mode with
  those global statistics and a fixed batch weight ``w = sigmoid(−α)``: 0.7 for cluster 1 and 0.3
  for cluster 2 (the figure's mix; HBN learns ``α`` per client).

The paper's point, as numbers (:func:`cluster_report`): local normalisation gives each cluster
zero mean and unit variance, so the two overlap (their centres coincide: *separation* 0); global
normalisation keeps them apart but keeps their sizes unequal (the *size ratio*, cluster 2's std
over cluster 1's, stays at the raw 3); hybrid normalisation brings the sizes closer (ratio nearer
1) while the clusters stay apart and in their raw order ("standardise the size of two clusters
while maintaining the global structure"). *Separation* is the distance between the normalised
centres over the pooled within-cluster std (the RMS of the two clusters' per-coordinate stds).

Choices not in the paper: ε = 1e-5 (the layers' default; local normalisation gives each cluster
zero mean and variance ``σ²/(σ² + ε)``, 1 − 6e-5 at worst here), the global statistics of Eq. 8
(N − 1, as HBN's server), fresh draws per seed. Run ``python -m fednorm.analysis.hbn_toy --out DIR --seeds 3``
for ``hbn_toy.json``, ``hbn_toy.md`` and ``hbn_toy.png``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from ..nn.functional import pooled_stats
from ..nn.hbn import HybridBatchNorm1d, batch_moments
from .toy_cli import toy_parser, write_toy_records

__all__ = ["SCHEMES", "Cluster", "CLUSTERS", "draw_clusters", "global_statistics", "normalise", "cluster_report",
           "toy_table", "plot_toy", "main"]

#: The normalisations compared, each client by its own statistics, by the pooled ones, or by HBN's mix.
SCHEMES = ("local", "global", "hybrid")
EPS = 1e-5


@dataclass(frozen=True)
class Cluster:
    """One client's activations: ``count`` points ``N(centre, std²·I₂)``; ``batch_weight`` is its
    hybrid mix's weight on the batch (local) statistics, Eq. 9's ``sigmoid(−α)``."""

    count: int
    centre: tuple[float, float]
    std: float
    batch_weight: float


#: Fig. 2's two clients' clusters (count, centre, std, hybrid batch weight), as the spec reads the figure.
CLUSTERS = (Cluster(300, (5.0, 5.0), 0.4, 0.7), Cluster(200, (-1.0, -1.0), 1.2, 0.3))  # spec/000_hbn.md §4 item 11


def draw_clusters(seed: int = 0, clusters: Sequence[Cluster] = CLUSTERS) -> list[torch.Tensor]:
    """One ``[count, 2]`` float64 tensor per cluster."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.tensor(c.centre, dtype=torch.float64) + c.std * torch.randn(c.count, 2, generator=gen, dtype=torch.float64)
            for c in clusters]


def global_statistics(points: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """HBN Eq. 8: the clusters' local (biased) moments pooled into the union's mean and Bessel variance."""
    moments = [batch_moments(x) for x in points]
    count = torch.tensor([float(len(x)) for x in points], dtype=torch.float64)
    _, mean, var = pooled_stats(count, torch.stack([m for m, _ in moments]), torch.stack([v for _, v in moments]), unbiased=True)
    return mean, var


def _hbn(global_mean: torch.Tensor, global_var: torch.Tensor, batch_weight: float) -> HybridBatchNorm1d:
    layer = HybridBatchNorm1d(2, eps=EPS, affine=False, dtype=torch.float64)
    with torch.no_grad():
        layer.running_mean.copy_(global_mean)  # type: ignore[union-attr]
        layer.running_var.copy_(global_var)  # type: ignore[union-attr]
        layer.alpha.fill_(math.log((1.0 - batch_weight) / batch_weight))  # sigmoid(−α) = batch_weight
    return layer


def normalise(points: Sequence[torch.Tensor], scheme: str, clusters: Sequence[Cluster] = CLUSTERS) -> list[torch.Tensor]:
    """Each cluster normalised by ``scheme`` (``local``, ``global`` or ``hybrid``) with fednorm's layers."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    g_mean, g_var = global_statistics(points)
    out = []
    with torch.no_grad():
        for x, c in zip(points, clusters):
            if scheme == "local":
                layer: nn.Module = nn.BatchNorm1d(2, eps=EPS, affine=False, dtype=torch.float64).train()
            elif scheme == "global":
                layer = _hbn(g_mean, g_var, c.batch_weight).eval()  # evaluation mode: the global statistics only
            else:
                layer = _hbn(g_mean, g_var, c.batch_weight).train()  # training mode: Eq. 9's mix, then Eq. 10
            out.append(layer(x))
    return out


def cluster_report(points: Sequence[torch.Tensor]) -> dict:
    """Per cluster: mean, per-coordinate (biased) std, distance of the mean from 0 and the largest
    ``|std − 1|``; for the pair: centre distance, separation (centre distance over the RMS of the
    clusters' stds) and size ratio (cluster 2's RMS std over cluster 1's)."""
    per = []
    for x in points:
        mean, var = x.mean(0), x.var(0, unbiased=False)
        per.append({"mean": mean.tolist(), "std": var.sqrt().tolist(), "mean_offset": float(mean.norm()),
                    "std_offset": float((var.sqrt() - 1).abs().max()), "rms_std": float(var.mean().sqrt())})
    a, b = points[0].mean(0), points[1].mean(0)
    distance = float((a - b).norm())
    pooled = math.sqrt((per[0]["rms_std"] ** 2 + per[1]["rms_std"] ** 2) / 2)
    return {"clusters": per, "centre_distance": distance, "separation": distance / pooled,
            "size_ratio": per[1]["rms_std"] / per[0]["rms_std"], "order_kept": bool(((a - b) > 0).all())}


def _summary(values: Sequence[float]) -> dict:
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return {"per_seed": list(values), "mean": mean, "std": sd}


_QUANTITIES = ("separation", "size_ratio", "centre_distance")


def toy_table(seeds: Sequence[int] = (0, 1, 2)) -> dict:
    """Per scheme (and the raw points): each seed's report, and mean ± sample std of separation,
    size ratio, centre distance and each cluster's mean offset / std offset / RMS std."""
    table: dict = {"seeds": list(seeds), "clusters": [c.__dict__ for c in CLUSTERS], "eps": EPS, "rows": []}
    reports: dict[str, list[dict]] = {k: [] for k in ("raw", *SCHEMES)}
    for s in seeds:
        points = draw_clusters(s)
        reports["raw"].append(cluster_report(points))
        for scheme in SCHEMES:
            reports[scheme].append(cluster_report(normalise(points, scheme)))
    for key, runs in reports.items():
        row: dict = {"scheme": key, "order_kept": all(r["order_kept"] for r in runs)}
        for q in _QUANTITIES:
            row[q] = _summary([r[q] for r in runs])
        for i in range(len(CLUSTERS)):
            for q in ("mean_offset", "std_offset", "rms_std"):
                row[f"cluster{i + 1}_{q}"] = _summary([r["clusters"][i][q] for r in runs])
        row["reports"] = runs
        table["rows"].append(row)
    return table


def _markdown(table: dict) -> str:
    lines = ["| points | separation | size ratio (2/1) | cluster 1: ‖mean‖, RMS std | cluster 2: ‖mean‖, RMS std | order kept |",
             "|---|---:|---:|---|---|---|"]
    for row in table["rows"]:
        cells = [f"{row[q]['mean']:.3f} ± {row[q]['std']:.3f}" for q in ("separation", "size_ratio")]
        for i in (1, 2):
            cells.append(f"{row[f'cluster{i}_mean_offset']['mean']:.3f}, {row[f'cluster{i}_rms_std']['mean']:.3f}")
        lines.append(f"| {row['scheme']} | " + " | ".join(cells) + f" | {'yes' if row['order_kept'] else 'no'} |")
    lines.append("")
    lines.append(f"Mean ± sample std over {len(table['seeds'])} seeds (the clusters' ‖mean‖ and RMS std: means). Separation: "
                 "distance between the cluster centres over the RMS of the two clusters' stds; size ratio: cluster 2's std "
                 "over cluster 1's (raw 1.2/0.4 = 3).")
    return "\n".join(lines) + "\n"


def plot_toy(points: Sequence[torch.Tensor], path: str | Path) -> Path:
    """Fig. 2's four panels: raw points, local, global and hybrid normalisation (one seed)."""
    from matplotlib.figure import Figure

    panels = {"raw points (Fig. 2a)": list(points)}
    titles = {"local": "local normalisation (Fig. 2b)", "global": "global normalisation (Fig. 2c)",
              "hybrid": "hybrid, w = 0.7 / 0.3 (Fig. 2d)"}
    for scheme in SCHEMES:
        panels[titles[scheme]] = normalise(points, scheme)
    fig = Figure(figsize=(14, 3.6))
    axes = fig.subplots(1, 4)
    for ax, (title, pts) in zip(axes, panels.items()):
        report = cluster_report(pts)
        for i, x in enumerate(pts):
            ax.scatter(x[:, 0], x[:, 1], s=5, alpha=0.5, color=f"C{i}", label=f"cluster {i + 1}")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(f"separation {report['separation']:.2f}, size ratio {report['size_ratio']:.2f}", fontsize=8)
        ax.set_aspect("equal", adjustable="datalim")
    axes[0].legend(fontsize=8)
    fig.suptitle("HBN toy: cluster 1 (300 points, std 0.4), cluster 2 (200 points, std 1.2), seed 0", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fednorm.analysis.hbn_toy``: the table over ``--seeds`` seeds, printed and written to ``--out``."""
    args = toy_parser("hbn_toy", __doc__).parse_args(argv)
    table = toy_table(list(range(args.seeds)))
    plot = None if args.no_plot else (lambda path: plot_toy(draw_clusters(0), path))
    return write_toy_records("hbn_toy", args.out, table, _markdown, plot, argv)


if __name__ == "__main__":
    raise SystemExit(main())
