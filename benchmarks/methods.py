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
crop + flip). Results: benchmarks/results/methods_<setting>_b<B>.json; benchmarks/tables.py renders
docs/performance.md's tables from them, and ``--markdown FILE`` prints one file's table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks._common import data_dir, train_centralized  # noqa: E402
from benchmarks.harness import Record, interleaved, measure, write_result  # noqa: E402
from benchmarks.tables import methods_table  # noqa: E402

from fednorm.config import ExperimentConfig  # noqa: E402
from fednorm.engine.simulator import Simulation  # noqa: E402

CENTRAL = "centralized"  # the plain PyTorch loop's variant

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
    return measure(sim.evaluate)[0]["wall"]


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
    reference = sims["FedAvg+BN"]
    seeds = iter(range(10**9))

    def one_round(sim: Simulation) -> int:
        sim.step()
        return sim.executor.last_samples_seen

    def central() -> int:  # as many samples as the reference's round of this repeat, which ran just before
        return centralized(reference, reference.executor.last_samples_seen, args.batch_size, next(seeds),
                           base.get("augment", False))

    def progress(rep: int, records: dict[str, Record]) -> None:
        print(f"repeat {rep + 1}: " + ", ".join(f"{k} {r['wall']:.2f}s" for k, r in records.items() if k != CENTRAL)
              + f"; centralized {records[CENTRAL]['rate']:.0f} samples/s", flush=True)

    rounds = {label: (lambda sim=sim: one_round(sim)) for label, sim in sims.items()}
    timing = interleaved({**rounds, CENTRAL: central}, args.repeats, warmup=0, baseline="FedAvg+BN", on_repeat=progress)
    evals = {label: evaluation_seconds(sim) for label, sim in sims.items()}
    rows = []
    for label, sim in sims.items():
        rows.append({
            "variant": label, "executor": sim.executor.name, "executor_note": sim.executor_note,
            "round_seconds": timing.values(label), "round_median_s": timing.median(label),
            "round_cpu_median_s": timing.median(label, "cpu"),
            # paired: each repeat's ratio, then the median (a ratio of medians pairs unlike repeats)
            "vs_fedavg_bn": timing.ratio(label, "FedAvg+BN"),
            "samples_per_s": timing.median(label, "rate"), "vs_centralized": timing.ratio(label, CENTRAL, "rate"),
            "evaluation_s": evals[label], "evaluation_vs_round": evals[label] / timing.median(label),
        })
    result = {
        "benchmark": "methods", "setting": args.setting, "batch_size": args.batch_size, "repeats": args.repeats,
        "config": {k: v for k, v in base.items() if k != "data_dir"},
        "centralized_samples_per_s": timing.values(CENTRAL, "rate"), "rows": rows, "raw": timing.runs,
    }
    result = write_result(args.out or f"benchmarks/results/methods_{args.setting}_b{args.batch_size}.json", result)
    print()
    print(markdown(result))


def markdown(result: dict[str, Any]) -> str:
    """The command, the setting and the table of one result file."""
    return (f"`{result['command']}` ({result['setting']}, batch {result['batch_size']}, {result.get('machine_label', '')}; "
            f"medians of {result['repeats']} repeats, ratios paired per repeat; centralized "
            f"{statistics.median(result['centralized_samples_per_s']):.0f} samples/s)\n\n" + methods_table(result))


if __name__ == "__main__":
    main()
