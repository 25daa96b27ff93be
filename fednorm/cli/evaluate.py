"""``fednorm evaluate RUN_DIR --test-file F``: a run's latest model on another test set."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("evaluate", help="score a run's latest model on another test set (accuracy with a 95%% interval)",
                       description="Evaluate RUN_DIR's latest checkpoint as the run evaluates it (the global model; HBN's "
                       "statistics re-synced) on the images of an .npz (uint8 x N×H×W×C, labels y), normalised as the "
                       "run's inputs, beside the run's own test set; writes RUN_DIR/evaluation.json.")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", nargs="+")
    p.add_argument("--test-file", type=Path, required=True, help="e.g. ../shared/data/cifar10_test_lossless1000.npz")
    p.add_argument("--data-dir", help="the dataset folder, if not the run's (its own test set and HBN's re-sync read it)")
    return p


def command(args: argparse.Namespace) -> int:
    from ..evaluation import evaluate_run_on
    from ..engine.rundir import check_existing_run

    for run_dir in args.run_dir:  # every RUN_DIR checked before the first is evaluated (a read-only one: issue 50)
        check_existing_run(run_dir, "evaluate", "evaluation.json")
    for run_dir in args.run_dir:
        r = evaluate_run_on(run_dir, args.test_file, data_dir=args.data_dir)
        low, high = r["interval95"]
        print(f"{run_dir} (round {r['round']}): {args.test_file.name} {100 * r['accuracy']:.2f}% "
              f"({r['correct']}/{r['n']}; 95% interval {100 * low:.1f}–{100 * high:.1f}), "
              f"its own test set {100 * r['own_test_accuracy']:.2f}%", flush=True)
    return 0
