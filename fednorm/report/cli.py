"""The ``fednorm report`` command (parser and handler, kept out of cli/main.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["add_parser", "command"]


def _folder(text: str) -> Path:
    if not text.strip():  # Path("") is the current folder
        raise argparse.ArgumentTypeError("is empty: pass a folder for the report, or leave it out for RUN_DIR/report")
    return Path(text)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "report", help="one report (report.md, report.html) from any set of run directories",
        description="Collect run directories (a compare folder, several seeds, a reproduce suite, single runs) into "
        "report.md and a self-contained report.html: mean ± std per variant, curves with ±std bands, per-source "
        "accuracies, the partitions' label distributions.",
    )
    p.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR", help="run directories or folders that hold them")
    p.add_argument("--out", type=_folder, help="where to write (default: RUN_DIR/report for one RUN_DIR; needed for several)")
    p.add_argument("--title", default="fednorm report", help="the report's title")


def command(args: argparse.Namespace) -> int:
    from ..engine.rundir import check_writable
    from . import build_report
    from .collect import find_runs

    given = args.out is not None
    if args.out is None:
        if len(args.run_dirs) != 1:
            raise ConfigError("several RUN_DIRs: pass --out DIR for the report")
        args.out = args.run_dirs[0] / "report"
    if args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {args.out} is a file, not a folder")
    find_runs(args.run_dirs)  # a run still training, killed or with a corrupt summary: say so first (issue 50)
    try:
        check_writable(args.out, "--out")
    except ConfigError as exc:  # a read-only run directory: [Errno 30] and exit 1 before (issue 50)
        raise ConfigError(str(exc) + ("" if given else " (the report goes to RUN_DIR/report): pass --out DIR to write it elsewhere")) from None
    report = build_report(args.run_dirs, args.out, title=args.title)
    n = sum(len(v.runs) for v in report.variants)
    print(f"{n} run(s) in {len(report.variants)} variant(s)")
    print(f"report: {report.markdown}  page: {report.html}")
    return 0
