"""FBN's DSGD checkpoint with the clients' mean momentum (``fednorm.engine.compact``): its size, and
how far a float32 run resumed from it drifts from the uninterrupted run, beside the drift that float
rounding alone causes (the same run on the other executor).

Runs the FBN accuracy table's FBN cell at γ = 0 (CIFAR-10, 10 clients, DSGD, batch 50, momentum
0.99) for ``--steps`` steps four ways: uninterrupted (sequential executor), resumed at
``--resume-at`` from its plain checkpoint, resumed from the compacted checkpoint, and
uninterrupted on the vectorized executor. Prints one row per comparison with the relative
distance of the global weights, ``||a - b|| / ||a||`` over all floating tensors, and the
checkpoint sizes; ``--write`` saves ``benchmarks/results/compact_checkpoint.json``.

    OMP_NUM_THREADS=1 python benchmarks/compact_checkpoint.py [--steps 6 --resume-at 3] [--write]
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._common import data_dir  # noqa: E402


def _config(data: str, steps: int, executor: str) -> dict:
    from fednorm.reproduce import load_paper, plan

    (table,) = load_paper("fbn", ["accuracy"])
    (spec,) = plan([table], scale="full", out=Path("/tmp/compact_checkpoint"), data_dir=data, rows=["fbn"], columns=["gamma0"])
    return {**spec.config, "rounds": steps, "eval_every": 10**6, "eval_last_rounds": 0, "checkpoint_every": 0,
            "out": None, "executor": executor, "threads": torch.get_num_threads()}


def _sim(cfg: dict):
    from fednorm.config import ExperimentConfig
    from fednorm.engine.simulator import Simulation

    return Simulation(ExperimentConfig(**cfg))


def _steps(sim, until: int):
    while sim.server_round < until:
        sim.step()
    return sim


def _bytes(state: dict) -> int:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.tell()


def _reload(cfg: dict, state: dict):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    sim = _sim(cfg)
    sim.load_state_dict(torch.load(buf, weights_only=True))
    return sim


def _distance(a, b) -> float:
    keys = [k for k, v in a.global_state.items() if v.is_floating_point()]
    num = sum(float((a.global_state[k].double() - b.global_state[k].double()).pow(2).sum()) for k in keys)
    den = sum(float(a.global_state[k].double().pow(2).sum()) for k in keys)
    return (num / den) ** 0.5


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--resume-at", type=int, default=3)
    p.add_argument("--data-dir")
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    from fednorm.engine.compact import compact_checkpoint

    data = data_dir(args.data_dir)
    seq, vec = _config(data, args.steps, "sequential"), _config(data, args.steps, "vectorized")
    start = time.perf_counter()
    full = _steps(_sim(seq), args.steps)
    half = _steps(_sim(seq), args.resume_at)
    state = half.state_dict()
    plain_bytes = _bytes(state)
    plain = _steps(_reload(seq, state), args.steps)
    info = compact_checkpoint(state, half.data.client_sizes().tolist())
    compacted_bytes = _bytes(state)
    compacted = _steps(_reload(seq, state), args.steps)
    other = _steps(_sim(vec), args.steps)
    where = f"{platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)"
    rows = [
        ("resumed from the plain checkpoint vs uninterrupted", _distance(full, plain)),
        ("resumed from the mean momentum vs uninterrupted", _distance(full, compacted)),
        ("vectorized vs sequential executor, uninterrupted", _distance(full, other)),
    ]
    print(f"FBN accuracy table, FBN at gamma 0 (10 clients, DSGD), float32, {args.steps} steps, resumed at "
          f"{args.resume_at}; {where}")
    for label, d in rows:
        print(f"  {label:55s} relative distance of the global weights {d:.3e}")
    print(f"  checkpoint: {plain_bytes / 1e6:.1f} MB plain, {compacted_bytes / 1e6:.1f} MB with the mean momentum "
          f"({info.clients} clients; {time.perf_counter() - start:.0f} s)")
    if args.write:
        out = Path(__file__).resolve().parent / "results" / "compact_checkpoint.json"
        out.write_text(json.dumps({"setting": "fbn accuracy, fbn row, gamma0, float32", "steps": args.steps,
                                   "resume_at": args.resume_at, "machine": where,
                                   "distances": {label: d for label, d in rows},
                                   "bytes": {"plain": plain_bytes, "compacted": compacted_bytes}}, indent=2) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
