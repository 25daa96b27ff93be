"""The torch.distributed runtime against the in-process simulator on the same config.

Runs one config with ``fednorm run`` (one process) and with ``fednorm launch --nproc N`` for each
N, and reports side by side: end-to-end seconds (process start to exit, including torchrun and
imports), the run's own wall seconds (rank 0's ``summary.json``: rounds + evaluation, collectives
included), their ratios to the in-process run, and the largest difference of any evaluation's
test accuracy or loss (must be float rounding).

    python benchmarks/distributed.py --nprocs 2 --rounds 5
    python benchmarks/distributed.py --nprocs 2,4 --method fedtan --rounds 5     # on a machine with more cores

Each of the N processes gets cores // N intra-op threads and the in-process run all of the cores
(or ``--threads``), so the comparison is at an equal CPU budget. On a busy machine, more threads
than free cores slows PyTorch down sharply (spinning threads): compare on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks.harness import print_row, write_result  # noqa: E402


def _run(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nprocs", default="2", help="comma-separated process counts (default: 2)")
    ap.add_argument("--method", default="fedbn")
    ap.add_argument("--norm", default="bn")
    ap.add_argument("--model", default="simple_cnn")
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--data-dir")
    ap.add_argument("--num-clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                    help="float64 shows that the metrics agree to rounding; in float32 hundreds of SGD steps "
                         "amplify summation-order differences (a rank stacks its clients, not the round's)")
    ap.add_argument("--threads", type=int, help="intra-op threads of the in-process run (default: all cores)")
    ap.add_argument("--out", default="benchmarks/results/distributed.json")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    common = ["--dataset", args.dataset, "--num-clients", str(args.num_clients), "--rounds", str(args.rounds),
              "--method", args.method, "--norm", args.norm, "--model", args.model, "--batch-size", str(args.batch_size),
              "--local-epochs", str(args.local_epochs), "--dtype", args.dtype, "--eval-every", "1", "--checkpoint-every", "0", "--quiet"]
    if args.data_dir:
        common += ["--data-dir", args.data_dir]
    fednorm = [sys.executable, "-m", "fednorm.cli.main"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        threads = args.threads or cores
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        out = Path(tmp, "local")
        end_to_end = _run([*fednorm, "run", *common, "--threads", str(threads), "--out", str(out)], env)
        ref = json.loads((out / "summary.json").read_text())
        ref_hist = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        rows.append({"runtime": f"in-process, {threads} thread(s)", "processes": 1, "end_to_end_s": end_to_end, "run_s": ref["wall_seconds"],
                     "final_test_accuracy": ref["final_test_accuracy"], "max_metric_diff": 0.0})
        for n in (int(v) for v in args.nprocs.split(",")):
            threads = max(1, cores // n)
            env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
            out = Path(tmp, f"launch{n}")
            end_to_end = _run([*fednorm, "launch", "--nproc", str(n), *common, "--threads", str(threads), "--out", str(out)], env)
            s = json.loads((out / "summary.json").read_text())
            hist = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            diff = max(abs(a[k] - b[k]) for a, b in zip(hist, ref_hist) for k in ("test_accuracy", "test_loss"))
            rows.append({"runtime": f"fednorm launch --nproc {n}", "processes": n, "end_to_end_s": end_to_end,
                         "run_s": s["wall_seconds"], "final_test_accuracy": s["final_test_accuracy"], "max_metric_diff": diff})
    base = rows[0]
    torch.set_num_threads(args.threads or cores)  # so that the label and the result file name the in-process run's threads
    print_row(f"{args.method}+{args.norm}, {args.model} on {args.dataset}, {args.num_clients} clients, {args.rounds} rounds, "
              f"{args.dtype}", "(in-process threads; each of N launched processes: cores // N)")
    print(f"{'runtime':<26} {'end-to-end s':>12} {'x in-proc':>9} {'run s':>8} {'x in-proc':>9} {'final acc':>9} {'max diff':>9}")
    for r in rows:
        r["end_to_end_ratio"] = r["end_to_end_s"] / base["end_to_end_s"]
        r["run_ratio"] = r["run_s"] / base["run_s"]
        print(f"{r['runtime']:<26} {r['end_to_end_s']:>12.2f} {r['end_to_end_ratio']:>9.2f} {r['run_s']:>8.2f} "
              f"{r['run_ratio']:>9.2f} {100 * r['final_test_accuracy']:>8.2f}% {r['max_metric_diff']:>9.1e}")
    write_result(args.out, {"settings": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
