"""One round of every method beside FedAvg+BN and centralized training of the same samples.

Each variant is its own :class:`~fednorm.engine.simulator.Simulation` of the same setting (same
data, partition, seed, so its r-th round trains the same clients); after a warm-up round the
variants' rounds run interleaved (variant A round r, variant B round r, ..., then a plain PyTorch
loop over as many samples), ``--repeats`` times; every ratio is the median over repeats of the two
rounds' ratio in the same repeat (paired), and each round's CPU time is beside its wall time. A round here is
local training plus the method's client hooks and the server update; evaluation is timed
separately (one global evaluation of the test set, and HBN's statistics re-sync).

    python benchmarks/methods.py --setting digits --batch-size 4 --repeats 3
    python benchmarks/methods.py --setting cifar --data-dir ../shared/data --batch-size 4 --repeats 3

``digits``: the embedded digits, Dirichlet 0.3, 10 clients all training every round.
``cifar``: the HBN paper's CIFAR-10 setting (100 clients, Dirichlet 0.6, 10 per round, Simple-CNN,
crop + flip). Results: benchmarks/results/methods_<setting>_b<B>.json (docs/performance.md's
table is written from it by ``--markdown``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import data_dir, machine, machine_label, median, timed, train_centralized, write_result  # noqa: E402

from fednorm.config import ExperimentConfig  # noqa: E402
from fednorm.engine.simulator import Simulation  # noqa: E402

#: (label, config overrides): the papers' methods with their norms; the first is the reference.
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("FedAvg+BN", dict(method="fedavg", norm="bn")),
    ("FedAvg+GN", dict(method="fedavg", norm="gn")),
    ("FedAvg+LN", dict(method="fedavg", norm="ln")),
    ("FedBN", dict(method="fedbn", norm="bn")),
    ("SiloBN", dict(method="silobn", norm="bn")),
    ("FedTAN", dict(method="fedtan", norm="bn")),
    ("FixBN", dict(method="fixbn", norm="bn", method_args={"switch_round": 10**5})),  # naive-BN stage
    ("FBN", dict(method="fbn", norm="fbn")),
    ("HBN (paper preset)", dict(method="hbn", norm="hbn", method_args={"preset": "paper"})),
    ("HBN (default)", dict(method="hbn", norm="hbn")),
    # client optimizers and objectives, on FedAvg+BN
    ("FedProx", dict(method="fedavg", norm="bn", client_opt="fedprox", client_opt_args={"mu": 0.01})),
    ("SCAFFOLD", dict(method="fedavg", norm="bn", client_opt="scaffold")),
    ("MOON", dict(method="fedavg", norm="bn", client_opt="moon")),
    ("FedSAM", dict(method="fedavg", norm="bn", client_opt="fedsam")),
    ("FedDecorr", dict(method="fedavg", norm="bn", client_opt="feddecorr")),
]


def base_config(args: argparse.Namespace) -> dict[str, Any]:
    common = dict(batch_size=args.batch_size, lr=0.01, momentum=0.9, rounds=10**6, eval_every=10**6,
                  checkpoint_every=0, out=None, threads=args.threads, executor=args.executor)
    if args.setting == "digits":
        return dict(common, dataset="digits", partition="dirichlet", alpha=0.3, num_clients=10, model="simple_cnn")
    return dict(common, dataset="cifar10", data_dir=data_dir(args.data_dir), partition="dirichlet", alpha=0.6,
                min_size=4, num_clients=100, clients_per_round=10, model="simple_cnn", drop_last=True,
                max_grad_norm=10.0, augment=True)


def centralized(sim: Simulation, num_samples: int, batch_size: int, seed: int, augment: bool) -> int:
    """Plain PyTorch over the same number of samples: the reference model (FedAvg+BN), shuffled batches."""
    sim.model.load_state_dict(sim.global_state)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(sim.data.train_x), generator=g)
    batches = [perm[i * batch_size : (i + 1) * batch_size] for i in range(num_samples // batch_size)]
    return train_centralized(sim.model, sim.data.train_x, sim.data.train_y, batches, lr=0.01, generator=g, augment=augment)


def evaluation_seconds(sim: Simulation) -> float:
    """One evaluation as a run does it (the method's evaluation state, the global test set)."""
    t, _ = timed(sim.evaluate)
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setting", choices=["digits", "cifar"], default="digits")
    ap.add_argument("--data-dir")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--executor", default="auto", choices=["auto", "sequential", "vectorized"])
    ap.add_argument("--only", help="comma-separated labels to time (the reference FedAvg+BN is always timed)")
    ap.add_argument("--sequential-too", metavar="LABELS",
                    help="comma-separated labels also timed on the sequential executor, as 'LABEL (sequential)'")
    ap.add_argument("--out", default=None)
    ap.add_argument("--markdown", metavar="JSON", help="print the markdown table of a result file and exit")
    args = ap.parse_args()
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return
    torch.set_num_threads(args.threads)
    base = base_config(args)
    wanted = None if not args.only else {s.strip() for s in args.only.split(",")} | {"FedAvg+BN"}
    variants = [(label, kw) for label, kw in VARIANTS if wanted is None or label in wanted]
    for extra in ([] if not args.sequential_too else [s.strip() for s in args.sequential_too.split(",")]):
        kw = dict(VARIANTS)[extra]
        variants.append((f"{extra} (sequential)", {**kw, "executor": "sequential"}))
    sims: dict[str, Simulation] = {}
    for label, kw in variants:
        sims[label] = Simulation(ExperimentConfig(**{**base, **kw}))
        sims[label].step()  # warm-up round (first-call costs, HBN's initial pass)
        print(f"{label}: executor {sims[label].executor.name} {sims[label].executor_note}", flush=True)
    rounds: dict[str, list[float]] = {label: [] for label in sims}
    cpu: dict[str, list[float]] = {label: [] for label in sims}
    samples: dict[str, list[int]] = {label: [] for label in sims}
    cen_rates: list[float] = []
    for rep in range(args.repeats):
        for label, sim in sims.items():
            c0 = time.process_time()
            t, _ = timed(sim.step)
            cpu[label].append(time.process_time() - c0)
            rounds[label].append(t)
            samples[label].append(sim.executor.last_samples_seen)
        n = samples["FedAvg+BN"][-1]
        t_cen, n_cen = timed(lambda: centralized(sims["FedAvg+BN"], n, args.batch_size, rep, base.get("augment", False)))
        cen_rates.append(n_cen / t_cen)
        print(f"repeat {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in rounds.items())
              + f"; centralized {n_cen / t_cen:.0f} samples/s", flush=True)
    evals = {label: evaluation_seconds(sim) for label, sim in sims.items()}
    rows = []
    for label, sim in sims.items():
        rates = [n / s for n, s in zip(samples[label], rounds[label])]
        rows.append({
            "variant": label, "executor": sim.executor.name, "executor_note": sim.executor_note,
            "round_seconds": rounds[label], "round_median_s": median(rounds[label]),
            "round_cpu_median_s": median(cpu[label]),
            # paired: each repeat's ratio, then the median (a ratio of medians pairs unlike repeats)
            "vs_fedavg_bn": median([a / b for a, b in zip(rounds[label], rounds["FedAvg+BN"])]),
            "samples_per_s": median(rates), "vs_centralized": median([r / c for r, c in zip(rates, cen_rates)]),
            "evaluation_s": evals[label], "evaluation_vs_round": evals[label] / median(rounds[label]),
        })
    result = {
        "benchmark": "methods", "setting": args.setting, "batch_size": args.batch_size, "repeats": args.repeats,
        "config": {k: v for k, v in base.items() if k != "data_dir"}, "centralized_samples_per_s": cen_rates,
        "rows": rows, "machine": machine(), "threads": torch.get_num_threads(), "machine_label": machine_label(),
        "command": "python benchmarks/methods.py " + " ".join(sys.argv[1:]),
    }
    print()
    print(markdown(result))
    write_result(args.out or f"benchmarks/results/methods_{args.setting}_b{args.batch_size}.json", result)


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"`{result['command']}` ({result['setting']}, batch {result['batch_size']}, {result.get('machine_label', '')}; "
        f"medians of {result['repeats']} repeats, ratios paired per repeat; centralized "
        f"{median(result['centralized_samples_per_s']):.0f} samples/s)",
        "",
        "| method | executor | round (s) | round CPU (s) | vs FedAvg+BN | samples/s | vs centralized | one evaluation (s) | evaluation / round |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        cpu = r.get("round_cpu_median_s")
        lines.append(f"| {r['variant']} | {r['executor']} | {r['round_median_s']:.2f} | "
                     f"{'n/a' if cpu is None else f'{cpu:.2f}'} | {r['vs_fedavg_bn']:.2f}× | "
                     f"{r['samples_per_s']:.0f} | {r['vs_centralized']:.2f}× | {r['evaluation_s']:.2f} | "
                     f"{r['evaluation_vs_round']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
