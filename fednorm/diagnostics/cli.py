"""The ``fednorm diagnose`` command (parser and handler, kept out of cli/main.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "diagnose", help="evaluate a run's weights with each statistics it could use: where its accuracy is lost",
        description="Rebuild a run from its config.yaml and latest checkpoint and evaluate the same weights with the "
        "statistics its evaluations used, the method's deployed ones (HBN's round T+1), the global buffers and the "
        "exact statistics of the clients' union; print the per-layer statistics mismatch and HBN's batch weights, "
        "and write RUN_DIR/diagnosis.json (docs/diagnostics.md).",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a fednorm run directory")
    p.add_argument("--resample", type=int, default=0, metavar="K",
                   help="methods that re-estimate statistics from sampled clients (HBN): repeat that with K other seeded "
                   "samples and give the spread (default: 0)")
    p.add_argument("--max-samples", type=int, metavar="N",
                   help="exact statistics from a seeded share of each client's data, N samples in all (default: all; "
                   "the pass costs about half a forward pass per normalisation layer over them)")
    p.add_argument("--data-dir", help="dataset folder, if not the run's")
    p.add_argument("--device", help="torch device (default: the run's, the CPU for a GPU run where there is no GPU)")
    p.add_argument("--json", action="store_true", help="print the JSON instead of the table")


def command(args: argparse.Namespace) -> int:
    import json

    from ..errors import ConfigError
    from .offline import DIAGNOSIS_FILE, diagnose_run, format_diagnosis

    if args.resample < 0:
        raise ConfigError(f"--resample must be >= 0, got {args.resample}")
    if args.max_samples is not None and args.max_samples < 1:
        raise ConfigError(f"--max-samples must be >= 1, got {args.max_samples}")

    from ..engine.rundir import check_existing_run

    # before the "loading" line: a missing RUN_DIR is one line (issue 50), a read-only one a message, not [Errno 30]
    check_existing_run(args.run_dir, "diagnose", DIAGNOSIS_FILE)

    def say(line: str) -> None:
        print(f"fednorm diagnose: {line}", file=sys.stderr, flush=True)

    previous = (args.run_dir / DIAGNOSIS_FILE).is_file()
    result = diagnose_run(args.run_dir, resample=args.resample, max_samples=args.max_samples, data_dir=args.data_dir,
                          device=args.device, progress=say)
    print(json.dumps(result, indent=2) if args.json else format_diagnosis(result))
    if not args.json:
        replaced = " (replacing the previous diagnosis)" if previous else ""
        print(f"written: {args.run_dir / DIAGNOSIS_FILE}{replaced} ({result['seconds']:.1f} s)")
    return 0
