"""FedTAN's Table 1 at CPU scale: CIFAR-10, 5 clients, ResNet-20, E = 5 local steps.

Non-IID = 2 disjoint classes per client (client c holds classes 2c, 2c+1, the paper's split);
IID = equal random shares. Schemes: FedTAN, FedAvg+BN, FedAvg+Algorithm 2 (forward-only
sync), FedBN, SiloBN, FedAvg+GN and centralized BN (one client holding all data, batch N·B,
the same number of steps, so the same samples per round). Personalized methods (FedBN,
SiloBN) are scored as the paper does: every client's model on the whole test set, averaged.
Each scheme's wall time per round is measured in the same process.

    python benchmarks/fedtan.py --rounds 60 --batch-size 32            # CPU scale
    python benchmarks/fedtan.py --time-rounds 5 --batch-size 32        # wall time per round only
    python benchmarks/fedtan.py --rounds 10000 --batch-size 128 --lr 0.5  # the paper's setting

The paper runs 10,000 rounds at batch 128, lr 0.5 (momentum 0.9, weight decay 1e-4); a CPU
run is far shorter, so compare the ordering and the gaps, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks._common import data_dir  # noqa: E402
from benchmarks.harness import interleaved, measure, print_row, write_result  # noqa: E402

import fednorm  # noqa: E402
from fednorm.config import ExperimentConfig  # noqa: E402
from fednorm.data.federated import federated_data_from_config  # noqa: E402
from fednorm.engine.evaluation import evaluate  # noqa: E402
from fednorm.engine.simulator import Simulation  # noqa: E402

PAPER = {  # spec/001_fedtan.md Table 1: mean test accuracy (%), momentum 0.9, wd 1e-4
    "centralized+bn": (91.53, 91.53),
    "fedtan+bn": (91.26, 87.66),
    "fedavg+bn": (91.35, 45.90),
    "fedtan_forward+bn": (91.42, 76.01),
    "fedbn+bn": (90.74, 19.46),
    "silobn+bn": (91.31, 19.43),
    "fedavg+gn": (88.41, 82.66),  # Table 2, momentum
}

SCHEMES = [
    ("fedtan", "bn"), ("fedavg", "bn"), ("fedtan_forward", "bn"), ("fedbn", "bn"), ("silobn", "bn"),
    ("fedavg", "gn"), ("centralized", "bn"),
]


def config(args, setting: str, method: str, norm: str) -> ExperimentConfig:
    n = args.num_clients
    common = dict(
        dataset="cifar10", data_dir=data_dir(args.data_dir), model="resnet20", norm=norm, rounds=args.rounds,
        local_steps=args.local_steps, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay,
        eval_every=args.rounds, checkpoint_every=0, seed=args.seed, eval_batch_size=500, threads=args.threads,
    )
    if method == "centralized":
        return ExperimentConfig(**common, method="fedavg", partition="iid", num_clients=1, batch_size=args.batch_size * n)
    part = dict(partition="iid") if setting == "iid" else dict(
        partition="classes", classes_per_client=2, partition_args={"mode": "sequential"}
    )
    return ExperimentConfig(**common, **part, method=method, num_clients=n, batch_size=args.batch_size)


def score(sim: Simulation) -> dict[str, float]:
    """Test accuracy as the paper reports it; per-client models on the whole test set if personalized."""
    if not sim.method.personalized:
        res = evaluate(sim.global_model(), sim.data.test_x, sim.data.test_y, batch_size=500)
        return {"accuracy": res.accuracy}
    accs = [
        evaluate(sim.client_model(c), sim.data.test_x, sim.data.test_y, batch_size=500).accuracy
        for c in range(sim.data.num_clients)
    ]
    own = sim.evaluate()["mean_client_accuracy"]
    return {"accuracy": sum(accs) / len(accs), "own_split_accuracy": own}


def time_rounds(args) -> None:
    """Wall time per round of FedTAN and FedAvg+BN on the non-IID split, rounds interleaved so all
    see the same machine load; the first round of each (warm-up) is not counted. FedTAN runs as
    ``executor: auto`` picks it and, beside it, with every local step stacked (its steps 2..E in
    the stacked model too), so the split's gain is measured in the same run."""
    sims: dict[str, Simulation] = {}
    for label, method in (("fedtan", "fedtan"), ("fedtan_all_stacked", "fedtan"), ("fedavg", "fedavg")):
        # no round of the timing is a run's last or an evaluation round, which would evaluate the test set
        cfg = config(args, "noniid", method, "bn").model_copy(update={"rounds": 10**6, "eval_every": 10**6})
        sims[label] = Simulation(cfg, data=sims["fedtan"].data if sims else None)
        if label == "fedtan_all_stacked":
            sims[label].executor.sequential_after_sync = False
        sims[label].step()
    timing = interleaved({m: sim.step for m, sim in sims.items()}, args.time_rounds, warmup=0, baseline="fedavg")
    med = {m: timing.median(m) for m in sims}
    ratio = med["fedtan"] / med["fedavg"]
    note = sims["fedtan"].summary()["executor_note"] or sims["fedtan"].executor.name
    print_row(f"{args.time_rounds} rounds each, batch {args.batch_size}, E {args.local_steps}",
              f"median s/round: FedTAN {med['fedtan']:.3f} ({note}), FedTAN all stacked {med['fedtan_all_stacked']:.3f}, "
              f"FedAvg+BN {med['fedavg']:.3f} ({sims['fedavg'].summary()['executor_note'] or sims['fedavg'].executor.name}); "
              f"FedTAN / FedAvg+BN {ratio:.2f} (paired {timing.ratio('fedtan', 'fedavg'):.2f}), all stacked / FedAvg+BN "
              f"{med['fedtan_all_stacked'] / med['fedavg']:.2f} (paired {timing.ratio('fedtan_all_stacked', 'fedavg'):.2f})")
    # "ratio" and "ratio_all_stacked" are ratios of the medians, as docs/performance.md quotes them
    write_result(args.out, {"args": vars(args), "seconds_per_round": med, "ratio": ratio,
                            "ratio_all_stacked": med["fedtan_all_stacked"] / med["fedavg"],
                            "ratio_paired": timing.ratio("fedtan", "fedavg"),
                            "ratio_all_stacked_paired": timing.ratio("fedtan_all_stacked", "fedavg"),
                            "cpu_seconds_per_round": {m: timing.median(m, "cpu") for m in sims},
                            "times": {m: timing.values(m) for m in sims}, "raw": timing.runs})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--local-steps", type=int, default=5)
    ap.add_argument("--num-clients", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--settings", default="noniid,iid")
    ap.add_argument("--schemes", default=",".join(f"{m}+{n}" for m, n in SCHEMES))
    ap.add_argument("--time-rounds", type=int, default=0,
                    help="only time FedTAN against FedAvg+BN: this many rounds each, interleaved")
    ap.add_argument("--out", default="benchmarks/results/fedtan.json")
    args = ap.parse_args()
    if args.time_rounds:
        return time_rounds(args)

    wanted = [tuple(s.split("+")) for s in args.schemes.split(",")]
    rows = []
    data_cache: dict[tuple, object] = {}
    for setting in args.settings.split(","):
        for method, norm in wanted:
            if method == "centralized" and setting == "iid" and "noniid" in args.settings:
                continue  # the centralized run does not depend on the split
            cfg = config(args, setting, method, norm)
            key = (cfg.partition, cfg.num_clients, cfg.classes_per_client)
            if key not in data_cache:
                data_cache[key] = federated_data_from_config(cfg)
            sim = Simulation(cfg, data=data_cache[key])
            record, _ = measure(lambda: [sim.step() for _ in range(cfg.rounds)])
            seconds = record["wall"]
            s = score(sim)
            label = f"{method}+{norm}"
            row = {
                "setting": setting, "scheme": label, "rounds": cfg.rounds, **{k: round(100 * v, 2) for k, v in s.items()},
                "seconds_per_round": round(seconds / cfg.rounds, 3),
                "cpu_seconds_per_round": round(record["cpu"] / cfg.rounds, 3), "comm_rounds": sim.comm_rounds,
                "uplink_bytes_per_round": sim.uplink_bytes // cfg.rounds, "executor": sim.executor.name,
                "paper": PAPER.get(label, (None, None))[0 if setting == "iid" else 1],
            }
            rows.append(row)
            write_result(args.out, {"args": vars(args), "rows": rows, "partial": True})
            print(f"{setting:7s} {label:20s} acc {row['accuracy']:6.2f}%  (paper {row['paper']})  "
                  f"{row['seconds_per_round']:.2f} s/round  {sim.comm_rounds} comm rounds", flush=True)

    print("\n| setting | scheme | accuracy (%) | paper (%) | s/round | comm rounds/round |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['setting']} | {r['scheme']} | {r['accuracy']:.2f} | {r['paper']} | {r['seconds_per_round']:.2f} | "
              f"{r['comm_rounds'] // r['rounds']} |")
    write_result(args.out, {"args": vars(args), "rows": rows, "fednorm": fednorm.__version__})


if __name__ == "__main__":
    main()
