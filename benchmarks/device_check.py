"""Does every method run on a GPU, and compute there what it computes on the CPU?

For each case (a method with its norm and model, on one executor) two rounds run twice from the
same seed: once on the CPU, once on ``--device``. Batches and augmentation are drawn on the CPU
in both, so the two runs see the same samples and the global states must agree to rounding.
The check runs in float64 by default: these tiny settings (4 samples per batch, random images)
are ill-conditioned, and in float32 the CPU's and a GPU's different summation orders grow from
1e-7 to 1e-3 and beyond within two rounds (seen between the CPU's own memory formats too),
which hides a real error among rounding. The script prints the largest difference, each device's seconds per round,
and the traceback of any case that fails. The data are random 3-channel images, so
no dataset is needed.

    python benchmarks/device_check.py                       # every case, on cuda
    python benchmarks/device_check.py --only hbn,fedtan --json out.json

A case passes when the run finishes on the device and its largest relative difference from the
CPU run is below ``--tol``.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks.harness import write_result  # noqa: E402

from fednorm.config import ExperimentConfig  # noqa: E402
from fednorm.data.datasets import DatasetInfo  # noqa: E402
from fednorm.data.federated import FederatedData  # noqa: E402
from fednorm.engine.simulator import Simulation  # noqa: E402

# (id, config overrides): the rows of the reproduction tables, on small models where the paper's
# is large; each runs on both executors unless it names one.
CASES: list[tuple[str, dict[str, Any]]] = [
    ("fedavg_bn", dict(model="simple_cnn", norm="bn", method="fedavg")),
    ("fedavg_gn", dict(model="simple_cnn", norm="gn", norm_args={"num_groups": 2}, method="fedavg")),
    ("fedavg_ln", dict(model="simple_cnn", norm="ln", method="fedavg")),
    ("fedfn", dict(model="simple_cnn", norm="none", model_args={"fn_before_fc": True}, method="fedavg")),
    ("fixbn", dict(model="simple_cnn", norm="bn", method="fixbn", method_args={"switch_round": 1})),
    ("fbn_literal", dict(model="simple_cnn", norm="fbn", method="fbn", method_args={"mode": "literal", "initial_pass": False})),
    ("fbn_exact", dict(model="simple_cnn", norm="fbn", method="fbn")),
    # dropout masks differ by device, executor and memory format (docs/reliability.md): off here
    ("fbn_dsgd", dict(model="fbn_cnn", model_args={"dropout": 0.0}, norm="fbn", method="fbn", dsgd=True, momentum=0.99,
                      local_steps=None)),
    ("hbn_paper", dict(model="simple_cnn", norm="hbn", method="hbn", method_args={"preset": "paper"})),
    ("hbn_default", dict(model="simple_cnn", norm="hbn", method="hbn")),
    ("hbn_code", dict(model="simple_cnn", norm="hbn", method="hbn", method_args={"preset": "reference-code"})),
    ("fedtan", dict(model="resnet20", norm="bn", method="fedtan", momentum=0.9)),
    ("fedtan_forward", dict(model="resnet20", norm="bn", method="fedtan_forward")),
    ("fedbn", dict(model="simple_cnn", norm="bn", method="fedbn")),
    ("silobn", dict(model="simple_cnn", norm="bn", method="silobn")),
    ("fedprox", dict(model="simple_cnn", norm="bn", method="fedavg", client_opt="fedprox", client_opt_args={"mu": 0.01})),
    ("ln_cnn_fedln", dict(model="ln_cnn", norm="ln", method="fedavg")),
    ("ln_cnn_fedfn", dict(model="ln_cnn", norm="fn", method="fedavg")),
]


def shaped_data(num_clients: int, per_client: int, seed: int = 0) -> FederatedData:
    """Random 3×16×16 images (CIFAR-10 channels; half the side keeps float64 on the CPU fast) with unequal clients (the last one has fewer samples)."""
    g = torch.Generator().manual_seed(seed)
    sizes = [per_client] * (num_clients - 1) + [per_client - per_client // 4]
    n = sum(sizes)
    info = DatasetInfo(name="shapes", num_classes=10, in_channels=3, image_size=(16, 16),
                       mean=(0.5,) * 3, std=(0.25,) * 3, augment=True, crop_padding=4)
    x = torch.randn(n, 3, 16, 16, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    bounds = torch.tensor([0, *sizes]).cumsum(0).tolist()
    clients = [torch.arange(bounds[i], bounds[i + 1]) for i in range(num_clients)]
    tx, ty = x[:64].clone(), y[:64].clone()
    return FederatedData(info, x, y, tx, ty, clients, [torch.arange(i * 8, i * 8 + 8) for i in range(num_clients)], augment=True)


def run_case(overrides: dict[str, Any], device: str, executor: str, rounds: int,
             dtype: str = "float64") -> tuple[dict[str, torch.Tensor], float, float]:
    kw = dict(dataset="cifar10", num_clients=3, rounds=rounds, local_steps=2, batch_size=4, lr=0.05, augment=True,
              eval_every=rounds, dtype=dtype, seed=3, executor=executor, device=device)
    kw.update(overrides)
    if kw.get("local_steps") is None:
        kw.pop("local_steps")
    cfg = ExperimentConfig(**kw)
    sim = Simulation(cfg, data=shaped_data(3, 16))
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        sim.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    acc = sim.history[-1]["test_accuracy"] if sim.history else float("nan")
    return {k: v.detach().cpu() for k, v in sim.global_state.items()}, min(times), acc


def compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, str]:
    worst, where = 0.0, ""
    for k, v in a.items():
        if not v.is_floating_point():
            if not torch.equal(v, b[k]):
                return float("inf"), k
            continue
        d = float((v - b[k]).abs().max() / v.abs().max().clamp_min(1e-12))
        if d > worst or d != d:
            worst, where = d, k
    return worst, where


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--only", help="comma-separated case ids (default: all)")
    p.add_argument("--executors", default="sequential,vectorized")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    p.add_argument("--tol", type=float, help="largest relative difference that passes (default: 1e-3 in float32, 1e-9 in float64)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (one: a loaded CPU's thread pools stall small ops)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    unknown = sorted((set(args.only.split(",")) if args.only else set()) - {name for name, _ in CASES})
    if unknown:
        p.error(f"unknown case(s) {', '.join(unknown)}; valid: {', '.join(name for name, _ in CASES)}")
    torch.set_num_threads(args.threads)
    tol = args.tol if args.tol is not None else (1e-3 if args.dtype == "float32" else 1e-9)
    torch.backends.cuda.matmul.allow_tf32 = False  # the comparison is with the CPU's float32
    torch.backends.cudnn.allow_tf32 = False
    only = set(args.only.split(",")) if args.only else None
    results, failed = [], 0
    for name, overrides in CASES:
        if only and name not in only:
            continue
        for executor in args.executors.split(","):
            if executor == "sequential" and name.startswith("fedtan"):
                continue  # lockstep methods run stacked only
            row: dict[str, Any] = {"case": name, "executor": executor}
            try:
                ref, t_cpu, _ = run_case(overrides, "cpu", executor, args.rounds, args.dtype)
                got, t_dev, acc = run_case(overrides, args.device, executor, args.rounds, args.dtype)
                diff, where = compare(ref, got)
                row.update(ok=diff < tol, max_rel_diff=diff, worst_tensor=where, s_per_round_cpu=t_cpu,
                           s_per_round_device=t_dev)
            except Exception as exc:  # report and go on: the point is the list of what fails
                row.update(ok=False, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
            failed += not row["ok"]
            status = "ok  " if row["ok"] else "FAIL"
            detail = (f"max rel diff {row['max_rel_diff']:.1e} ({row['worst_tensor']}), "
                      f"{row['s_per_round_cpu']:.2f} s/round cpu, {row['s_per_round_device']:.2f} s/round {args.device}"
                      if "max_rel_diff" in row else row["error"])
            print(f"{status} {name:15s} {executor:10s} {detail}", flush=True)
            if "traceback" in row:
                print(row["traceback"], flush=True)
            results.append(row)
    print(f"{len(results) - failed} of {len(results)} cases pass")
    if args.json:
        write_result(args.json, {"device": args.device, "torch": torch.__version__, "results": results})
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
