"""HBN's statistics pass at full scale: one train-mode pass against the exact layer-wise pass.

Rebuilds finished HBN runs from their config and latest checkpoint and evaluates the *same
weights* with the global statistics re-synced by the *same clients* the run's last evaluation
asked (the round's clients, ``eval_resync: round``), computed by

* the run's own pass (``sync_pass: single``: one exchange, each client's pass in ``stats_mode``;
  the presets' ``train``: earlier layers normalised with each batch's hybrid statistics), the
  figure the run recorded, reproduced here;
* the layer-wise pass (``sync_pass: layerwise``): one exchange per HBN layer, inference mode,
  earlier layers normalised with the statistics this pass pooled for them, i.e. the exact
  statistics of the evaluated model over those clients' data (HBN A.2's S(ω_g; D_g));
* for runs whose preset uploads something else than each client's pure statistics of all its
  data (``reference-code``), the layer-wise pass with ``stats_samples: all, upload: local``;

and the same for round T+1's clients where the run has that round (``final_sync``). With
``--resample K``, both passes again over K other seeded samples of as many clients (the samples of
``fednorm diagnose --resample``): how much each figure depends on which clients answered. Prints
a table, per-layer distances between the two pools, and writes
``benchmarks/results/hbn_statistics_pass.json`` with ``--write``.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/hbn_statistics_pass.py \\
        reproduction/hbn/table1/hbn__phi0.1/seed42 [--resample 20] [--test-limit 2000] [--write]
    python benchmarks/hbn_statistics_pass.py --summary   # both passes over the seeds, from the results file
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks._common import data_dir  # noqa: E402
from benchmarks.harness import measure, metadata, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUNS = [ROOT / "reproduction/hbn/table1/hbn__phi0.1/seed42"]


def _load(run_dir: Path, data: str, threads: int) -> Any:
    from fednorm.config import load_config
    from fednorm.engine.checkpoint import load_latest
    from fednorm.engine.simulator import Simulation

    cfg = load_config(run_dir / "config.yaml", {"data_dir": data, "device": "cpu", "threads": threads, "out": None})
    sim = Simulation(cfg)
    sim.load_state_dict(load_latest(run_dir))
    return sim


def _limit_test(sim: Any, n: int | None) -> None:
    """Evaluate on ``n`` evenly spaced test images (the JPEG test set is class-major, so its first
    ``n`` would hold the first classes only); each client's test split is cut to them."""
    if n is None or n >= len(sim.data.test_x):
        return
    data = sim.data
    keep = torch.linspace(0, len(data.test_x) - 1, n).round().long().unique()
    new = torch.full((len(data.test_x),), -1, dtype=torch.long)
    new[keep] = torch.arange(len(keep))
    data.test_x, data.test_y = data.test_x[keep.to(data.test_x.device)], data.test_y[keep.to(data.test_y.device)]
    data.client_test = [new[ix.cpu()][new[ix.cpu()] >= 0].to(ix.device) for ix in data.client_test]


def _distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], layers: list[str]) -> dict[str, dict[str, float]]:
    """Per layer: mean shift of ``a`` from ``b`` in units of ``b``'s std, and |log| variance ratio."""
    out = {}
    for name in layers:
        ma, va = a[f"{name}.running_mean"].double(), a[f"{name}.running_var"].double()
        mb, vb = b[f"{name}.running_mean"].double(), b[f"{name}.running_var"].double()
        out[name] = {"mean_shift": float(((ma - mb).abs() / (vb + 1e-5).sqrt()).mean()),
                     "var_logratio": float(((va + 1e-5) / (vb + 1e-5)).log().abs().mean())}
    return out


def measure_run(run_dir: Path, data: str, test_limit: int | None, threads: int, resample: int = 0) -> dict[str, Any]:
    start = time.perf_counter()
    sim = _load(run_dir, data, threads)
    _limit_test(sim, test_limit)
    method = sim.method
    r = sim.server_round
    clients = sim.sample_clients(r)
    if list(method._last_round_clients) != clients:
        raise SystemExit(f"{run_dir}: the checkpoint's last round clients {method._last_round_clients} are not round {r}'s {clients}")
    recorded = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    base = {k: getattr(method, k) for k in ("sync_pass", "upload", "stats_samples", "stats_max_samples", "stats_augment")}
    variants = [("the run's pass", {}), ("layer-wise", {"sync_pass": "layerwise"})]
    if base["upload"] != "local" or base["stats_samples"] != "all":
        variants.append(("layer-wise, all samples, local upload",
                         {"sync_pass": "layerwise", "upload": "local", "stats_samples": "all", "stats_augment": False}))
    samples = [("evaluation re-sync", clients)]
    if method.final_sync:
        samples.append(("round T+1", sim.sample_clients(r + 1)))

    def run(ids: list[int], change: dict[str, Any]) -> tuple[dict[str, torch.Tensor], float, float]:
        for k, v in {**base, **change}.items():
            setattr(method, k, v)
        try:
            state = method.synced_state(sim, ids)
        finally:
            for k, v in base.items():
                setattr(method, k, v)
        acc, loss, _ = sim.evaluate_global(state)
        return state, acc, loss

    rows, pools = [], {}
    for where, ids in samples:
        for label, change in variants:
            timing, (state, acc, loss) = measure(lambda: run(ids, change))
            pools[(where, label)] = state
            rows.append({"clients": where, "pass": label, "test_accuracy": acc, "test_loss": loss,
                         "seconds": timing["wall"], "cpu_seconds": timing["cpu"]})
    resampled = {}
    if resample > 0:
        from fednorm.rng import numpy_rng

        n, m = sim.config.num_clients, len(clients)
        draws = [sorted(int(c) for c in numpy_rng(sim.config.seed, "diagnose-resample", i).choice(n, size=m, replace=False))
                 for i in range(resample)]
        for label, change in variants[:2]:
            accs = np.array([run(ids, change)[1] for ids in draws])
            resampled[label] = {"samples": resample, "accuracies": accs.tolist(), "mean": float(accs.mean()),
                                "std": float(accs.std(ddof=1)) if resample > 1 else 0.0,
                                "min": float(accs.min()), "max": float(accs.max())}
    own = "the run's pass"
    return {
        "run_dir": str(run_dir.relative_to(ROOT) if run_dir.is_relative_to(ROOT) else run_dir),
        "round": r, "preset": method.preset, "stats_mode": method.stats_mode, "alpha": sim.config.alpha,
        "round_clients": clients, "test_images": len(sim.data.test_x),
        "recorded": {"final_test_accuracy": recorded.get("final_test_accuracy"),
                     "final_sync": (recorded.get("final_sync") or {}).get("test_accuracy")},
        "rows": rows,
        "resampled": resampled,
        "layer_distance": {where: _distance(pools[(where, own)], pools[(where, "layer-wise")], method.layers)
                           for where, _ in samples},
        "seconds": time.perf_counter() - start,
    }


def paired(one: list[float], other: list[float], level: float = 0.95) -> dict[str, Any]:
    """Mean of ``other − one`` over seeds and its paired Student-t interval (None for one seed):
    the same weights measured both ways, so the pairs share everything but the pass."""
    from scipy.stats import t as student_t

    diffs = [b - a for a, b in zip(one, other)]
    mean = float(np.mean(diffs))
    if len(diffs) < 2:
        return {"diff": mean, "low": None, "high": None, "n": len(diffs)}
    half = float(student_t.ppf(0.5 + level / 2, len(diffs) - 1)) * float(np.std(diffs, ddof=1)) / len(diffs) ** 0.5
    return {"diff": mean, "low": mean - half, "high": mean + half, "n": len(diffs)}


def summary(results: dict[str, Any]) -> str:
    """Per preset and Dir(φ): each pass's final accuracy (mean ± std over the measured seeds) and
    the layer-wise pass's paired gain, for the evaluation re-sync's clients and round T+1's."""
    cells: dict[tuple[str, float, str], dict[str, list[float]]] = {}
    seeds: dict[tuple[str, float, str], list[str]] = {}
    for run, res in sorted(results["runs"].items()):
        for row in res["rows"]:
            key = (res["preset"], res["alpha"], row["clients"])
            cells.setdefault(key, {}).setdefault(row["pass"], []).append(100 * row["test_accuracy"])
            if row["pass"] == "layer-wise":
                seeds.setdefault(key, []).append(Path(run).name)

    def fmt(vals: list[float]) -> str:
        return f"{np.mean(vals):.2f} ± {np.std(vals, ddof=1):.2f}" if len(vals) > 1 else f"{vals[0]:.2f}"

    lines = ["| preset | φ | clients | seeds | the run's pass | layer-wise | layer-wise − run's pass (paired 95%) |",
             "|---|---|---|---|---:|---:|---:|"]
    for (preset, alpha, clients), passes in sorted(cells.items()):
        one, layer = passes.get("the run's pass", []), passes.get("layer-wise", [])
        if not one or len(one) != len(layer):
            continue
        d = paired(one, layer)
        gain = f"{d['diff']:+.2f}" + (f" ({d['low']:+.2f} to {d['high']:+.2f})" if d["low"] is not None else "")
        lines.append(f"| {preset} | {alpha} | {clients} | {', '.join(seeds[(preset, alpha, clients)])} | "
                     f"{fmt(one)} | {fmt(layer)} | {gain} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="*", help="run directories (default: the committed paper-preset φ = 0.1 run)")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--test-limit", type=int, default=None, help="evaluate on N evenly spaced test images only")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--resample", type=int, default=0, help="both passes over K other seeded client samples")
    parser.add_argument("--write", action="store_true", help="merge into benchmarks/results/hbn_statistics_pass.json")
    parser.add_argument("--summary", action="store_true", help="print both passes over the seeds in the results file")
    args = parser.parse_args()
    if args.summary:
        print(summary(json.loads((ROOT / "benchmarks/results/hbn_statistics_pass.json").read_text())))
        return
    torch.set_num_threads(args.threads)
    data = data_dir(args.data_dir)
    results = []
    for run in [Path(p).resolve() for p in args.runs] or RUNS:
        res = measure_run(run, data, args.test_limit, args.threads, args.resample)
        results.append(res)
        print(f"\n{res['run_dir']}: preset {res['preset']}, Dir({res['alpha']}), round {res['round']}, "
              f"{res['test_images']} test images; recorded final {res['recorded']['final_test_accuracy']}, "
              f"T+1 {res['recorded']['final_sync']}; round clients {res['round_clients']}")
        print("| clients | pass | test accuracy % | test loss | s |\n|---|---|---:|---:|---:|")
        for row in res["rows"]:
            print(f"| {row['clients']} | {row['pass']} | {100 * row['test_accuracy']:.2f} | {row['test_loss']:.4f} | {row['seconds']:.1f} |")
        for label, s in res["resampled"].items():
            print(f"| {s['samples']} other samples of {len(res['round_clients'])} clients | {label} | "
                  f"{100 * s['mean']:.2f} ± {100 * s['std']:.2f} ({100 * s['min']:.2f} to {100 * s['max']:.2f}) | | |")
        for where, layers in res["layer_distance"].items():
            figures = ", ".join(f"{n}: shift {d['mean_shift']:.3f}, |log var ratio| {d['var_logratio']:.3f}" for n, d in layers.items())
            print(f"  {where}, run's pass against layer-wise, per layer: {figures}")
        print(f"  ({res['seconds']:.0f} s)")
    if args.write:
        path = ROOT / "benchmarks/results/hbn_statistics_pass.json"
        old = json.loads(path.read_text()) if path.is_file() else {"runs": {}}
        measured = metadata()  # each run's entry says how it was measured; the file's top level, the latest
        old["runs"].update({r["run_dir"]: {**r, "measured": measured} for r in results})
        write_result(path, old)


if __name__ == "__main__":
    main()
