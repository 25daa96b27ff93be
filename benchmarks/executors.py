"""Vectorized vs sequential executor, beside centralized training at batch B and at batch K·B.

10 clients per round, each taking ``--steps`` local steps of batch B, on CIFAR-10 (or digits
with ``--dataset digits``). For each model and batch size, the variants run interleaved in one
process for ``--repeats`` repeats; every ratio is the median over repeats of the two variants'
samples/s in the same repeat (paired), and each variant's samples per CPU second is beside its
samples per wall second. Every row names the thread count and the machine (``--threads``, default 1):

- ``sequential``: fednorm's sequential executor (one working model, clients one by one);
- ``vectorized``: fednorm's vectorized executor (clients as a dimension of a stacked model);
- ``central B``: one model trained centrally at batch B on the same number of samples (plain
  NCHW batches, and ``central B CL`` with the channels-last batches fednorm uses);
- ``central KB``: one model at batch K·B, the bound for any client-batching scheme.

    python benchmarks/executors.py --data-dir ../shared/data
    python benchmarks/executors.py --models simple_cnn --batch-sizes 4 --repeats 5
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks._common import data_dir, train_centralized  # noqa: E402
from benchmarks.harness import interleaved, machine_label, print_row, write_result  # noqa: E402

from fednorm.config import ExperimentConfig  # noqa: E402
from fednorm.engine.simulator import Simulation  # noqa: E402


def central(sim: Simulation, batch: int, steps: int, seed: int, channels_last: bool = False) -> int:
    """Plain PyTorch at ``batch`` on random samples (optionally channels-last batches, as fednorm feeds them)."""
    sim.model.load_state_dict(sim.global_state)
    g = torch.Generator().manual_seed(seed)
    batches = [torch.randint(0, len(sim.data.train_x), (batch,), generator=g) for _ in range(steps)]
    return train_centralized(sim.model, sim.data.train_x, sim.data.train_y, batches, lr=0.01, generator=g,
                             augment=sim.data.augment, channels_last=channels_last)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir")
    ap.add_argument("--dataset", default="cifar10")
    ap.add_argument("--models", default="simple_cnn,resnet20")
    ap.add_argument("--batch-sizes", default="4,16")
    ap.add_argument("--norm", default="bn")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    ap.add_argument("--out", default="benchmarks/results/executors.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ddir = data_dir(args.data_dir) if args.dataset != "digits" else None
    rows = []
    data = None
    for model in args.models.split(","):
        for bsz in (int(b) for b in args.batch_sizes.split(",")):
            sims = {}
            for ex in ("sequential", "vectorized"):
                cfg = ExperimentConfig(
                    dataset=args.dataset, data_dir=ddir, partition="iid", num_clients=args.clients, model=model,
                    norm=args.norm, batch_size=bsz, local_steps=args.steps, lr=0.01, momentum=0.9,
                    rounds=10**6, eval_every=10**6, executor=ex,
                )
                sims[ex] = Simulation(cfg, data=data)
                data = sims[ex].data
            k, steps = args.clients, args.steps
            seq = sims["sequential"]

            def step(sim: Simulation) -> int:
                sim.step()
                return sim.executor.last_samples_seen

            rep = iter(range(10**9))
            timing = interleaved({
                "sequential": lambda: step(sims["sequential"]),
                "vectorized": lambda: step(sims["vectorized"]),
                "central B": lambda: central(seq, bsz, k * steps, next(rep)),
                "central B CL": lambda: central(seq, bsz, k * steps, next(rep), channels_last=True),
                "central KB": lambda: central(seq, k * bsz, steps, next(rep)),
            }, args.repeats, baseline="vectorized")
            rates = {name: timing.rate_and_cpu(name) for name in timing.runs}
            ratio = {f"vectorized / {b}": timing.ratio("vectorized", b, "rate") for b in timing.runs if b != "vectorized"}
            row = {
                "model": model, "batch_size": bsz, "clients": k, "steps": steps, "threads": torch.get_num_threads(),
                "machine": machine_label(),
                **{f"{name} samples/s": w for name, (w, _) in rates.items()},
                **{f"{name} samples/cpu-s": c for name, (_, c) in rates.items()},
                **ratio,
                "sequential / central B": timing.ratio("sequential", "central B", "rate"),
                "raw": timing.runs,
            }
            rows.append(row)
            print_row(f"{model:10s} B={bsz:<3d}", timing.describe()
                      + f" | paired: vec/seq {ratio['vectorized / sequential']:.2f}x  vec/plain loop (central B) "
                      f"{ratio['vectorized / central B']:.2f}x  vec/central KB (bound) {ratio['vectorized / central KB']:.2f}x")
    write_result(args.out, {"benchmark": "executors", "args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
