"""FedBN's Digits comparison (spec/004_fedbn.md §2.1, Table 11 / Fig. 5) on the offline digits domains.

Five feature-shifted domains (``digits_domains``: MNIST, USPS, printed "synth", MNIST-M-style,
colour/contrast/inversion shift), one client per domain with 743 training samples each (the
paper's 10 % setting), each client tested on its own domain's 1,860 test images. The paper's
training setup: FedBN's digits CNN, SGD lr 0.01 without momentum, batch 32, one local epoch per
round, uniform averaging; all methods share the data, initialisation and batch order.
Methods: FedAvg (BN averaged, evaluated with the server model), SiloBN, FedBN, SingleSet
(local training only). The paper trains 100 rounds (code; "300" in the text); a CPU run uses
``--rounds`` (default 8), so accuracies are lower than the paper's and the table compares
methods at equal, small training budgets.

    python benchmarks/fedbn_digits.py --data-dir ../shared/data --rounds 8
    # or one process per method (same numbers; the table is rebuilt from every per-method file):
    python benchmarks/fedbn_digits.py --data-dir ../shared/data --rounds 8 --methods fedbn

Each method's result is written to ``results/fedbn_digits/<method>.json`` as soon as it is done;
the combined table and ``results/fedbn_digits.json`` are built from all per-method files of the
same settings.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks._common import data_dir  # noqa: E402
from benchmarks.harness import measure, write_result  # noqa: E402

from fednorm.config import ExperimentConfig  # noqa: E402
from fednorm.data.federated import federated_data_from_config  # noqa: E402
from fednorm.engine.simulator import Simulation  # noqa: E402

# spec/004_fedbn.md §3, Table 11 / Fig. 5 (mean of 5 runs, 743 samples per client, E = 1, 100 rounds).
PAPER = {
    "singleset": {"svhn": 65.25, "usps": 95.16, "synth": 80.31, "mnistm": 77.77, "mnist": 94.38, "mean": 82.57},
    "fedavg": {"svhn": 62.86, "usps": 95.56, "synth": 82.27, "mnistm": 76.85, "mnist": 95.87, "mean": 82.68},
    "fedprox": {"svhn": 63.08, "usps": 95.58, "synth": 82.34, "mnistm": 76.64, "mnist": 95.75, "mean": 82.68},
    "fedbn": {"svhn": 71.04, "usps": 96.97, "synth": 83.19, "mnistm": 78.33, "mnist": 96.57, "mean": 85.22},
}
METHODS = {
    "fedavg": {"method": "fedavg", "method_args": {"weighting": "uniform"}},
    "silobn": {"method": "silobn", "method_args": {"weighting": "uniform"}},
    "fedbn": {"method": "fedbn", "method_args": {"weighting": "uniform"}},
    "singleset": {"method": "singleset", "method_args": {}},
    "fedprox": {"method": "fedavg", "method_args": {"weighting": "uniform"}, "client_opt": "fedprox",
                "client_opt_args": {"mu": 0.01}},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--per-client", type=int, default=743)
    ap.add_argument("--methods", default="fedavg,silobn,fedbn,singleset")
    ap.add_argument("--seed", type=int, default=1)  # FedBN's code uses seed 1
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--combine-only", action="store_true", help="only rebuild the table from the per-method files")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "fedbn_digits.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    base = dict(
        dataset="digits_domains", data_dir=data_dir(args.data_dir), partition="domains", num_clients=5,
        partition_args={"per_client": args.per_client}, model="fedbn_cnn", norm="bn", lr=0.01, momentum=0.0,
        batch_size=32, local_epochs=1, rounds=args.rounds, eval_every=args.rounds, seed=args.seed,
        threads=args.threads, checkpoint_every=0,
    )  # fmt: skip
    data = federated_data_from_config(ExperimentConfig(**base))
    names = [data.domain_names[d] for d in data.client_domain]
    per_method = Path(args.out).with_suffix("")
    for label in [] if args.combine_only else args.methods.split(","):
        cfg = ExperimentConfig(**base, **METHODS[label])
        sim = Simulation(cfg, data=data)
        timing, losses = measure(lambda: [sim.step().train_loss for _ in range(cfg.rounds)])
        final = sim.history[-1]
        per_domain = {n: 100 * a for n, a in zip(names, final["client_accuracies"])}
        record = {
            "method": label,
            "per_domain": per_domain,
            "mean": 100 * final["mean_client_accuracy"],
            "train_loss": losses,
            "cpu_seconds": timing["cpu"],
            "wall_seconds": timing["wall"],
            "executor": sim.executor.name,
            "config": {k: v for k, v in cfg.model_dump(mode="json").items() if k != "data_dir"},
        }
        print(label, {k: round(v, 2) for k, v in per_domain.items()}, "mean", round(record["mean"], 2),
              f"cpu {record['cpu_seconds']:.0f}s", flush=True)
        write_result(per_method / f"{label}.json", record)

    # combine every per-method result of the same settings
    results: dict[str, dict] = {}
    for label in METHODS:
        path = per_method / f"{label}.json"
        if path.is_file():
            r = json.loads(path.read_text())
            same = all(r["config"].get(k) == v for k, v in base.items() if k not in ("data_dir", "threads"))
            if same:
                results[label] = r
    cols = names
    lines = ["| method | " + " | ".join(cols) + " | mean |", "|---" * (len(cols) + 2) + "|"]
    for label, r in results.items():
        lines.append(f"| {label} | " + " | ".join(f"{r['per_domain'][c]:.2f}" for c in cols) + f" | {r['mean']:.2f} |")
    paper_cols = ["mnist", "usps", "synth", "mnistm", "svhn"]
    lines += ["", "Paper (Table 11; the 'colour' column here stands where SVHN is, a different domain):",
              "| method | " + " | ".join(paper_cols) + " | mean |", "|---" * (len(paper_cols) + 2) + "|"]
    for label, p in PAPER.items():
        lines.append(f"| {label} | " + " | ".join(f"{p[c]:.2f}" for c in paper_cols) + f" | {p['mean']:.2f} |")
    table = "\n".join(lines)
    print(table)
    write_result(args.out, {
        "benchmark": "fedbn_digits", "config": {k: v for k, v in base.items() if k != "data_dir"},
        "domains": names, "results": results, "paper_table11": PAPER, "table_markdown": table,
        "fedbn_minus_fedavg_mean": results.get("fedbn", {}).get("mean", np.nan) - results.get("fedavg", {}).get("mean", np.nan),
        "total_cpu_seconds": sum(r["cpu_seconds"] for r in results.values()),
        "fedbn_minus_fedavg_per_domain": (
            {c: results["fedbn"]["per_domain"][c] - results["fedavg"]["per_domain"][c] for c in cols}
            if "fedbn" in results and "fedavg" in results else None
        ),
    })  # fmt: skip


if __name__ == "__main__":
    main()
