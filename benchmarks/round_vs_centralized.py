"""One federated round against centralized training of the same model at the same batch size.

The foundation issue's reference measurement: CIFAR-10, 100 clients (Dirichlet 0.6), 10
sampled per round, HBN's Simple-CNN, batch 4, SGD momentum 0.9, random crop + flip. A
fednorm round (sequential executor) and a plain centralized PyTorch loop over the same number
of samples run interleaved in one process, ``--repeats`` times; the medians are compared, and
beside them the median of the per-repeat paired ratios.

    python benchmarks/round_vs_centralized.py --data-dir ../shared/data

The centralized loop is the fastest plain loop we know (tensors in memory, one index_select
per batch, the same augmentation), so the ratio measures the engine's overhead, not a
DataLoader's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks._common import data_dir, train_centralized  # noqa: E402
from benchmarks.harness import Record, interleaved, print_row, write_result  # noqa: E402

from fednorm.config import ExperimentConfig  # noqa: E402
from fednorm.engine.simulator import Simulation  # noqa: E402


def centralized(sim: Simulation, num_samples: int, batch_size: int, lr: float, seed: int, channels_last: bool = False) -> int:
    """Plain PyTorch: the same model and augmentation, shuffled batches of the whole training set."""
    sim.model.load_state_dict(sim.global_state)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(sim.data.train_x), generator=g)
    batches = [perm[i * batch_size : (i + 1) * batch_size] for i in range(num_samples // batch_size)]
    return train_centralized(sim.model, sim.data.train_x, sim.data.train_y, batches, lr=lr, generator=g,
                             augment=True, channels_last=channels_last)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--num-clients", type=int, default=100)
    ap.add_argument("--clients-per-round", type=int, default=10)
    ap.add_argument("--model", default="simple_cnn")
    ap.add_argument("--norm", default="bn")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--executor", default="auto", choices=["auto", "sequential", "vectorized"])
    ap.add_argument("--out", default=None, help="default: benchmarks/results/round_vs_centralized_<executor>_b<B>.json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    cfg = ExperimentConfig(
        dataset="cifar10", data_dir=data_dir(args.data_dir), partition="dirichlet", alpha=0.6,
        num_clients=args.num_clients, clients_per_round=args.clients_per_round, model=args.model, norm=args.norm,
        batch_size=args.batch_size, lr=0.01, momentum=0.9, rounds=10_000, eval_every=10_000, executor=args.executor,
    )
    print(f"building {cfg.num_clients} clients of CIFAR-10 ...", flush=True)
    sim = Simulation(cfg)
    rounds: list[int] = []  # the server round of each repeat's fednorm round, which runs first

    def fed() -> int:
        rounds.append(sim.step().server_round)
        return sim.executor.last_samples_seen

    def central(channels_last: bool) -> int:  # this repeat's samples; the repeat's index seeds both loops
        return centralized(sim, sim.executor.last_samples_seen, args.batch_size, cfg.lr, len(rounds) - 1, channels_last)

    def progress(rep: int, r: dict[str, Record]) -> None:
        print(f"repeat {rep + 1}: round {rounds[-1]} with {r['fednorm']['samples']} samples in {r['fednorm']['wall']:.2f}s "
              f"({r['fednorm']['rate']:.0f} samples/s); centralized {r['centralized']['rate']:.0f} samples/s "
              f"(channels-last {r['centralized CL']['rate']:.0f})", flush=True)

    timing = interleaved({"fednorm": fed, "centralized": lambda: central(False), "centralized CL": lambda: central(True)},
                         args.repeats, warmup=0, baseline="centralized", on_repeat=progress)
    fed_rate, cen, cl = (timing.median(n, "rate") for n in ("fednorm", "centralized", "centralized CL"))
    paired, paired_cl = timing.ratio("fednorm", "centralized", "rate"), timing.ratio("fednorm", "centralized CL", "rate")
    print_row(f"median over {args.repeats}:",
              f"fednorm round ({sim.executor.name}) {fed_rate:.0f} samples/s, centralized {cen:.0f} "
              f"samples/s (channels-last {cl:.0f}); ratio {fed_rate / cen:.3f}x ({fed_rate / cl:.3f}x vs channels-last), "
              f"paired {paired:.3f}x ({paired_cl:.3f}x); one round takes {timing.median('fednorm'):.2f}s")
    out = args.out or f"benchmarks/results/round_vs_centralized_{sim.executor.name}_b{args.batch_size}.json"
    write_result(out, {
        "benchmark": "round_vs_centralized",
        "config": cfg.model_dump(mode="json"),
        "fednorm_samples_per_s": timing.values("fednorm", "rate"),
        "centralized_samples_per_s": timing.values("centralized", "rate"),
        "centralized_channels_last_samples_per_s": timing.values("centralized CL", "rate"),
        "executor": sim.executor.name,
        # ratios of the medians, as docs/performance.md quotes them; the paired ratios beside them
        "ratio_vs_channels_last": fed_rate / cl,
        "round_seconds": timing.values("fednorm"),
        "samples_per_round": timing.values("fednorm", "samples"),
        "ratio_median": fed_rate / cen,
        "ratio_paired": paired,
        "ratio_vs_channels_last_paired": paired_cl,
        "raw": timing.runs,
    })


if __name__ == "__main__":
    main()
