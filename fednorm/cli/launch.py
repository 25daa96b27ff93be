"""``fednorm launch``: one experiment with its clients spread over ``--nproc`` torch.distributed
worker processes on this machine (:mod:`fednorm.distributed`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .common import add_config_options, fresh_run_config
from .errors import exit_code_for_signal

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    """The ``launch`` subcommand's options."""
    p_launch = sub.add_parser(
        "launch", help="run one experiment with its clients spread over N processes (torch.distributed)",
        description="Run one federated experiment with torch.distributed: --nproc worker processes on this machine, "
        "each hosting a share of the clients; rank 0 also aggregates and writes the run directory. Same options, "
        "config files and results as `fednorm run`. On a cluster use `torchrun ... -m fednorm.distributed RUN-OPTIONS`.",
    )
    p_launch.add_argument("--nproc", type=int, default=2, help="worker processes (default: 2)")
    from .worker_options import add_worker_options

    add_worker_options(p_launch)
    p_launch.add_argument("--config", type=Path, help="YAML config file (options below override it)")
    p_launch.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue a run from its latest checkpoint (any --nproc)")
    p_launch.add_argument("--overwrite", action="store_true", help="start again in an --out directory that holds an earlier run (its files are deleted)")
    p_launch.add_argument("--quiet", action="store_true", help="no progress bar")
    add_config_options(p_launch)


def command(args: argparse.Namespace, forwarded: list[str]) -> int:
    """Start ``--nproc`` workers with torchrun on this machine; each runs ``fednorm run`` on its
    share of the clients (fednorm.distributed). The launcher holds the run directory's writer
    lock for the workers' whole life; rank 0 writes under it (fednorm.engine.runlock)."""
    import contextlib

    with contextlib.ExitStack() as held:
        return _launch(args, forwarded, held)


def _launch(args: argparse.Namespace, forwarded: list[str], held: Any) -> int:
    import os
    import signal
    import subprocess

    from ..api import STOP_FILE_ENV
    from ..engine.outputs import default_run_dir, read_summary

    if args.nproc < 1:
        raise ConfigError(f"--nproc must be at least 1, got {args.nproc}")
    if args.overwrite and args.resume is not None:
        raise ConfigError("--overwrite starts a run again and --resume continues one; pass one of them")
    if args.resume is None:
        cfg = fresh_run_config(args, "fednorm launch --nproc N", held)  # validate here, before any process starts
        if cfg.out is None:  # one run directory for every rank
            cfg = cfg.model_copy(update={"out": str(default_run_dir(cfg))})
        forwarded = [a for a in forwarded if a != "--overwrite"]
        if cfg.out != getattr(args, "out", None):
            forwarded = [*forwarded, "--out", str(cfg.out)]
    worker = ["--timeout", str(args.timeout)] + (["--backend", args.backend] if args.backend else [])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           "-m", "fednorm.distributed", *worker, *forwarded]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.nproc)))
    from ..engine.runlock import inherit_env, run_lock

    run_dir = Path(args.resume) if args.resume is not None else Path(cfg.out)
    held.enter_context(run_lock(run_dir, "launch"))  # re-entrant: fresh_run_config may hold it already
    env = inherit_env([run_dir], env)
    # torchrun and the workers run in their own session, so a Ctrl-C reaches this process only
    # (torchrun would answer it with a traceback). The first SIGINT/SIGTERM asks the workers, by
    # the stop file, to stop together after their round with a checkpoint; a second stops them now.
    run_dir.mkdir(parents=True, exist_ok=True)
    stop_file = run_dir / ".stop-request"
    stop_file.unlink(missing_ok=True)
    env[STOP_FILE_ENV] = str(stop_file)
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    stopped: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        stopped.append(signum)
        if len(stopped) == 1:
            stop_file.write_text(str(signum))
            print("fednorm launch: stopping after the current round (again to stop now)", file=sys.stderr, flush=True)
        else:
            os.killpg(proc.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        returncode = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_file.unlink(missing_ok=True)
    try:
        status = read_summary(run_dir).get("status")
    except (OSError, ValueError):
        status = None
    if status == "interrupted" or stopped:
        print(f"fednorm launch: interrupted; continue with: fednorm launch --nproc {args.nproc} --resume {run_dir}",
              file=sys.stderr)
        return exit_code_for_signal(stopped[0] if stopped else None)
    if returncode != 0:
        print(f"fednorm launch: the workers failed (exit status {returncode}); see the messages above", file=sys.stderr)
        return 1
    return 0
