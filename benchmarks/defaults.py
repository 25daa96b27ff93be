"""Which defaults learn: FBN's and HBN's variants beside FedAvg+BN on the embedded digits (issue 17).

Each variant runs over several seeds in the same setting; the script prints the mean accuracy
curve (test accuracy after every round, mean over seeds, with the spread of the final value) and
writes a JSON of every run plus a plot. The settings are the ones the issue measured:

* ``iid``: digits, IID, 8 clients, 10 rounds (FBN's "learns slowly with local epochs");
* ``iid_long``: the same for 40 rounds (does the gap close?);
* ``dirichlet``: digits, Dirichlet(0.3), 8 clients, 5 rounds (FBN's unequal-clients crash and
  HBN's "defaults do not learn on short runs");
* ``central``: one client holding all digits, 6 local steps a round for 10 rounds: the same number
  of SGD steps as a client of ``iid``, without federation (what normalising with running
  statistics costs in itself).

    python benchmarks/defaults.py --method fbn --settings iid,dirichlet,central
    python benchmarks/defaults.py --method hbn --settings dirichlet
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`

import torch  # noqa: E402

import fednorm  # noqa: E402
from benchmarks.harness import write_result  # noqa: E402

SETTINGS: dict[str, dict[str, Any]] = {
    "iid": dict(dataset="digits", partition="iid", num_clients=8, rounds=10),
    "dirichlet": dict(dataset="digits", partition="dirichlet", alpha=0.3, num_clients=8, rounds=5),
    "central": dict(dataset="digits", partition="iid", num_clients=1, local_steps=6, rounds=10),
    # does FBN's slower start close with more rounds? (iid, 4x the rounds)
    "iid_long": dict(dataset="digits", partition="iid", num_clients=8, rounds=40),
}
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "fbn": {
        "FedAvg+BN": dict(norm="bn", method="fedavg"),
        "FedAvg+GN": dict(norm="gn", method="fedavg"),
        "FBN as the paper: (0,1) start, uniform weights": dict(
            norm="fbn", method="fbn", method_args={"initial_pass": False, "weighting": "uniform"}),
        "FBN + initial pass, uniform weights": dict(
            norm="fbn", method="fbn", method_args={"initial_pass": True, "weighting": "uniform"}),
        "FBN default: initial pass, count weights": dict(norm="fbn", method="fbn"),
        "FBN default, lr 0.1": dict(norm="fbn", method="fbn", lr=0.1),
    },
    "hbn": {
        "FedAvg+BN": dict(norm="bn", method="fedavg"),
        "HBN paper preset": dict(norm="hbn", method="hbn", method_args={"preset": "paper"}),
        "HBN reference-code preset": dict(norm="hbn", method="hbn", method_args={"preset": "reference-code"}),
        "HBN stats_init first_round": dict(norm="hbn", method="hbn", method_args={"stats_init": "first_round"}),
        "HBN stats_init debiased": dict(norm="hbn", method="hbn", method_args={"stats_init": "debiased"}),
        "HBN initial_pass + first_round": dict(
            norm="hbn", method="hbn", method_args={"stats_init": "first_round", "initial_pass": True}),
        "HBN initial_pass + debiased": dict(
            norm="hbn", method="hbn", method_args={"stats_init": "debiased", "initial_pass": True}),
        "HBN default (no method_args)": dict(norm="hbn", method="hbn"),
    },
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", choices=sorted(VARIANTS), required=True)
    ap.add_argument("--settings", default="iid,dirichlet")
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--only", default=None, help="comma-separated variant names (substring match)")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/defaults_<method>.json)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    variants = VARIANTS[args.method]
    if args.only:
        keys = args.only.split(",")
        variants = {k: v for k, v in variants.items() if any(s in k for s in keys)}
    results: dict[str, Any] = {"method": args.method, "seeds": seeds, "runs": {}}
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for setting in args.settings.split(","):
            base = SETTINGS[setting]
            print(f"\n## {setting}: {base}, seeds {seeds} (test accuracy % after each round, mean over seeds)")
            for name, variant in variants.items():
                curves = []
                for seed in seeds:
                    res = fednorm.run(**base, **variant, seed=seed, eval_every=1, threads=1, checkpoint_every=0,
                                      out=f"{tmp}/{setting}-{len(results['runs'])}-{seed}")
                    curves.append([100 * h["test_accuracy"] for h in res.history])
                mean = [statistics.mean(c[i] for c in curves) for i in range(len(curves[0]))]
                finals = [c[-1] for c in curves]
                sd = statistics.stdev(finals) if len(finals) > 1 else 0.0
                results["runs"][f"{setting}/{name}"] = {"setting": base, "variant": variant, "curves": curves, "mean": mean,
                                                        "final_mean": mean[-1], "final_std": sd}
                print(f"{name:48s} final {mean[-1]:5.1f} ± {sd:4.1f} | " + " ".join(f"{a:5.1f}" for a in mean), flush=True)
    results["wall_seconds"] = time.time() - start
    out = Path(args.out or f"benchmarks/results/defaults_{args.method}.json")
    results = write_result(out, results)
    plot(results, out.with_suffix(".png"))


def plot(results: dict[str, Any], path: Path) -> None:
    """One panel per setting: every variant's mean curve over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = sorted({k.split("/")[0] for k in results["runs"]})
    fig, axes = plt.subplots(1, len(settings), figsize=(6 * len(settings), 4.2), squeeze=False)
    for ax, setting in zip(axes[0], settings):
        for key, run in results["runs"].items():
            if key.split("/")[0] == setting:
                ax.plot(range(1, len(run["mean"]) + 1), run["mean"], marker="o", ms=3, label=key.split("/", 1)[1])
        s = results["runs"][next(k for k in results["runs"] if k.startswith(setting + "/"))]["setting"]
        ax.set_title(f"digits, {setting}: {s['num_clients']} client(s), mean of {len(results['seeds'])} seeds", fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy %")
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{results['method'].upper()} variants (sequential executor, 1 thread)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


if __name__ == "__main__":
    main()
