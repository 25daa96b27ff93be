"""``fednorm analyze RUN_DIR``: the LN paper's analyses of a finished run's global model (:mod:`fednorm.analysis`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    """The ``analyze`` subcommand's options."""
    p_an = sub.add_parser("analyze", help="feature/class-embedding norms, feature collapse and local overfitting of a run's final model",
                          description="Analyse a finished run's global model as the LN paper does (Figs. 2-3): writes "
                          "RUN_DIR/analysis.json and analysis_*.png.")
    p_an.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p_an.add_argument("--client", type=int, help="client to train locally (default: the one with the fewest classes)")
    p_an.add_argument("--steps", type=int, default=5, help="local SGD steps (default: 5, the paper's Fig. 2)")
    p_an.add_argument("--lr", type=float, help="local learning rate (default: the run's lr)")
    p_an.add_argument("--per-class", type=int, default=2, help="test images per class in the feature matrix (default: 2)")
    p_an.add_argument("--max-test", type=int, default=2000, help="most test images used for norms and accuracies (default: 2000)")
    p_an.add_argument("--no-plots", action="store_true", help="write analysis.json only")


def command(args: argparse.Namespace) -> int:
    from ..analysis import analyze_run, format_table

    for name in ("steps", "per_class", "max_test"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.lr is not None and not args.lr > 0:
        raise ConfigError(f"--lr must be positive, got {args.lr}")
    from ..engine.rundir import check_existing_run

    check_existing_run(args.run_dir, "analyze", "analysis.json and its plots")
    result = analyze_run(args.run_dir, client=args.client, steps=args.steps, lr=args.lr, per_class=args.per_class,
                         max_test=args.max_test, plots=not args.no_plots)
    print(format_table(result))
    print(f"analysis: {args.run_dir / 'analysis.json'}" + ("" if args.no_plots else f"  plots: {args.run_dir}/analysis_*.png"))
    return 0
