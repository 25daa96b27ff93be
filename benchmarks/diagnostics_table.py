"""Tables and the plot of docs/diagnostics.md from run directories written with ``--diagnostics``.

    for m in "fedavg bn" "fedbn bn" "fbn fbn" "hbn hbn" "fedtan bn"; do set -- $m
      fednorm run --method $1 --norm $2 --num-clients 10 --alpha 0.3 --rounds 15 \\
        --diagnostics every:1 --threads 1 --seed 0 --out runs/diag/$1 --checkpoint-every 0
    done
    python benchmarks/diagnostics_table.py runs/diag/{fedavg,fedbn,fbn,hbn,fedtan} --plot docs/diagnostics_digits.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fednorm.diagnostics import layer_mean, plot_diagnostics
from fednorm.engine.outputs import read_metrics


def fmt(v: float | None, pct: bool = False) -> str:
    if v is None or v != v:
        return "–"
    return f"{100 * v:.1f}" if pct else f"{v:.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--plot")
    p.add_argument("--rounds", default="1,5,15", help="rounds shown in the table")
    args = p.parse_args()
    shown = [int(r) for r in args.rounds.split(",")]
    histories = {Path(r).name: read_metrics(r) for r in args.runs}
    print("| method | round | test acc. (%) | agg. stats: mean shift / log-var | clients' stats: mean shift / log-var "
          "| grad. cosine / rel. error | acc. aggregated → recalibrated (%) | diag. s / round s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, history in histories.items():
        for h in history:
            if h["round"] not in shown:
                continue
            print(f"| {name} | {h['round']} | {fmt(h['test_accuracy'], True)} "
                  f"| {fmt(layer_mean(h, 'diag/stats/agg_mean_shift'))} / {fmt(layer_mean(h, 'diag/stats/agg_var_logratio'))} "
                  f"| {fmt(layer_mean(h, 'diag/stats/client_mean_shift'))} / {fmt(layer_mean(h, 'diag/stats/client_var_logratio'))} "
                  f"| {fmt(h.get('diag/grad/cosine'))} / {fmt(h.get('diag/grad/rel_error'))} "
                  f"| {fmt(h.get('diag/acc/aggregated'), True)} → {fmt(h.get('diag/acc/recalibrated'), True)} "
                  f"| {fmt(h.get('diag/seconds'))} / {fmt(h.get('diag/round_seconds'))} |")
    extra = {n: h[-1] for n, h in histories.items()}
    for name, h in extra.items():
        keys = [k for k in h if k.startswith(("diag/hbn/", "diag/local/"))]
        if keys:
            print(f"\n{name}, round {h['round']}: " + ", ".join(f"{k} = {h[k]:.3f}" for k in sorted(keys)))
    if args.plot:
        plot_diagnostics(histories, args.plot, title="digits, Dirichlet 0.3, 10 clients")
        print(f"\nplot written to {args.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
