"""How far one round of a run's config moves between commits, executors and dtypes.

REPRODUCTION.md says that two commits compute the same training (one round in float64 agrees to
about 1e-13 relative) but round differently in float32, and that in float32 one round's weights
already differ by a large share of a tensor's scale between fednorm's two executors. This script
is the record behind both sentences: it trains round 1 of a run's ``config.yaml`` at each requested
commit (a temporary ``git worktree``, its code run in a subprocess as ``python -m fednorm run``),
with each requested executor and dtype, and compares the global weights after the round.

For each pair it prints, over the floating-point tensors of the global state,
``max_rel``: the largest max|a - b| / max|a| of any tensor (the "share of a tensor's scale"), and
``norm_rel``: ||a - b|| / ||a|| over all of them.

    python benchmarks/commit_drift.py --config reproduction/hbn/table1/bn__phi0.6/seed44/config.yaml \\
        --commits e717bfe,1cb9df0 --dtypes float64,float32 --executors sequential,vectorized \\
        --data-dir ../shared/data --out benchmarks/results/commit_drift_bn.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from fednorm.config import ExperimentConfig

ROOT = Path(__file__).resolve().parents[1]


def _resolve(commit: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", commit], check=True, capture_output=True,
                          text=True).stdout.strip()


def _known_fields(code_dir: Path, env: dict) -> set[str]:
    probe = "import json; from fednorm.config import ExperimentConfig as C; print(json.dumps(list(C.model_fields)))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=code_dir, env=env, check=True, capture_output=True, text=True)
    return set(json.loads(out.stdout))


def one_round(code_dir: Path, config: dict, dtype: str, executor: str, out: Path, threads: int,
              data_dir: str | None) -> dict[str, torch.Tensor]:
    """Round 1 of ``config`` by the fednorm at ``code_dir``; the global floating-point state after it."""
    env = dict(os.environ, PYTHONPATH=str(code_dir), OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cfg = dict(config, rounds=1, dtype=dtype, executor=executor)
    if data_dir:
        cfg["data_dir"] = data_dir
    for key in set(cfg) - _known_fields(code_dir, env):
        # Fields added after that commit; dropped only while they hold what the older code did.
        if cfg[key] != ExperimentConfig.model_fields[key].get_default(call_default_factory=True):
            raise SystemExit(f"{code_dir.name}: the config sets {key}={cfg[key]!r}, which that commit does not know")
        del cfg[key]
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    cmd = [sys.executable, "-m", "fednorm", "run", "--config", str(path), "--out", str(out / "run")]
    proc = subprocess.run(cmd, cwd=code_dir, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} at {code_dir} failed:\n{proc.stderr[-2000:]}")
    state = torch.load(out / "run" / "checkpoint.pt", map_location="cpu", weights_only=False)["global_state"]
    return {k: v.double() for k, v in state.items() if torch.is_floating_point(v)}


def drift(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict:
    """The largest per-tensor max-abs difference relative to the tensor's max-abs, and the overall norm ratio."""
    per = {k: float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-300)) for k in a}
    worst = max(per, key=per.get)
    num = sum(float(((a[k] - b[k]) ** 2).sum()) for k in a) ** 0.5
    den = sum(float((a[k] ** 2).sum()) for k in a) ** 0.5
    return {"max_rel": per[worst], "max_rel_tensor": worst, "norm_rel": num / den}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, required=True, help="a run's config.yaml")
    p.add_argument("--commits", default="HEAD", help="comma-separated commits (default: HEAD)")
    p.add_argument("--dtypes", default="float64,float32")
    p.add_argument("--executors", default="sequential")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = p.parse_args()

    config = yaml.safe_load(args.config.read_text())
    commits = [_resolve(c) for c in args.commits.split(",")]
    dtypes, executors = args.dtypes.split(","), args.executors.split(",")
    states: dict[tuple[str, str, str], dict[str, torch.Tensor]] = {}
    with tempfile.TemporaryDirectory(prefix="fednorm-drift-") as tmp:
        for commit in commits:
            tree = Path(tmp) / commit[:12]
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit], check=True,
                           capture_output=True)
            try:
                for dtype, executor in itertools.product(dtypes, executors):
                    t0 = time.perf_counter()
                    states[commit, dtype, executor] = one_round(tree, config, dtype, executor,
                                                                Path(tmp) / f"{commit[:12]}-{dtype}-{executor}",
                                                                args.threads, args.data_dir)
                    print(f"  {commit[:9]} {dtype} {executor}: round 1 in {time.perf_counter() - t0:.0f} s",
                          flush=True)
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                               capture_output=True)

    rows = []
    keys = list(states)
    for i, j in itertools.combinations(range(len(keys)), 2):
        (c1, d1, e1), (c2, d2, e2) = keys[i], keys[j]
        if d1 != d2:
            continue  # a float32 run against a float64 one mixes the two effects
        rows.append({"a": {"commit": c1, "executor": e1}, "b": {"commit": c2, "executor": e2}, "dtype": d1,
                     **drift(states[keys[i]], states[keys[j]])})
    machine = f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, {args.threads} thread(s)"
    for r in rows:
        print(f"{r['dtype']:8} {r['a']['commit'][:9]} {r['a']['executor']:10} vs {r['b']['commit'][:9]} "
              f"{r['b']['executor']:10}: max_rel {r['max_rel']:.2e} ({r['max_rel_tensor']}), "
              f"norm_rel {r['norm_rel']:.2e}  [{machine}]")
    if args.out:
        args.out.write_text(json.dumps({"config": str(args.config), "command": " ".join(sys.argv), "machine": machine,
                                        "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
