"""HBN Table 4 at CPU scale: FL optimizers with BatchNorm and with HBN (CIFAR-10, B = 4, Dir(0.6), Simple-CNN).

The paper (spec/000_hbn.md §3, Table 4) runs 100 clients, 10 per round, 500 rounds on all of
CIFAR-10. This script keeps the paper's local setting (Simple-CNN, batch 4, one local epoch,
SGD lr 0.01 with momentum 0.9, decay 0.998 per round, clipping at 10, Dir(0.6) label skew) and
scales the federation down to fit a CPU budget: a class-balanced subset of ``--train-per-class``
training images per class (default 300, so 3,000 images), ``--clients`` clients (20) with
``--per-round`` sampled per round (5), ``--rounds`` rounds (25), evaluated on a class-balanced
subset of the test set (``--test-per-class``, 100 → 1,000 images of the JPEG test copy). One
seed; at this scale differences of a few points between optimizers are within noise.

Rows: FedAvg, FedProx (mu 0.01), SCAFFOLD (Option II, momentum-aware), MOON (mu 5, tau 0.5, MOON's
CIFAR-10 setting), FedAdam (also with GN, the paper's base for FedAdam), FedAvgM and FedYogi, each
with BN (``fedavg`` method, buffers averaged) and with HBN (``hbn`` method). Reported: the final
accuracy and the mean of the last three evaluations, beside the paper's Table 4.

    python benchmarks/optimizers.py --data-dir ../shared/data
    python benchmarks/optimizers.py --rows fedavg,scaffold --rounds 10     # a quick look
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks._common import data_dir  # noqa: E402
from benchmarks.harness import measure, write_result  # noqa: E402

from fednorm.config import ExperimentConfig  # noqa: E402
from fednorm.data.federated import federated_data_from_config  # noqa: E402
from fednorm.engine.simulator import Simulation  # noqa: E402

# HBN paper Table 4 (CIFAR-10, B = 4, phi = 0.6): (base norm, base accuracy, +HBN accuracy)
PAPER = {
    "fedavg": ("bn", 75.82, 78.22),
    "fedprox": ("bn", 76.08, 78.44),
    "fedadam": ("gn", 75.67, 78.17),
    "scaffold": ("bn", 77.63, 78.65),
    "moon": ("bn", 75.77, 78.48),
}

ROWS = {  # name, in the order they run (the paper's Table 4 rows first) -> (client_opt, client_opt_args, server_opt, server_opt_args)
    "fedavg": ("none", {}, "none", {}),
    "fedprox": ("fedprox", {"mu": 0.01}, "none", {}),
    "scaffold": ("scaffold", {}, "none", {}),
    "moon": ("moon", {"mu": 5.0, "temperature": 0.5}, "none", {}),
    "fedadam": ("none", {}, "fedadam", {}),
    "fedyogi": ("none", {}, "fedyogi", {}),
    "fedavgm": ("none", {}, "fedavgm", {}),
}


def subset(src: str, dst: Path, train_per_class: int, test_per_class: int, seed: int) -> None:
    """Class-balanced subsets of the shared CIFAR-10 files, written in the npz layout fednorm reads."""
    src_dir = Path(src)
    rng = np.random.default_rng(seed)
    parts = [np.load(src_dir / f"cifar10_train_part{i}.npz") for i in (0, 1)]
    x = np.concatenate([p["x"] for p in parts])
    y = np.concatenate([p["y"] for p in parts])
    test = np.load(src_dir / "cifar10_test_jpeg.npz")
    for name, xs, ys, per in (("train", x, y, train_per_class), ("test", test["x"], test["y"], test_per_class)):
        idx = np.sort(np.concatenate([rng.choice(np.flatnonzero(ys == c), per, replace=False) for c in range(10)]))
        np.savez(dst / f"cifar10_{name}.npz", x=xs[idx], y=ys[idx])


def add_scale_args(ap: argparse.ArgumentParser) -> None:
    """The options that scale the HBN paper's federation down to a CPU (shared with hbn_tables.py)."""
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--per-round", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--train-per-class", type=int, default=300)
    ap.add_argument("--test-per-class", type=int, default=100)
    ap.add_argument("--seed", type=int, default=42)


def scaled_setting(args: argparse.Namespace, tmp_dir: str, *, phi: float) -> dict:
    """The HBN paper's local setting on the CIFAR-10 subset written to ``tmp_dir`` (no batch size:
    the callers set it). Simple-CNN, one local epoch, SGD lr 0.01, momentum 0.9, decay 0.998,
    clipping at 10, Dirichlet ``phi``."""
    subset(data_dir(args.data_dir), Path(tmp_dir), args.train_per_class, args.test_per_class, args.seed)
    return dict(
        dataset="cifar10", data_dir=tmp_dir, partition="dirichlet", alpha=phi, min_size=4,
        num_clients=args.clients, clients_per_round=args.per_round, model="simple_cnn", rounds=args.rounds,
        local_epochs=1, drop_last=True, lr=0.01, lr_decay=0.998, momentum=0.9, weight_decay=0.0,
        max_grad_norm=10.0, eval_every=args.eval_every, seed=args.seed, threads=1,
    )


def train(cfg: ExperimentConfig, data) -> tuple[Simulation, str]:
    """Build and run one variant: the simulation, and "completed" or the error that stopped it."""
    sim = Simulation(cfg, data=data)
    try:
        for _ in sim.rounds():
            pass
    except Exception as exc:  # a diverged variant is a result, not a crash of the benchmark
        return sim, f"{type(exc).__name__}: {str(exc)[:120]}"
    return sim, "completed"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--norms", default="bn,hbn", help="norms for every row (FedAdam also runs with GN)")
    add_scale_args(ap)
    ap.add_argument("--out", default="benchmarks/results/optimizers.json")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    base = {**scaled_setting(args, tmp.name, phi=0.6), "batch_size": 4}
    data = federated_data_from_config(ExperimentConfig(**base))
    sizes = data.client_sizes()
    print(f"{len(data.train_y)} train / {len(data.test_y)} test images, client sizes {int(sizes.min())}..{int(sizes.max())}")
    variants = []
    for row in args.rows.split(","):
        norms = args.norms.split(",") + (["gn"] if row == "fedadam" and "gn" not in args.norms else [])
        for norm in norms:
            variants.append((row, norm))
    results = []
    cpu0 = time.process_time()
    for row, norm in variants:
        client_opt, client_args, server_opt, server_args = ROWS[row]
        cfg = ExperimentConfig(
            **base, norm=norm, method="hbn" if norm == "hbn" else "fedavg",
            client_opt=client_opt, client_opt_args=client_args, server_opt=server_opt, server_opt_args=server_args,
        )
        timing, (sim, status) = measure(lambda: train(cfg, data))
        accs = [h["test_accuracy"] for h in sim.history]
        res = {
            "row": row, "norm": norm, "status": status, "executor": sim.executor.name,
            "final_accuracy": accs[-1] if accs else None,
            "last3_mean_accuracy": float(np.mean(accs[-3:])) if accs else None,
            "curve": accs, "rounds": sim.server_round,
            "wall_seconds": timing["wall"], "cpu_seconds": timing["cpu"],
            "method_summary": sim.method.summary(),
        }
        results.append(res)
        write_result(args.out, {"partial": True, "results": results})  # survives an interrupted run
        print(f"{row:9s} {norm:4s} final {100 * (res['final_accuracy'] or float('nan')):5.1f}  last3 "
              f"{100 * (res['last3_mean_accuracy'] or float('nan')):5.1f}  {res['cpu_seconds']:6.1f} CPU-s  {status}", flush=True)
    table = ["| FL method | paper base | paper +HBN | ours +BN | ours +GN | ours +HBN |", "|---|---|---|---|---|---|"]
    by = {(r["row"], r["norm"]): r for r in results}

    def cell(row: str, norm: str) -> str:
        r = by.get((row, norm))
        if r is None:
            return "–"
        if r["status"] != "completed":
            return "diverged"
        return f"{100 * r['final_accuracy']:.1f} ({100 * r['last3_mean_accuracy']:.1f})"

    for row in dict.fromkeys(r["row"] for r in results):
        paper = PAPER.get(row)
        pb = f"{paper[1]} ({paper[0].upper()})" if paper else "–"
        ph = f"{paper[2]}" if paper else "–"
        table.append(f"| {row} | {pb} | {ph} | {cell(row, 'bn')} | {cell(row, 'gn')} | {cell(row, 'hbn')} |")
    print("\nours: final accuracy (mean of the last 3 evaluations), %; paper: HBN Table 4, full scale")
    print("\n".join(table))
    write_result(args.out, {
        "benchmark": "HBN Table 4 at CPU scale",
        "setting": {**{k: v for k, v in base.items() if k != "data_dir"}, "train_images": len(data.train_y),
                    "test_images": len(data.test_y), "train_per_class": args.train_per_class, "test_per_class": args.test_per_class},
        "paper_table4": PAPER, "rows": ROWS, "results": results, "table_markdown": "\n".join(table),
        "total_cpu_seconds": time.process_time() - cpu0,
    })


if __name__ == "__main__":
    main()
