"""Several runs stacked into one computation against the same runs one after another.

R runs of one setting that differ in seed (so in partition, client sampling, batches and
augmentation), trained for ``--rounds`` rounds each, timed both ways interleaved over
``--repeats`` repeats: ``stacked`` (:func:`fednorm.api.run_set.run_stacked`, every run's
clients in one stacked model per round) and ``one after another`` (:func:`fednorm.run` per run).
The client data is built once per run outside the timing (as a suite reuses it); evaluation runs
once, at the end. The ratio is the median of the per-repeat paired ratios of samples per second.

    python benchmarks/stacked_runs.py --data-dir ../shared/data --runs 3 --rounds 2 --repeats 3
    python benchmarks/stacked_runs.py --dataset digits --runs 3 --rounds 5 --repeats 5
    python benchmarks/stacked_runs.py --synthetic --runs 10 --rounds 1 --repeats 3 --device cuda

``--synthetic`` times on random images in CIFAR-10's shape (for a machine the data cannot reach).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks._common import data_dir, write_synthetic_cifar10  # noqa: E402
from benchmarks.harness import interleaved, print_row, write_result  # noqa: E402

from fednorm import api  # noqa: E402
from fednorm.config import ExperimentConfig  # noqa: E402
from fednorm.data.federated import federated_data_from_config  # noqa: E402
from fednorm.api.run_set import run_stacked  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir")
    ap.add_argument("--synthetic", action="store_true",
                    help="random images in CIFAR-10's npz layout, written to a temporary folder (timing only)")
    ap.add_argument("--dataset", default="cifar10")
    ap.add_argument("--model", default="simple_cnn")
    ap.add_argument("--norm", default="bn")
    ap.add_argument("--method", default="fedavg")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="torch device of every run, e.g. cuda")
    ap.add_argument("--out", default="benchmarks/results/stacked_runs.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.synthetic:
        if args.dataset != "cifar10":
            ap.error("--synthetic writes CIFAR-10's layout: leave --dataset at cifar10")
        args.data_dir = write_synthetic_cifar10(tempfile.mkdtemp(prefix="fednorm_synthetic_"))
    # HBN Table 1's setting (100 clients, Dirichlet 0.6, 10 per round, one local epoch at B = 4)
    base = dict(dataset=args.dataset, data_dir=data_dir(args.data_dir) if args.dataset != "digits" else None,
                partition="dirichlet", alpha=0.6, min_size=args.batch_size, num_clients=100 if args.dataset != "digits" else 10,
                clients_per_round=10 if args.dataset != "digits" else 5, model=args.model, norm=args.norm, method=args.method,
                batch_size=args.batch_size, drop_last=True, local_epochs=1, lr=0.01, momentum=0.9, max_grad_norm=10.0,
                rounds=args.rounds, eval_every=10**6, threads=args.threads, device=args.device)
    configs = [ExperimentConfig(**base, seed=s) for s in range(args.runs)]
    datas = [federated_data_from_config(c) for c in configs]

    def stacked() -> int:
        results, info = run_stacked(configs, data=datas, write=False)
        assert info["joint_rounds"] == args.rounds, info
        return sum(r.summary["samples_trained"] for r in results)

    def one_by_one() -> int:
        return sum(api.run(c, data=d, write=False, progress=False).summary["samples_trained"] for c, d in zip(configs, datas))

    timing = interleaved({"stacked": stacked, "one after another": one_by_one}, args.repeats, warmup=0,
                         baseline="one after another")
    rates = {name: timing.rate_and_cpu(name) for name in timing.runs}
    ratio = timing.ratio("stacked", "one after another", "rate")
    print_row(f"{args.runs} x {args.method}+{args.norm} {args.model} on {args.dataset}, B={args.batch_size}, {args.rounds} rounds, "
              f"{args.device}",
              timing.describe() + f" | paired: stacked / one after another {ratio:.2f}x")
    write_result(args.out, {"benchmark": "stacked_runs", "args": vars(args),
                            "samples_per_s": {n: w for n, (w, _) in rates.items()},
                            "samples_per_cpu_s": {n: c for n, (_, c) in rates.items()},
                            "stacked / one after another": ratio, "raw": timing.runs})


if __name__ == "__main__":
    main()
