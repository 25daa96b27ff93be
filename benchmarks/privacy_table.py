"""The accuracy table of docs/privacy.md from run directories (``<method>-nodp``, ``<method>-s<sigma>``).

    for m in "fedavg bn" "fedbn bn" "hbn hbn"; do set -- $m
      fednorm run --method $1 --norm $2 --num-clients 10 --alpha 0.3 --rounds 15 --threads 1 --seed 0 \\
        --out runs/dp/$1-nodp --checkpoint-every 0
      for s in 0 0.01 0.1; do
        fednorm run --method $1 --norm $2 --num-clients 10 --alpha 0.3 --rounds 15 --threads 1 --seed 0 \\
          --dp-clip 1.0 --dp-stats-bound 3.0 --dp-noise $s --out runs/dp/$1-s$s --checkpoint-every 0
      done
    done
    python benchmarks/privacy_table.py runs/dp fedavg fedbn hbn --sigmas 0,0.01,0.1
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fednorm.engine.outputs import read_metrics, read_summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("methods", nargs="+")
    p.add_argument("--sigmas", default="0,0.01,0.1")
    args = p.parse_args()
    sigmas = args.sigmas.split(",")
    root = Path(args.root)
    head = "| method | no DP | " + " | ".join(f"σ = {s}" for s in sigmas) + " |"
    print(head)
    print("|---" * (len(sigmas) + 2) + "|")
    for m in args.methods:
        cells = [f"{100 * read_summary(root / f'{m}-nodp')['final_test_accuracy']:.1f}"]
        for s in sigmas:
            last = read_metrics(root / f"{m}-s{s}")[-1]
            eps = last["dp/epsilon"]
            eps_txt = "ε = ∞" if eps is None or eps == float("inf") else f"ε = {eps:.3g}"
            cells.append(f"{100 * last['test_accuracy']:.1f} ({eps_txt})")
        print(f"| {m} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
