"""Vectorized vs sequential executor, beside centralized training at batch B and at batch K·B.

10 clients per round, each taking ``--steps`` local steps of batch B, on CIFAR-10 (or digits
with ``--dataset digits``). For each model and batch size, the variants run interleaved in one
process for ``--repeats`` repeats; medians of samples/s are compared:

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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import data_dir, machine, median, timed, train_centralized, write_result  # noqa: E402

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
    ap.add_argument("--out", default="benchmarks/results/executors.json")
    args = ap.parse_args()
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
            for sim in sims.values():  # warm-up
                sim.step()
            rates: dict[str, list[float]] = {"sequential": [], "vectorized": [], "central B": [], "central B CL": [], "central KB": []}
            for rep in range(args.repeats):
                for ex, sim in sims.items():
                    t, _ = timed(sim.step)
                    rates[ex].append(sim.executor.last_samples_seen / t)
                t, n = timed(lambda: central(sims["sequential"], bsz, k * steps, rep))
                rates["central B"].append(n / t)
                t, n = timed(lambda: central(sims["sequential"], bsz, k * steps, rep, channels_last=True))
                rates["central B CL"].append(n / t)
                t, n = timed(lambda: central(sims["sequential"], k * bsz, steps, rep))
                rates["central KB"].append(n / t)
            med = {name: median(v) for name, v in rates.items()}
            row = {
                "model": model, "batch_size": bsz, "clients": k, "steps": steps,
                **{f"{name} samples/s": v for name, v in med.items()},
                "vectorized / sequential": med["vectorized"] / med["sequential"],
                "vectorized / central B": med["vectorized"] / med["central B"],
                "vectorized / central B CL": med["vectorized"] / med["central B CL"],
                "vectorized / central KB (bound)": med["vectorized"] / med["central KB"],
                "sequential / central B": med["sequential"] / med["central B"],
                "raw": rates,
            }
            rows.append(row)
            print(
                f"{model:10s} B={bsz:<3d} seq {med['sequential']:7.0f}  vec {med['vectorized']:7.0f}  "
                f"central B {med['central B']:7.0f} (CL {med['central B CL']:7.0f})  central KB {med['central KB']:7.0f} samples/s | "
                f"vec/seq {row['vectorized / sequential']:.2f}x  vec/central {row['vectorized / central B']:.2f}x "
                f"(CL {row['vectorized / central B CL']:.2f}x)  "
                f"vec/bound {row['vectorized / central KB (bound)']:.2f}", flush=True,
            )
    write_result(args.out, {"benchmark": "executors", "args": vars(args), "rows": rows, "machine": machine()})


if __name__ == "__main__":
    main()
