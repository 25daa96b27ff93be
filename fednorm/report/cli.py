"""The ``fednorm report`` command (parser and handler, kept out of cli/main.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "report", help="one report (report.md, report.html) from any set of run directories",
        description="Collect run directories (a compare folder, several seeds, a reproduce suite, single runs) into "
        "report.md and a self-contained report.html: mean ± std per variant, curves with ±std bands, per-source "
        "accuracies, the partitions' label distributions.",
    )
    p.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR", help="run directories or folders that hold them")
    p.add_argument("--out", type=Path, help="where to write (default: RUN_DIR/report for one RUN_DIR; needed for several)")
    p.add_argument("--title", default="fednorm report", help="the report's title")


def command(args: argparse.Namespace) -> int:
    from . import build_report

    if args.out is None:
        if len(args.run_dirs) != 1:
            raise ConfigError("several RUN_DIRs: pass --out DIR for the report")
        args.out = args.run_dirs[0] / "report"
    if args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {args.out} is a file, not a folder")
    report = build_report(args.run_dirs, args.out, title=args.title)
    n = sum(len(v.runs) for v in report.variants)
    print(f"{n} run(s) in {len(report.variants)} variant(s)")
    print(f"report: {report.markdown}  page: {report.html}")
    return 0
