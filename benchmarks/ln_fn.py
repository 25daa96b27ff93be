"""FedAvg with no norm / BN / GN / LN / FN under extreme label shift (the LN paper's Table 1/4 setting).

Zhang et al. (TMLR 2024; spec/003_ln_fn.md §2): CIFAR-10, 10 clients, all clients every round,
plain SGD (no momentum, no weight decay), batch 32, 10 local steps, lr 0.01, the paper's CNN
(``ln_cnn``: 64-64-384-192, bias-free, every norm after its ReLU; FN on the 192-d penultimate
features), crop + flip augmentation, and no input normalisation (pixels in [0, 1], the paper's [code]
choice; fednorm's loader standardises, so the script maps the tensors back). Metric: mean over clients of the accuracy
on each client's own test split (same label mix as its training split), plus global accuracy.

Scaled down for a CPU: the paper runs 10,000 rounds; this script runs ``--rounds`` (1-class) and
``--rounds-other`` (2-class, Dir(0.1)) and evaluates on a stratified subset of the CIFAR-10 test
set (``--test-per-class`` images per class) to keep evaluation cheap. Every number printed is
therefore an *early-training* number, beside the paper's final-round numbers.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/ln_fn.py --rounds 24 --rounds-other 6
    # lr robustness, 1 class/client (separate result files):
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/ln_fn.py --settings 1class --norms fn,ln,none \
        --lr 0.1 --rounds 12 --eval-every 4 --out benchmarks/results/ln_fn_lr0.1.json
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/ln_fn.py --settings 1class --norms fn,ln,none \
        --lr 0.03 --rounds 8 --eval-every 4 --out benchmarks/results/ln_fn_lr0.03.json

    # 2-class and Dir(0.1), 16 rounds:
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/ln_fn.py --settings 2class,dir0.1 --rounds-other 16 \
        --eval-every 8 --out benchmarks/results/ln_fn_2class_dir0.1.json
    # a longer 1-class run, and Fig. 4's centralised reference (one client, batch 320, 10 steps a round):
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/ln_fn.py --settings 1class --norms none,ln,fn --rounds 64 \
        --eval-every 8 --out benchmarks/results/ln_fn_1class_r64.json
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/ln_fn.py --settings central --norms none --rounds 64 \
        --eval-every 8 --out benchmarks/results/ln_fn_central_r64.json
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/ln_fn.py --settings central --norms none --rounds 64 \
        --eval-every 8 --momentum 0.9 --out benchmarks/results/ln_fn_central_m0.9_r64.json

The results in docs/ln_fn.md come from these commands (all with ``--data-dir ../shared/data``); the
first was stopped after its 1-class setting to stay within a 20 CPU-minute budget.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks._common import data_dir  # noqa: E402
from benchmarks.harness import write_result  # noqa: E402

from fednorm.config import ExperimentConfig  # noqa: E402
from fednorm.data.federated import FederatedData, build_federated_data  # noqa: E402
from fednorm.data.partition import split_like  # noqa: E402
from fednorm.engine.simulator import Simulation  # noqa: E402
from fednorm.errors import DivergenceError  # noqa: E402

SETTINGS = {
    "1class": {"partition": "classes", "classes_per_client": 1},
    "2class": {"partition": "classes", "classes_per_client": 2},
    "dir0.1": {"partition": "dirichlet", "alpha": 0.1},
    # Fig. 4's centralised reference: one client with all the data, batch 320 = 10 clients x 32,
    # 10 steps per "round", the same lr and (unless --momentum) plain SGD (spec §5 row 20), so a round
    # costs the same.
    "central": {"partition": "iid", "num_clients": 1, "batch_size": 320},
}
RUN_KEYS = ("num_clients", "batch_size")  # setting keys that override the run config, not the partition
NORMS = ("none", "bn", "gn", "ln", "fn")
LABEL = {"none": "FedAvg", "bn": "FedAvg + BN", "gn": "FedGN", "ln": "FedLN", "fn": "FedFN"}
# Paper, final round (10,000 rounds). Table 4: CIFAR-10 CNN (FN/LN in reduced form, GN G=2);
# Table 2 (FedLN - CNN, learnable affine, every layer) for LN; Table 1: CIFAR-10 ResNet-18.
PAPER_CNN = {
    "none": (56.82, 71.83, 73.06), "bn": (9.63, 24.64, 58.80), "gn": (77.15, 77.54, 79.15),
    "ln": (78.04, 77.52, 78.27), "fn": (77.14, 76.67, 78.14),
}
PAPER_RESNET = {"none": (55.0, 65.6, 71.7), "ln": (87.2, 88.0, 89.1), "fn": (80.8, 82.3, 84.2)}


def subset_test(data: FederatedData, per_class: int, seed: int) -> FederatedData:
    """Keep ``per_class`` seeded test images of each class and re-cut the client test splits."""
    rng = np.random.default_rng(seed)
    y = data.test_y.numpy()
    keep = np.sort(np.concatenate([rng.permutation(np.flatnonzero(y == c))[:per_class] for c in np.unique(y)]))
    data.test_x = data.test_x[torch.as_tensor(keep)]
    data.test_y = data.test_y[torch.as_tensor(keep)]
    parts = split_like(data.test_y.numpy(), data.histogram(), seed=seed)
    data.client_test = [torch.as_tensor(p, dtype=torch.int64) for p in parts]
    return data


def to_unit_pixels(data: FederatedData) -> FederatedData:
    """Undo the loader's per-channel standardisation: pixels in [0, 1], as the paper's code feeds them."""
    mean = torch.tensor(data.info.mean).view(1, -1, 1, 1)
    std = torch.tensor(data.info.std).view(1, -1, 1, 1)
    data.train_x = data.train_x * std + mean
    data.test_x = data.test_x * std + mean
    return data


def run_one(base: dict, data: FederatedData, norm: str, rounds: int, lr: float, eval_at: set[int]) -> dict:
    cfg = ExperimentConfig(**{**base, "norm": norm, "rounds": rounds, "lr": lr, "eval_every": 10**6})
    cpu0, wall0 = time.process_time(), time.perf_counter()
    sim = Simulation(cfg, data=data)
    curve = []
    losses = []
    status = "completed"
    for r in range(1, rounds + 1):
        try:
            rec = sim.step()
        except DivergenceError as exc:  # a diverged run scores chance, as a NaN model predicts one class
            status = f"diverged at round {r}: {exc}"
            curve.append({"round": r, "mean_client_accuracy": 0.1, "test_accuracy": 0.1})
            break
        losses.append(rec.train_loss)
        if r in eval_at or r == rounds:
            m = sim.evaluate()
            curve.append({"round": r, "mean_client_accuracy": m["mean_client_accuracy"], "test_accuracy": m["test_accuracy"]})
    out = {
        "status": status,
        "norm": norm,
        "lr": lr,
        "rounds": rounds,
        "final_mean_client_accuracy": curve[-1]["mean_client_accuracy"],
        "final_test_accuracy": curve[-1]["test_accuracy"],
        "curve": curve,
        "train_loss": losses,
        "executor": sim.executor.name,
        "cpu_seconds": time.process_time() - cpu0,
        "wall_seconds": time.perf_counter() - wall0,
    }
    print(
        f"  {norm:5s} lr={lr:<6g} rounds={rounds:3d}  mean client acc {100 * out['final_mean_client_accuracy']:5.1f}%  "
        f"global {100 * out['final_test_accuracy']:5.1f}%  ({out['cpu_seconds']:.0f} CPU-s, {sim.executor.name}"
        f"{'' if status == 'completed' else ', ' + status[:40]})",
        flush=True,
    )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir")
    p.add_argument("--rounds", type=int, default=24, help="rounds in the 1-class setting (paper: 10,000)")
    p.add_argument("--rounds-other", type=int, default=6, help="rounds in the 2-class and Dir(0.1) settings")
    p.add_argument("--settings", default="1class,2class,dir0.1",
                   help="comma list of " + ", ".join(SETTINGS) + " ('central' runs --rounds, as 1class)")
    p.add_argument("--norms", default=",".join(NORMS))
    p.add_argument("--lr", type=float, default=0.01, help="client lr (paper: 0.01 on CIFAR-10)")
    p.add_argument("--momentum", type=float, default=0.0,
                   help="SGD momentum (paper: 0 for clients; App. C.3 may use 0.9 for the centralised curve)")
    p.add_argument("--sweep-lrs", default="", help="extra lrs for the 1-class lr-robustness sweep, e.g. 0.003,0.03")
    p.add_argument("--sweep-norms", default="none,ln,fn")
    p.add_argument("--sweep-rounds", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=8)
    p.add_argument("--test-per-class", type=int, default=200, help="test images per class used for evaluation (paper: all 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--input-norm", action="store_true", help="keep the loader's mean/std standardisation (paper: none)")
    p.add_argument("--out", default="benchmarks/results/ln_fn.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    root = data_dir(args.data_dir)
    base = {
        "dataset": "cifar10", "data_dir": root, "num_clients": 10, "model": "ln_cnn", "method": "fedavg",
        "local_steps": 10, "batch_size": 32, "drop_last": True, "momentum": args.momentum, "weight_decay": 0.0,
        "augment": True, "seed": args.seed, "threads": 1, "checkpoint_every": 0,
    }
    result = {"benchmark": "ln_fn", "args": vars(args), "base_config": base, "runs": {}}
    cpu_start = time.process_time()
    norms = [n for n in args.norms.split(",") if n]

    def save() -> None:
        result["total_cpu_seconds"] = time.process_time() - cpu_start
        write_result(args.out, result)

    for setting in [s for s in args.settings.split(",") if s]:
        part = SETTINGS[setting]
        cfg0 = {**base, **part}
        data = build_federated_data(
            "cifar10", num_clients=cfg0["num_clients"], partition_name=part["partition"], seed=args.seed, data_dir=root,
            augment=True, **{k: v for k, v in part.items() if k != "partition" and k not in RUN_KEYS},
        )
        data = subset_test(data, args.test_per_class, args.seed)
        if not args.input_norm:
            data = to_unit_pixels(data)
        rounds = args.rounds if setting in ("1class", "central") else args.rounds_other
        eval_at = set(range(args.eval_every, rounds + 1, args.eval_every))
        print(f"{setting}: {rounds} rounds, clients' train sizes {data.client_sizes().tolist()}", flush=True)
        for norm in norms:
            result["runs"].setdefault(setting, {})[f"{norm}@{args.lr:g}"] = run_one(cfg0, data, norm, rounds, args.lr, eval_at)
            save()
        if setting == "1class" and args.sweep_lrs:
            for lr in [float(v) for v in args.sweep_lrs.split(",") if v]:
                for norm in [n for n in args.sweep_norms.split(",") if n]:
                    result["runs"]["1class"][f"{norm}@{lr:g}"] = run_one(cfg0, data, norm, args.sweep_rounds, lr, set())
                    save()

    # Tables (the paper gives no number for "central", so it has only its per-run lines above).
    settings = [s for s in args.settings.split(",") if s and s != "central"]
    if settings:
        print("\nmean client accuracy (%), this run (early rounds) | paper, final round of 10,000 (CNN, Tables 2/4) | paper ResNet-18 (Table 1)")
        print("| method | " + " | ".join(f"{s} (ours)" for s in settings) + " | " + " | ".join(f"{s} (paper CNN)" for s in settings)
              + " | " + " | ".join(f"{s} (paper ResNet)" for s in settings) + " |")
        print("|---" * (1 + 3 * len(settings)) + "|")
    idx = {"1class": 0, "2class": 1, "dir0.1": 2}
    for norm in norms if settings else []:
        ours = []
        for s in settings:
            run = result["runs"].get(s, {}).get(f"{norm}@{args.lr:g}")
            ours.append("n/a" if run is None else f"{100 * run['final_mean_client_accuracy']:.1f}")
        paper = [f"{PAPER_CNN[norm][idx[s]]:.1f}" for s in settings]
        resnet = [f"{PAPER_RESNET[norm][idx[s]]:.1f}" if norm in PAPER_RESNET else "-" for s in settings]
        print(f"| {LABEL[norm]} | " + " | ".join(ours + paper + resnet) + " |")
    if args.sweep_lrs:
        lrs = [args.lr] + [float(v) for v in args.sweep_lrs.split(",") if v]
        print(f"\nlr robustness, 1 class/client, mean client accuracy (%) after {args.sweep_rounds} rounds (the lr={args.lr:g} row uses its {args.rounds}-round curve at that round when evaluated there)")
        print("| method | " + " | ".join(f"lr={lr:g}" for lr in lrs) + " |")
        print("|---" * (1 + len(lrs)) + "|")
        for norm in [n for n in args.sweep_norms.split(",") if n]:
            cells = []
            for lr in lrs:
                run = result["runs"]["1class"].get(f"{norm}@{lr:g}")
                if run is None:
                    cells.append("n/a")
                    continue
                at = [c for c in run["curve"] if c["round"] == args.sweep_rounds]
                cells.append(f"{100 * at[0]['mean_client_accuracy']:.1f}" if at else f"{100 * run['final_mean_client_accuracy']:.1f} (r{run['rounds']})")
            print(f"| {LABEL[norm]} | " + " | ".join(cells) + " |")
    save()
    print(f"total CPU time: {result['total_cpu_seconds'] / 60:.1f} min")


if __name__ == "__main__":
    main()
