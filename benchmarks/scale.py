"""Scale: memory and time per round with 10, 100 and 1000 clients, 10 sampled per round.

Per-client state (FedBN's BatchNorm tensors in the client state bank) must grow linearly with
the number of clients that have trained, and unsampled clients must cost nothing else. Each
setting runs in a fresh subprocess so its peak resident memory is its own.

    python benchmarks/scale.py --data-dir ../shared/data
    python benchmarks/scale.py --dataset digits --clients 10,100,1000   # no files needed
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks._common import data_dir  # noqa: E402
from benchmarks.harness import interleaved, machine_label, measure, write_result  # noqa: E402


def child(args: argparse.Namespace) -> None:
    import torch

    from fednorm.config import ExperimentConfig
    from fednorm.engine.simulator import Simulation

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cfg = ExperimentConfig(
        dataset=args.dataset, data_dir=args.data_dir, partition="dirichlet", alpha=0.6, min_size=2,
        num_clients=args.num_clients, clients_per_round=10, model=args.model, norm="bn", method=args.method,
        batch_size=args.batch_size, local_steps=args.steps, lr=0.01, momentum=0.9,
        rounds=10**6, eval_every=10**6,
    )
    record, sim = measure(lambda: Simulation(cfg))
    setup = record["wall"]
    if args.fill_bank:  # every client holds its state, as after a long run
        for cid in range(args.num_clients):
            sim.bank.put(cid, sim.method.initial_client_state(cid, sim.global_state))
    rss_setup = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    timing = interleaved({"round": sim.step}, args.rounds, warmup=0)
    times, cpu = timing.values("round"), timing.values("round", "cpu")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({
        "num_clients": args.num_clients,
        "setup_s": setup,
        "round_s_median": statistics.median(times[1:] or times),  # the first round is a warm-up
        "round_cpu_s_median": statistics.median(cpu[1:] or cpu),
        "round_s": times,
        "raw": timing.runs,
        "clients_with_state": len(sim.bank),
        "bank_bytes": sim.bank.memory_bytes(),
        "bank_bytes_per_client": sim.bank.memory_bytes() / max(1, len(sim.bank)),
        "peak_rss_mb_start": rss0 / 1024,
        "peak_rss_mb_after_setup": rss_setup / 1024,
        "peak_rss_mb": rss / 1024,
        "executor": sim.executor.name,
        "torch_threads": torch.get_num_threads(),
        "machine_label": machine_label(),
    }))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir")
    ap.add_argument("--dataset", default="cifar10")
    ap.add_argument("--model", default="simple_cnn")
    ap.add_argument("--method", default="fedbn")
    ap.add_argument("--clients", default="10,100,1000")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--fill-bank", action="store_true", help="give every client its state before timing (default: only sampled clients)")
    ap.add_argument("--num-clients", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="benchmarks/results/scale.json")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    ddir = data_dir(args.data_dir) if args.dataset != "digits" else None
    rows = []
    for n in (int(c) for c in args.clients.split(",")):
        cmd = [sys.executable, __file__, "--child", "--num-clients", str(n), "--dataset", args.dataset, "--model", args.model,
               "--method", args.method, "--rounds", str(args.rounds), "--steps", str(args.steps), "--batch-size", str(args.batch_size)]
        if args.fill_bank:
            cmd.append("--fill-bank")
        if ddir:
            cmd += ["--data-dir", ddir]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        row = json.loads(out)
        rows.append(row)
        print(f"{n:5d} clients [{row['machine_label']}]: round {row['round_s_median']:.3f}s, {row['clients_with_state']} clients hold state, "
              f"bank {row['bank_bytes'] / 1e6:.3f} MB ({row['bank_bytes_per_client']:.0f} B/client), "
              f"peak RSS {row['peak_rss_mb']:.0f} MB (after setup {row['peak_rss_mb_after_setup']:.0f} MB)", flush=True)
    write_result(args.out, {"benchmark": "scale", "args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
