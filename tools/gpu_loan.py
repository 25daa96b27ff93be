"""Spend a short GPU loan on reproduction cells, in order, and bring every run back.

A lent machine is held for minutes, sees only what each call carries, and loses its disk when
it goes back. This runs on that machine, in one call::

    python tools/gpu_loan.py --budget 500 --plan plan.txt --data /tmp/data --parts .pack/part2

1. ``--parts``: decode the dataset parts this call carried (``tools/remote_data.py``) into ``--data``;
2. each plan line ``CAP ARGS...`` runs ``fednorm reproduce ARGS --device cuda --threads 1 --quiet
   --data-dir DATA`` for at most CAP seconds and at most what is left of ``--budget``; at the cap its
   process group gets SIGTERM, on which every run writes a checkpoint after its current round,
   and SIGKILL ``--grace`` seconds later;
3. every run directory under ``--work`` is packed into ``$OUT/<paper>__<table>__<run>__<seed>.tgz``
   without ``checkpoint.prev.pt`` (the last checkpoint resumes it), one file per run, so that no
   file is too large to come back; ``fednorm reproduce <paper> --out UNPACKED --report-only
   --export reproduction/<paper> --export-checkpoints`` then merges them here.

Plan lines are ``CAP fednorm-reproduce-arguments``; blank lines and ``#`` comments are skipped, and
a line whose arguments lack ``--out`` gets ``--out WORK/<paper>``. ``--dry-run`` prints the
commands. Set ``FEDNORM_COMMIT`` to the commit the copy was made from (the copy may carry stale
git metadata; each run records it).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

EXCLUDE = {"checkpoint.prev.pt", ".reproduce.lock", ".fednorm.lock"}


@dataclass
class Step:
    cap: float
    args: list[str]


def parse_plan(text: str, work: Path) -> list[Step]:
    """Plan lines -> steps (module docstring); a line without ``--out`` gets ``--out WORK/<paper>``."""
    steps = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        cap, *args = shlex.split(line)
        try:
            seconds = float(cap)
        except ValueError:
            raise SystemExit(f"plan line {number}: the first word must be a cap in seconds, got {cap!r}") from None
        if not args:
            raise SystemExit(f"plan line {number}: no fednorm reproduce arguments after the cap")
        if "--out" not in args:
            args += ["--out", str(work / args[0])]
        steps.append(Step(seconds, args))
    return steps


def run_step(command: list[str], cap: float, grace: float, log: Path) -> tuple[int, float]:
    """Run ``command`` in its own process group for at most ``cap`` s (then SIGTERM, SIGKILL after
    ``grace``); returns (exit code, seconds). It returns only when the whole group is gone: the runs
    are packed next, and a worker that outlived its leader may still be writing its checkpoint or
    its ``reproduce.json`` (a loan lost one run's record that way)."""
    start = time.monotonic()
    with log.open("ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(cap, 0.0))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                rc = proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
    _wait_group(proc.pid, grace)
    return rc, time.monotonic() - start


def _wait_group(pgid: int, grace: float) -> None:
    """Wait for every process of group ``pgid`` to exit; SIGKILL what is left after ``grace`` s."""
    deadline = time.monotonic() + grace
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        if time.monotonic() > deadline:
            os.killpg(pgid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.1)


def pack_runs(work: Path, out: Path) -> list[Path]:
    """One ``.tgz`` per run directory (a folder holding ``reproduce.json``) under ``work``."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for record in sorted(work.rglob("reproduce.json")):
        run_dir = record.parent
        rel = run_dir.relative_to(work)
        target = out / ("__".join(rel.parts) + ".tgz")
        with tarfile.open(target, "w:gz") as tar:
            tar.add(run_dir, arcname=str(rel), filter=lambda ti: None if Path(ti.name).name in EXCLUDE else ti)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, required=True, help="seconds this call may spend on the plan")
    p.add_argument("--plan", type=Path, required=True)
    p.add_argument("--data", type=Path, default=Path("/tmp/data"), help="dataset folder (default: /tmp/data)")
    p.add_argument("--parts", type=Path, nargs="*", default=[], help="dataset parts carried by this call, to unpack first")
    p.add_argument("--work", type=Path, default=Path("/tmp/rep"), help="where the runs live on the machine (default: /tmp/rep)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")), help="where the packed runs go (default: $OUT)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--grace", type=float, default=60.0, help="seconds between SIGTERM and SIGKILL (default: 60)")
    p.add_argument("--command", default=f"{shlex.quote(sys.executable)} -m fednorm.cli.main reproduce",
                   help="the reproduce command (default: this Python's fednorm)")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    deadline = time.monotonic() + args.budget
    steps = parse_plan(args.plan.read_text(), args.work)
    common = ["--device", args.device, "--threads", "1", "--quiet", "--data-dir", str(args.data)]
    if args.dry_run:
        for s in steps:
            print(f"{s.cap:>6.0f} s  {args.command} {shlex.join(s.args + common)}")
        return 0
    if args.parts:
        sys.path.insert(0, str(Path(__file__).parent))
        import remote_data

        for name, status in remote_data.unpack(args.data, args.parts).items():
            print(f"data {name}: {status}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "gpu_loan.log"
    for s in steps:
        left = deadline - time.monotonic() - args.grace
        if left < 30:
            print(f"skipped ({left:.0f} s left): {shlex.join(s.args)}", flush=True)
            continue
        rc, took = run_step(shlex.split(args.command) + s.args + common, min(s.cap, left), args.grace, log)
        print(f"rc {rc} after {took:.0f} s: {shlex.join(s.args)}", flush=True)
    packed = pack_runs(args.work, args.out)
    print(f"packed {len(packed)} run(s) into {args.out}; log: {log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
