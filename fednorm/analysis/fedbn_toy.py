"""FedBN's toy (Li et al., 2021, Sec. 1, Figs. 1-2): cos regression on two clients, error surfaces with and without BN.

Client k draws ``x = σ_k·u`` with ``u ~ N(0, 1)`` and ``y = cos(w_true·t) + ε``; the model is
``f_w(x) = cos(w·x/γ)``, where the "BN" divides the input by ``γ``, the local empirical std of x
(biased, ``γ_k = std(x_k)``); without BN ``γ = 1``. The error of client k is the mean squared error
``L_k(w, γ) = mean_i (y_i − cos(w·x_i/γ))²``. Fig. 2 is ``L_1`` over w ∈ [0.001, 12] × γ ∈ [0.001, 4].

The paper writes ``y = cos(w_true·x)`` and says only that the clients' x variances differ, but
what it says of the figures holds only if the label depends on the *standardised* feature, ``t =
x/σ_k = u`` (a feature shift: P(x) differs, P(y | u) is shared). With ``t = x`` (the literal
formula) BN moves the clients' minimisers *apart* (to ``w_true·σ_k``) instead of together. Both
readings are computed (``reading``: ``"feature_shift"`` or ``"literal"``) and the records say
which one the paper's claims hold under.

The claims, as numbers (:func:`client_table`, :func:`claims`):

* Fig. 1, "BN harmonizes the loss surface": each client's minimiser ``w_k*`` of ``L_k(·, 1)``
  (no BN) and of ``L_k(·, γ_k)`` (BN); the gap ``|w_1* − w_2*|``; the curvature
  ``∂²L/∂w²`` at each minimiser and its ratio between the clients; the width of the low-error
  basin along w (the interval around ``w_k*`` where ``L_k ≤ 0.25``; far from the minimiser
  ``L ≈ 1``); and each client's error at the averaged model ``w̄ = (w_1* + w_2*)/2``
  ("averaging the model does not lead to a good model" without BN, "can be beneficial" with it).
* Fig. 2 (client 1's surface): ``L_1(w̄, γ̄)`` with ``γ̄ = (γ_1 + γ_2)/2`` ("averaging model and BN
  parameters leads to worse solutions") against ``L_1(w̄, γ_1)`` (the average model with local BN
  "performs very well"), with the BN minimisers ``w_k*``.

Constants not in the paper (it gives none; ours follow the reproduction notes' suggestion): ``w_true
= 2``, client stds ``σ = (1, 3)``, noise std 0.1, 1,000 points per client, fresh draws per seed;
minimisers on a grid of step 0.001 over [0.001, 12]. Run ``python -m fednorm.analysis.fedbn_toy
--out DIR --seeds 3`` for ``fedbn_toy.json``, ``fedbn_toy.md`` and ``fedbn_toy.png``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .toy_cli import toy_parser, write_toy_records

__all__ = ["READINGS", "ToyData", "draw_clients", "error", "error_curve", "curvature", "basin", "client_table",
           "claims", "toy_table", "plot_toy", "main"]

#: The two readings of the toy's label, one that depends on each client's x/σ_k and the paper's literal y = cos(w·x).
READINGS = ("feature_shift", "literal")
W_TRUE = 2.0
CLIENT_STDS = (1.0, 3.0)
NOISE_STD = 0.1
POINTS = 1000
W_RANGE = (0.001, 12.0)  # Fig. 2's axes
GAMMA_RANGE = (0.001, 4.0)
BASIN_THRESHOLD = 0.25
W_GRID = np.round(np.arange(W_RANGE[0], W_RANGE[1] + 1e-9, 0.001), 6)


@dataclass
class ToyData:
    """The clients' samples ``x[k], y[k]`` (1-D arrays) and BN's ``γ_k`` (their empirical stds)."""

    reading: str
    x: list[np.ndarray]
    y: list[np.ndarray]

    @property
    def gammas(self) -> list[float]:
        return [float(x.std()) for x in self.x]


def draw_clients(seed: int = 0, reading: str = "feature_shift", stds: Sequence[float] = CLIENT_STDS,
                 w_true: float = W_TRUE, noise: float = NOISE_STD, points: int = POINTS) -> ToyData:
    """``x = σ_k·u``, ``y = cos(w_true·t) + ε`` with ``t = u`` (feature shift) or ``t = x`` (literal)."""
    if reading not in READINGS:
        raise ValueError(f"reading must be one of {READINGS}, got {reading!r}")
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for s in stds:
        u = rng.standard_normal(points)
        t = u if reading == "feature_shift" else s * u
        xs.append(s * u)
        ys.append(np.cos(w_true * t) + noise * rng.standard_normal(points))
    return ToyData(reading, xs, ys)


def error(x: np.ndarray, y: np.ndarray, w: np.ndarray | float, gamma: np.ndarray | float = 1.0) -> np.ndarray:
    """``mean_i (y_i − cos(w·x_i/γ))²`` for every (broadcast) pair of ``w`` and ``gamma``."""
    w, gamma = np.broadcast_arrays(np.asarray(w, dtype=np.float64), np.asarray(gamma, dtype=np.float64))
    scale = (w / gamma).reshape(-1)
    out = np.empty(scale.shape)
    for i in range(0, len(scale), 2048):  # bounded memory: 2048 × len(x) at a time
        z = np.cos(np.outer(scale[i:i + 2048], x))
        out[i:i + 2048] = ((y - z) ** 2).mean(axis=1)
    return out.reshape(w.shape)


def error_curve(x: np.ndarray, y: np.ndarray, gamma: float = 1.0, ws: np.ndarray = W_GRID) -> np.ndarray:
    """``L(w, γ)`` along ``ws`` at one γ (γ = 1: no BN)."""
    return error(x, y, ws, gamma)


def curvature(x: np.ndarray, y: np.ndarray, w: float, gamma: float = 1.0) -> float:
    """``∂²L/∂w²`` at ``(w, γ)``, analytically: ``mean 2·v²·(sin²(w·v) + (y − cos(w·v))·cos(w·v))`` with ``v = x/γ``."""
    v = x / gamma
    c, s = np.cos(w * v), np.sin(w * v)
    return float((2 * v**2 * (s**2 + (y - c) * c)).mean())


def basin(ws: np.ndarray, curve: np.ndarray, threshold: float = BASIN_THRESHOLD) -> dict:
    """The minimiser of ``curve`` over ``ws`` and the connected interval around it where ``curve ≤ threshold``."""
    i = int(np.argmin(curve))
    lo = hi = i
    while lo > 0 and curve[lo - 1] <= threshold:
        lo -= 1
    while hi < len(curve) - 1 and curve[hi + 1] <= threshold:
        hi += 1
    low = bool(curve[i] <= threshold)
    return {"w_min": float(ws[i]), "error_min": float(curve[i]), "left": float(ws[lo]), "right": float(ws[hi]),
            "width": float(ws[hi] - ws[lo]) if low else 0.0}


def client_table(data: ToyData, ws: np.ndarray = W_GRID) -> dict:
    """Per client, without BN (γ = 1) and with BN (γ = γ_k): minimiser, error, basin and curvature."""
    out: dict = {"gammas": data.gammas, "no_bn": [], "bn": []}
    for x, y, g in zip(data.x, data.y, data.gammas):
        for key, gamma in (("no_bn", 1.0), ("bn", g)):
            b = basin(ws, error_curve(x, y, gamma, ws))
            b["curvature"] = curvature(x, y, b["w_min"], gamma)
            out[key].append(b)
    return out


def claims(data: ToyData, table: dict) -> dict:
    """Figs. 1-2's statements as numbers (see the module docstring)."""
    g1, g2 = data.gammas
    out: dict = {}
    for key in ("no_bn", "bn"):
        w1, w2 = (c["w_min"] for c in table[key])
        w_bar = (w1 + w2) / 2
        gammas = (1.0, 1.0) if key == "no_bn" else (g1, g2)
        out[key] = {
            "minimiser_gap": abs(w1 - w2),
            "curvature_ratio": table[key][1]["curvature"] / table[key][0]["curvature"],
            "basin_width_ratio": table[key][1]["width"] / table[key][0]["width"] if table[key][0]["width"] else math.inf,
            "w_bar": w_bar,
            "averaged_model_error": [float(error(x, y, w_bar, g)) for x, y, g in zip(data.x, data.y, gammas)],
        }
    w_bar = out["bn"]["w_bar"]
    out["fig2"] = {"w_bar": w_bar, "gamma_bar": (g1 + g2) / 2, "gamma_1": g1,
                   "error_averaged_w_and_gamma": float(error(data.x[0], data.y[0], w_bar, (g1 + g2) / 2)),
                   "error_averaged_w_local_gamma": float(error(data.x[0], data.y[0], w_bar, g1))}
    return out


def _summary(values: Sequence[float]) -> dict:
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return {"per_seed": list(values), "mean": mean, "std": sd}


# (label, path into one seed's {"clients": ..., "claims": ...})
_ROWS: tuple[tuple[str, tuple], ...] = (
    ("client 1 minimiser w*, no BN", ("clients", "no_bn", 0, "w_min")),
    ("client 2 minimiser w*, no BN", ("clients", "no_bn", 1, "w_min")),
    ("client 1 minimiser w*, BN", ("clients", "bn", 0, "w_min")),
    ("client 2 minimiser w*, BN", ("clients", "bn", 1, "w_min")),
    ("minimiser gap |w1* − w2*|, no BN", ("claims", "no_bn", "minimiser_gap")),
    ("minimiser gap |w1* − w2*|, BN", ("claims", "bn", "minimiser_gap")),
    ("client 1 basin width (L ≤ 0.25), no BN", ("clients", "no_bn", 0, "width")),
    ("client 2 basin width, no BN", ("clients", "no_bn", 1, "width")),
    ("client 1 basin width, BN", ("clients", "bn", 0, "width")),
    ("client 2 basin width, BN", ("clients", "bn", 1, "width")),
    ("curvature ratio ∂²L₂/∂²L₁ at the minima, no BN", ("claims", "no_bn", "curvature_ratio")),
    ("curvature ratio, BN", ("claims", "bn", "curvature_ratio")),
    ("averaged model w̄: client 1 error, no BN", ("claims", "no_bn", "averaged_model_error", 0)),
    ("averaged model w̄: client 2 error, no BN", ("claims", "no_bn", "averaged_model_error", 1)),
    ("averaged model w̄: client 1 error, BN", ("claims", "bn", "averaged_model_error", 0)),
    ("averaged model w̄: client 2 error, BN", ("claims", "bn", "averaged_model_error", 1)),
    ("Fig. 2: client 1 error at (w̄, γ̄)", ("claims", "fig2", "error_averaged_w_and_gamma")),
    ("Fig. 2: client 1 error at (w̄, γ₁)", ("claims", "fig2", "error_averaged_w_local_gamma")),
)


def _get(record: dict, path: tuple) -> float:
    for p in path:
        record = record[p]
    return float(record)  # type: ignore[arg-type]


def toy_table(seeds: Sequence[int] = (0, 1, 2), readings: Sequence[str] = READINGS) -> dict:
    """Per reading: each seed's client table and claims, and mean ± sample std of every row of the table."""
    table: dict = {"seeds": list(seeds), "settings": {"w_true": W_TRUE, "client_stds": list(CLIENT_STDS), "noise_std": NOISE_STD,
                                                      "points": POINTS, "w_grid": [W_RANGE[0], W_RANGE[1], 0.001],
                                                      "basin_threshold": BASIN_THRESHOLD}, "readings": {}}
    for reading in readings:
        runs = []
        for s in seeds:
            data = draw_clients(s, reading)
            clients = client_table(data)
            runs.append({"seed": s, "gammas": data.gammas, "clients": clients, "claims": claims(data, clients)})
        rows = {label: _summary([_get(r, path) for r in runs]) for label, path in _ROWS}
        table["readings"][reading] = {"rows": rows, "runs": runs}
    return table


def _markdown(table: dict) -> str:
    readings = list(table["readings"])
    lines = ["| quantity | " + " | ".join(f"{r.replace('_', ' ')} reading" for r in readings) + " |",
             "|---|" + "---:|" * len(readings)]
    for label, _ in _ROWS:
        cells = [table["readings"][r]["rows"][label] for r in readings]
        lines.append(f"| {label} | " + " | ".join(f"{c['mean']:.3f} ± {c['std']:.3f}" for c in cells) + " |")
    st = table["settings"]
    lines.append("")
    lines.append(f"Mean ± sample std over {len(table['seeds'])} seeds; w_true = {st['w_true']:g}, client stds {st['client_stds']}, "
                 f"noise std {st['noise_std']:g}, {st['points']} points per client. Feature shift: y = cos(w_true·x/σ_k); "
                 "literal: y = cos(w_true·x).")
    return "\n".join(lines) + "\n"


def plot_toy(seed: int, path: str | Path) -> Path:
    """One row per reading: Fig. 1 without BN, Fig. 1 with BN, Fig. 2 (client 1's surface over (w, γ))."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 8))
    axes = fig.subplots(len(READINGS), 3)
    ws = W_GRID[::10]
    surface_w = np.linspace(*W_RANGE, 161)
    surface_g = np.linspace(*GAMMA_RANGE, 101)
    for row, reading in zip(axes, READINGS):
        data = draw_clients(seed, reading)
        clients = client_table(data)
        c = claims(data, clients)
        for ax, key, title in ((row[0], "no_bn", "Fig. 1, without BN"), (row[1], "bn", "Fig. 1, with BN (γ = local std)")):
            for k, (x, y, g) in enumerate(zip(data.x, data.y, data.gammas)):
                ax.plot(ws, error_curve(x, y, 1.0 if key == "no_bn" else g, ws), color=f"C{k}", lw=1,
                        label=f"client {k + 1} (σ = {CLIENT_STDS[k]:g})")
            ax.axvline(c[key]["w_bar"], color="k", ls=":", lw=1, label="w̄ (average of minimisers)")
            ax.set_title(f"{reading.replace('_', ' ')}: {title}", fontsize=9)
            ax.set_xlabel("w", fontsize=8)
            ax.set_ylabel("training error", fontsize=8)
            ax.legend(fontsize=7)
        ax = row[2]
        z = error(data.x[0], data.y[0], surface_w[None, :], surface_g[:, None])
        mesh = ax.pcolormesh(surface_w, surface_g, z, shading="auto", cmap="viridis")
        fig.colorbar(mesh, ax=ax)
        f2 = c["fig2"]
        w1 = clients["bn"][0]["w_min"]
        ax.plot([f2["w_bar"]], [f2["gamma_bar"]], "rx", ms=9, mew=2, label=f"(w̄, γ̄): {f2['error_averaged_w_and_gamma']:.2f}")
        ax.plot([f2["w_bar"]], [f2["gamma_1"]], "wo", ms=9, mfc="none", mew=2, label=f"(w̄, γ₁*): {f2['error_averaged_w_local_gamma']:.2f}")
        ax.plot([w1], [data.gammas[0]], "w*", ms=6, label="(w₁*, γ₁*)")
        ax.set_title(f"{reading.replace('_', ' ')}: Fig. 2, client 1's error over (w, γ)", fontsize=9)
        ax.set_xlabel("w", fontsize=8)
        ax.set_ylabel("γ", fontsize=8)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"FedBN toy: y = cos(w_true·t) + ε, w_true = {W_TRUE:g}, client stds {CLIENT_STDS}, seed {seed}", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=72)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fednorm.analysis.fedbn_toy``: the table over ``--seeds`` seeds, printed and written to ``--out``."""
    args = toy_parser("fedbn_toy", __doc__).parse_args(argv)
    table = toy_table(list(range(args.seeds)))
    plot = None if args.no_plot else (lambda path: plot_toy(0, path))
    return write_toy_records("fedbn_toy", args.out, table, _markdown, plot, argv)


if __name__ == "__main__":
    raise SystemExit(main())
