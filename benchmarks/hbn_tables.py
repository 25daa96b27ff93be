"""HBN Tables 1 and 2 at CPU scale: HBN against BN, GN, LN, FN, FixBN and FBN, and the batch sweep.

The paper (spec/000_hbn.md §3) trains Simple-CNN on all of CIFAR-10/100 with 100 clients, 10 per
round, for 500 rounds. This script keeps its local setting (batch 4, one local epoch, SGD lr 0.01,
momentum 0.9, decay 0.998 per round, clipping at 10, Dirichlet label skew) and scales the
federation as benchmarks/optimizers.py does: a class-balanced CIFAR-10 subset
(``--train-per-class``, default 300), ``--clients`` clients (20), ``--per-round`` per round (5),
``--rounds`` rounds (25), a 1,000-image test subset, one seed.

    python benchmarks/hbn_tables.py --table 1 --phi 0.6 --data-dir ../shared/data
    python benchmarks/hbn_tables.py --table 2 --phi 0.6 --data-dir ../shared/data   # B = 2..32, BN/GN/HBN
    # an HBN option for every hbn* variant, e.g. lambda (Eq. 11) 0.1 instead of 0.01:
    python benchmarks/hbn_tables.py --table 2 --phi 0.6 --norms hbn --batch-sizes 16,32 \
        --hbn-args '{"stats_momentum": 0.1}' --out benchmarks/results/hbn_table2_phi0.6_lambda0.1.json

Table 2 in the paper is CIFAR-100; only CIFAR-10 is available offline, so the sweep runs on it.
FixBN switches at half the rounds; FBN runs its ``literal`` mode (clients take different numbers
of local steps in epoch mode, which the ``exact`` replay does not allow).

FN is placed as in the HBN paper's FedFN row: no norm in the conv blocks and FN
(``sqrt(d)·z/‖z‖``) on the flattened 64×4×4 = 1024-d conv map, before the first FC layer
(paper App. Table 7, "we normalise the input before the fully connected layer"; code
``SimpleCNN(fn=True)``). ``fn_head`` is the LN paper's placement (``norm="fn"``: FN on the 128-d
output of that FC layer, before the head), which this script used for ``fn`` before.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks.harness import measure, write_result  # noqa: E402
from benchmarks.optimizers import add_scale_args, scaled_setting  # noqa: E402

from fednorm.config import ExperimentConfig  # noqa: E402
from fednorm.data.federated import federated_data_from_config  # noqa: E402
from fednorm.engine.simulator import Simulation  # noqa: E402

TABLE1 = {  # spec/000_hbn.md Table 1, CIFAR-10 at phi = 0.6 / 0.3 / 0.1
    "bn": (75.82, 73.85, 69.61), "gn": (75.74, 74.10, 68.76), "ln": (74.08, 72.50, 66.22),
    "fn": (75.51, 74.30, 67.96), "fixbn": (77.34, 74.51, 70.36), "fbn": (73.91, 71.94, 66.13),
    "hbn": (78.22, 76.53, 71.56),
}
TABLE2 = {  # CIFAR-100, phi = 0.6: B -> (BN, GN, HBN)
    32: (49.63, 45.82, 51.05), 16: (48.30, 46.84, 50.75), 8: (46.86, 46.33, 50.06),
    4: (45.84, 47.11, 49.88), 2: (43.89, 45.72, 48.86),
}


def variant(name: str, rounds: int) -> dict:
    return {
        "bn": dict(norm="bn", method="fedavg"),
        "gn": dict(norm="gn", method="fedavg"),
        "ln": dict(norm="ln", method="fedavg"),
        # HBN's FedFN: FN on the flattened 1024-d conv map, before fc (its Table 7, code SimpleCNN(fn=True))
        "fn": dict(norm="none", method="fedavg", model_args={"fn_before_fc": True}),
        # the LN paper's FedFN placement: FN on the 128-d penultimate features, before the head
        "fn_head": dict(norm="fn", method="fedavg"),
        "fixbn": dict(norm="bn", method="fixbn", method_args={"switch_round": max(1, rounds // 2)}),
        # FBN and HBN as their papers run them (fednorm's defaults add initial statistics passes)
        "fbn": dict(norm="fbn", method="fbn", method_args={"mode": "literal", "initial_pass": False, "weighting": "uniform"}),
        "hbn": dict(norm="hbn", method="hbn", method_args={"preset": "paper"}),
        # the global statistics set from the first pool instead of smoothed into (0, 1) (spec §5 row 8):
        # with lambda = 0.01 the initial (0, 1) keeps 0.99^R of the weight, 78% after 25 rounds
        "hbn_first_round": dict(norm="hbn", method="hbn", method_args={"preset": "paper", "stats_init": "first_round"}),
    }[name]


def train(sim: Simulation) -> str:
    """Every round of ``sim``; "completed", or the error that stopped it (a diverged variant is a result)."""
    try:
        for _ in sim.rounds():
            pass
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:120]}"
    return "completed"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir")
    ap.add_argument("--table", type=int, choices=(1, 2), default=1)
    ap.add_argument("--phi", type=float, default=0.6)
    ap.add_argument("--norms", default=None, help="default: all of Table 1, or bn,gn,hbn for Table 2")
    ap.add_argument("--batch-sizes", default="2,4,8,16,32")
    ap.add_argument("--hbn-args", type=json.loads, default={},
                    help='JSON options of the hbn method for every hbn* variant, e.g. \'{"stats_momentum": 0.1}\'')
    add_scale_args(ap)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    norms = (args.norms or ("bn,gn,ln,fn,fixbn,fbn,hbn" if args.table == 1 else "bn,gn,hbn")).split(",")
    batches = [4] if args.table == 1 else [int(b) for b in args.batch_sizes.split(",")]
    out = args.out or f"benchmarks/results/hbn_table{args.table}_phi{args.phi:g}.json"
    tmp = tempfile.TemporaryDirectory()
    base = scaled_setting(args, tmp.name, phi=args.phi)
    data = federated_data_from_config(ExperimentConfig(**base, batch_size=4))
    results = []
    for bsz in batches:
        for name in norms:
            var = variant(name, args.rounds)
            if name.startswith("hbn") and args.hbn_args:
                var["method_args"] = {**var.get("method_args", {}), **args.hbn_args}
            cfg = ExperimentConfig(**base, batch_size=bsz, **var)
            sim = Simulation(cfg, data=data)
            timing, status = measure(lambda: train(sim))
            accs = [h["test_accuracy"] for h in sim.history]
            res = {"norm": name, "batch_size": bsz, "method_args": var.get("method_args", {}),
                   "model_args": var.get("model_args", {}), "status": status, "curve": accs,
                   "final_accuracy": accs[-1] if accs else None,
                   "last3_mean_accuracy": float(np.mean(accs[-3:])) if accs else None,
                   "cpu_seconds": timing["cpu"], "wall_seconds": timing["wall"], "executor": sim.executor.name,
                   "method_report": sim.method.report(sim)}
            results.append(res)
            write_result(out, {"partial": True, "results": results})
            print(f"B={bsz:2d} {name:6s} final {100 * (res['final_accuracy'] or float('nan')):5.1f} "
                  f"last3 {100 * (res['last3_mean_accuracy'] or float('nan')):5.1f}  {res['cpu_seconds']:5.0f} CPU-s  {status}",
                  flush=True)
    col = {0.6: 0, 0.3: 1, 0.1: 2}.get(args.phi)
    lines = []
    for r in results:
        paper = (TABLE1.get(r["norm"], (None,) * 3)[col] if col is not None else None) if args.table == 1 else (
            TABLE2.get(r["batch_size"], (None,) * 3)[["bn", "gn", "hbn"].index(r["norm"])] if r["norm"] in ("bn", "gn", "hbn") else None)
        acc = "diverged" if r["status"] != "completed" else f"{100 * r['final_accuracy']:.1f} ({100 * r['last3_mean_accuracy']:.1f})"
        lines.append(f"| {r['batch_size']} | {r['norm']} | {acc} | {paper} |")
    table = "| B | norm | final (last-3 mean) % | paper % |\n|---|---|---|---|\n" + "\n".join(lines)
    print(table)
    write_result(out, {"benchmark": f"HBN Table {args.table} at CPU scale", "phi": args.phi, "results": results,
                       "fn_placement": "fn: the flattened 1024-d conv map before fc (HBN paper's FedFN); "
                                       "fn_head: the 128-d features before the head (LN paper's)",
                       "table_markdown": table, "setting": {k: v for k, v in base.items() if k != "data_dir"},
                       })


if __name__ == "__main__":
    main()
