"""FBN's 2-D toy (Guerraoui et al., 2024, Sec. 3-4, Figs. 1-2): BatchNorm on raw inputs, no training.

n = 10 clients; client i's class has mean ``μ_i = 10·(cos(2π(i−1)/10), sin(2π(i−1)/10))`` and
covariance ``s²·I₂`` (s² = 1); each round every client draws m = 30 fresh points and one "layer",
a BatchNorm without affine parameters, normalises them. Heterogeneity is γ-similarity (the
paper's Fig. 2c levels are not recoverable from its text; our choice):
each point comes from a uniformly random class with probability γ, else from its client's own
class, so γ = 0 is the paper's one-class-per-client setting of Figs. 1, 2a-b.

Each scheme normalises the clients' points with fednorm's own layers (β = 0.1 for all, as the
paper):

* **centralized** (the reference): ``nn.BatchNorm1d`` in training mode on the union of the
  clients' batches (``n·m`` points), i.e. with the union's batch statistics;
* **naive** BN: each client's ``nn.BatchNorm1d`` in training mode on its own batch (its local
  batch statistics), the running statistics averaged over the clients after each round
  (FedAvg's buffer average);
* **FixBN**: naive BN up to ``switch_round`` (T/2, the FBN paper's App. C.1), then every client's
  BatchNorm in evaluation mode with the averaged running statistics of that round, frozen;
* **FBN**: :class:`~fednorm.nn.fbn.FederatedBatchNorm1d`, which normalises with the shared running
  statistics (initialised to (0, 1)); each round the clients' batch statistics are recorded
  (:func:`~fednorm.nn.fbn.recording_fbn_statistics`) and aggregated with
  :func:`~fednorm.nn.fbn.fbn_aggregate` (Eq. 9-10), the FBN method's server rule.

The normalisation error of a scheme in a round is the mean over the ``n·m`` points of the
Euclidean distance between the point as the scheme normalised it and as centralized BN did; Fig. 2c
averages it over the 100 rounds. Run ``python -m fednorm.analysis.fbn_toy --out DIR`` for the
table (``fbn_toy.json``, ``fbn_toy.md``) and the figure (``fbn_toy.png``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from ..nn.fbn import FederatedBatchNorm1d, fbn_aggregate, fbn_local_update, recording_fbn_statistics
from .toy_cli import toy_parser, write_toy_records

__all__ = ["METHODS", "ToyResult", "class_means", "draw_round", "run_toy", "error_table", "plot_toy", "main"]

#: The normalisations compared on the toy (FBN, FixBN, and naive BN with each client on its own batch's statistics).
METHODS = ("fbn", "fixbn", "naive")
GAMMAS = (1.0, 0.5, 0.1, 0.0)  # spec/002_fbn.md §5's recommended levels


def class_means(num_clients: int = 10, radius: float = 10.0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``[n, 2]``: ``μ_i = radius·(cos(2π(i−1)/n), sin(2π(i−1)/n))``, the paper's class means."""
    angle = 2 * math.pi * torch.arange(num_clients, dtype=dtype) / num_clients
    return radius * torch.stack([torch.cos(angle), torch.sin(angle)], dim=1)


def draw_round(
    generator: torch.Generator, gamma: float, means: torch.Tensor, points: int = 30, std: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """One round's batches: ``x [n, m, 2]`` and the class of each point ``[n, m]``.

    Client i's point is of class i, or with probability ``gamma`` of a uniformly random class
    (γ-similarity); it is ``μ_class + std·z`` with ``z ~ N(0, I₂)``.
    """
    n = len(means)
    own = torch.arange(n).unsqueeze(1).expand(n, points)
    mixed = torch.rand(n, points, generator=generator, dtype=torch.float64) < gamma
    random_class = torch.randint(n, (n, points), generator=generator)
    cls = torch.where(mixed, random_class, own)
    z = torch.randn(n, points, 2, generator=generator, dtype=means.dtype)
    return means[cls] + std * z, cls


@dataclass
class ToyResult:
    """Per-round normalisation errors of each scheme, and the last round's points."""

    gamma: float
    errors: dict[str, list[float]] = field(default_factory=dict)  # scheme -> error per round
    points: torch.Tensor | None = None  # [n, m, 2] raw points of the last round
    classes: torch.Tensor | None = None  # [n, m]
    normalised: dict[str, torch.Tensor] = field(default_factory=dict)  # scheme (and "centralized") -> [n, m, 2]
    running: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)  # scheme -> final (mean, var)

    def mean_error(self, method: str) -> float:
        e = self.errors[method]
        return sum(e) / len(e)


def _bn(beta: float, eps: float) -> nn.BatchNorm1d:
    return nn.BatchNorm1d(2, eps=eps, momentum=beta, affine=False, dtype=torch.float64)


def _error(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean Euclidean distance between corresponding points of ``[..., 2]`` tensors."""
    return float((a - b).norm(dim=-1).mean())


def run_toy(
    gamma: float,
    *,
    rounds: int = 100,
    num_clients: int = 10,
    points: int = 30,
    std: float = 1.0,
    beta: float = 0.1,
    eps: float = 1e-5,
    switch_round: int | None = None,
    seed: int = 0,
) -> ToyResult:
    """The toy at one heterogeneity level: every scheme normalises the same draws each round.

    ``switch_round``: FixBN's last naive round (default ``rounds // 2``).
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    if rounds < 1 or num_clients < 1 or points < 2:
        raise ValueError("rounds and num_clients must be positive and points at least 2 (BatchNorm needs 2 values)")
    switch = rounds // 2 if switch_round is None else switch_round
    gen = torch.Generator().manual_seed(seed)
    means = class_means(num_clients)
    central = _bn(beta, eps).train()
    fixbn_state = _bn(beta, eps)  # the global (server) copy: running statistics averaged over clients
    fbn = FederatedBatchNorm1d(2, eps=eps, momentum=beta, affine=False, dtype=torch.float64).train()
    result = ToyResult(gamma=gamma, errors={m: [] for m in METHODS})
    for r in range(1, rounds + 1):
        x, cls = draw_round(gen, gamma, means, points, std)
        with torch.no_grad():
            ref = central(x.reshape(-1, 2)).reshape(x.shape)
            # naive BN: each client's copy of the global BN, in training mode on its own batch
            naive_out, run_means, run_vars = [], [], []
            for i in range(num_clients):
                local = _bn(beta, eps)
                local.load_state_dict(fixbn_state.state_dict())
                naive_out.append(local.train()(x[i]))
                run_means.append(local.running_mean)
                run_vars.append(local.running_var)
            naive = torch.stack(naive_out)
            # FixBN: naive until the switch, then the frozen averaged statistics (evaluation mode)
            if r <= switch:
                fix = naive
                fixbn_state.running_mean.copy_(torch.stack(run_means).mean(0))  # FedAvg's buffer average
                fixbn_state.running_var.copy_(torch.stack(run_vars).mean(0))
            else:
                fix = fixbn_state.eval()(x.reshape(-1, 2)).reshape(x.shape)
            # FBN: normalise with the shared statistics; record batch statistics; aggregate (Eq. 9-10)
            with recording_fbn_statistics(fbn) as records:
                fbn_out = torch.stack([fbn(x[i]) for i in range(num_clients)])
            (count, b_mean, b_var), = (tuple(torch.stack(t) for t in zip(*recs)) for recs in records.values())
            shared_mean, shared_var = fbn.running_mean.double(), fbn.running_var.double()
            local_mean, local_var = fbn_local_update(shared_mean, shared_var, b_mean, b_var, beta)
            new_mean, new_var = fbn_aggregate(count, local_mean, local_var, shared_var, beta)
            fbn.running_mean.copy_(new_mean)
            fbn.running_var.copy_(new_var)
        result.errors["naive"].append(_error(naive, ref))
        result.errors["fixbn"].append(_error(fix, ref))
        result.errors["fbn"].append(_error(fbn_out, ref))
        if r == rounds:
            result.points, result.classes = x, cls
            result.normalised = {"centralized": ref, "naive": naive, "fixbn": fix, "fbn": fbn_out}
    result.running = {
        "centralized": (central.running_mean.tolist(), central.running_var.tolist()),
        "fbn": (fbn.running_mean.tolist(), fbn.running_var.tolist()),
        "fixbn": (fixbn_state.running_mean.tolist(), fixbn_state.running_var.tolist()),
    }
    return result


def error_table(gammas: Sequence[float] = GAMMAS, seeds: Sequence[int] = (0, 1, 2), **kwargs: object) -> dict:
    """Fig. 2c's numbers: per γ and scheme, the 100-round mean error of each seed, their mean and
    sample std; plus each seed's final running variance (FBN, FixBN, centralized)."""
    table: dict = {"gammas": list(gammas), "seeds": list(seeds), "settings": dict(kwargs), "rows": []}
    for g in gammas:
        runs = [run_toy(g, seed=s, **kwargs) for s in seeds]  # type: ignore[arg-type]
        row: dict = {"gamma": g}
        for m in METHODS:
            per_seed = [r.mean_error(m) for r in runs]
            mean = sum(per_seed) / len(per_seed)
            sd = math.sqrt(sum((v - mean) ** 2 for v in per_seed) / (len(per_seed) - 1)) if len(per_seed) > 1 else 0.0
            row[m] = {"per_seed": per_seed, "mean": mean, "std": sd}
        row["running_var"] = {k: [r.running[k][1] for r in runs] for k in ("centralized", "fbn", "fixbn")}
        table["rows"].append(row)
    return table


def _markdown(table: dict) -> str:
    n = len(table["seeds"])
    lines = ["| γ | FBN | FixBN | naive BN |", "|---|---:|---:|---:|"]
    for row in table["rows"]:
        cells = [f"{row[m]['mean']:.3f} ± {row[m]['std']:.3f}" for m in METHODS]
        lines.append(f"| {row['gamma']:g} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Mean Euclidean distance to centralized BN's normalisation, averaged over the rounds; mean ± sample std over {n} seeds.")
    return "\n".join(lines) + "\n"


def plot_toy(results: Sequence[ToyResult], table: dict, path: str | Path) -> Path:
    """Figs. 1-2 in one figure: raw and normalised points at γ = 0 (centralized, naive, FBN, FixBN
    at the last round) and the normalisation error against γ (Fig. 2c)."""
    from matplotlib.figure import Figure

    extreme = next(r for r in results if r.gamma == 0.0)
    fig = Figure(figsize=(16, 3.6))
    axes = fig.subplots(1, 5)
    titles = {"centralized": "centralized BN (Fig. 1a)", "naive": "naive BN (Fig. 1b)", "fbn": "FBN (Fig. 2a)",
              "fixbn": "FixBN (Fig. 2b)"}
    assert extreme.points is not None and extreme.classes is not None
    for ax, key in zip(axes, titles):
        scale = 1.0 / 10.0  # raw points drawn at 1/10 so both fit the same axes
        pts = extreme.normalised[key]
        for i in range(len(pts)):
            colour = f"C{i % 10}"
            ax.scatter(extreme.points[i, :, 0] * scale, extreme.points[i, :, 1] * scale, s=6, marker="o", color=colour, alpha=0.25)
            ax.scatter(pts[i, :, 0], pts[i, :, 1], s=10, marker="+", color=colour)
        ax.set_title(titles[key], fontsize=9)
        ax.set_aspect("equal", adjustable="datalim")
    ax = axes[-1]
    gammas = [row["gamma"] for row in table["rows"]]
    for i, m in enumerate(METHODS):
        ax.errorbar(range(len(gammas)), [row[m]["mean"] for row in table["rows"]], yerr=[row[m]["std"] for row in table["rows"]],
                    marker="os^"[i], label={"fbn": "FBN", "fixbn": "FixBN", "naive": "naive BN"}[m], capsize=3)
    ax.set_xticks(range(len(gammas)), [f"{g:g}" for g in gammas])
    ax.set_xlabel("γ (1: homogeneous, 0: one class per client)", fontsize=8)
    ax.set_ylabel("normalisation error", fontsize=8)
    ax.set_title("Fig. 2c: error vs heterogeneity", fontsize=9)
    ax.legend(fontsize=8)
    fig.suptitle("FBN toy: points before (o, at 1/10 scale) and after (+) normalisation, γ = 0, last round", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fednorm.analysis.fbn_toy``: the error table over ``--seeds`` seeds and ``--gammas``, printed and written to ``--out``."""
    parser = toy_parser("fbn_toy", __doc__)
    parser.add_argument("--rounds", type=int, default=100, help="rounds (default: the paper's 100)")
    parser.add_argument("--gammas", type=str, default=",".join(f"{g:g}" for g in GAMMAS), help="comma-separated γ levels")
    args = parser.parse_args(argv)
    gammas = [float(g) for g in args.gammas.split(",")]
    seeds = list(range(args.seeds))
    table = error_table(gammas, seeds, rounds=args.rounds)
    plot = None if args.no_plot or 0.0 not in gammas else \
        (lambda path: plot_toy([run_toy(g, seed=seeds[0], rounds=args.rounds) for g in gammas], table, path))
    return write_toy_records("fbn_toy", args.out, table, _markdown, plot, argv)


if __name__ == "__main__":
    raise SystemExit(main())
