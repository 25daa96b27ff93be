"""Training-loss curves of a reproduce table's rows, and paired differences between two rows.

FedBN's Fig. 9 (and Figs. 3, 7) compare training losses, which ``fednorm reproduce``'s report does
not tabulate (its statistics are accuracies). This script reads the ``train_loss`` of every
evaluated round from the run directories ``<table>/<row>/seed<k>/metrics.jsonl`` (the mean loss of
the round's local steps over the participating clients), puts it on a step axis (round × the
config's ``local_steps``), and reports per row the loss at chosen steps and the mean over the
evaluated rounds, mean ± sample std over seeds. ``--pair A:B`` adds the per-seed difference
B − A (the same seed: the same initial model and data) with a Student-t 95% interval, at each
chosen step and on the mean; ``--plot`` draws the mean curves (log loss axis).

    python benchmarks/train_loss.py reproduction/fedbn/fig9 --rows fedavg,fedbn,fedavg_sum,fedbn_sum \
        --pair fedavg:fedbn --pair fedavg_sum:fedbn_sum --steps 10,100,300,600 \
        --out reproduction/fedbn/fig9_train_loss.json --plot reproduction/fedbn/plots/fig9_train_loss.png
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import yaml

# two-sided 97.5% quantiles of Student's t for 1..10 degrees of freedom
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def read_run(run_dir: Path) -> dict[int, float]:
    """``{step: train_loss}`` of one run (step = round × local_steps)."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    steps = int(config.get("local_steps") or 1)
    out: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "train_loss" in rec and "round" in rec:
            out[int(rec["round"]) * steps] = float(rec["train_loss"])
    return out


def read_row(table_dir: Path, row: str) -> dict[int, dict[int, float]]:
    """``{seed: {step: loss}}`` of every ``seed<k>`` directory of a row."""
    runs = {}
    for d in sorted((table_dir / row).glob("seed*")):
        if (d / "metrics.jsonl").is_file():
            runs[int(d.name[4:])] = read_run(d)
    if not runs:
        raise SystemExit(f"no runs under {table_dir / row}")
    return runs


def _summary(values: list[float]) -> dict[str, float]:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    out = {"mean": mean, "std": sd, "n": len(values)}
    if len(values) > 1:
        half = _T975.get(len(values) - 1, 1.96) * sd / math.sqrt(len(values))
        out.update(low=mean - half, high=mean + half)
    return out


def _at(run: dict[int, float], step: int) -> float:
    if step not in run:
        raise SystemExit(f"step {step} was not evaluated (steps: {min(run)}..{max(run)})")
    return run[step]


def _area(run: dict[int, float], last: int) -> float:
    """Mean loss over the evaluated steps up to ``last``."""
    return statistics.fmean(v for s, v in run.items() if s <= last)


def analyse(table_dir: Path, rows: list[str], pairs: list[tuple[str, str]], steps: list[int]) -> dict:
    data = {r: read_row(table_dir, r) for r in {*rows, *(x for p in pairs for x in p)}}
    out: dict = {"table_dir": str(table_dir), "steps": steps, "rows": {}, "pairs": []}
    for r in rows:
        runs = data[r]
        last = min(max(run) for run in runs.values())
        out["rows"][r] = {
            "seeds": sorted(runs),
            **{f"step{s}": _summary([_at(run, s) for run in runs.values()]) for s in steps},
            "mean_over_steps": _summary([_area(run, last) for run in runs.values()]),
        }
    for a, b in pairs:
        seeds = sorted(set(data[a]) & set(data[b]))
        last = min(max(data[x][s]) for x in (a, b) for s in seeds)
        pair: dict = {"a": a, "b": b, "seeds": seeds, "difference": "b - a"}
        for s in steps:
            pair[f"step{s}"] = _summary([_at(data[b][k], s) - _at(data[a][k], s) for k in seeds])
            pair[f"step{s}_relative"] = _summary([_at(data[b][k], s) / _at(data[a][k], s) - 1 for k in seeds])
        pair["mean_over_steps"] = _summary([_area(data[b][k], last) - _area(data[a][k], last) for k in seeds])
        out["pairs"].append(pair)
    return out


def plot(table_dir: Path, rows: list[str], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2))
    ax = fig.subplots()
    for i, r in enumerate(rows):
        runs = read_row(table_dir, r)
        steps = sorted(set.intersection(*(set(run) for run in runs.values())))
        mean = [statistics.fmean(run[s] for run in runs.values()) for s in steps]
        ax.plot(steps, mean, label=f"{r} ({len(runs)} seeds)", color=f"C{i // 2}", linestyle="-" if i % 2 else "--")
    ax.set_yscale("log")
    ax.set_xlabel("local step")
    ax.set_ylabel("training loss (mean over seeds)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1.0), loc="upper left")  # beside the axes: the curves fill them
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("table_dir", type=Path, help="a reproduce table's folder (holds <row>/seed<k>/)")
    p.add_argument("--rows", required=True, help="comma-separated row ids")
    p.add_argument("--pair", action="append", default=[], help="A:B, reported as B - A per seed (repeatable)")
    p.add_argument("--steps", default="10,100,600", help="comma-separated local steps to report the loss at")
    p.add_argument("--out", type=Path, help="write the numbers here as JSON")
    p.add_argument("--plot", type=Path, help="write the mean curves here (PNG)")
    args = p.parse_args()
    rows = args.rows.split(",")
    pairs = [tuple(x.split(":", 1)) for x in args.pair]
    result = analyse(args.table_dir, rows, pairs, [int(s) for s in args.steps.split(",")])  # type: ignore[arg-type]
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    if args.plot:
        plot(args.table_dir, rows, args.plot)
    print(text)


if __name__ == "__main__":
    main()
