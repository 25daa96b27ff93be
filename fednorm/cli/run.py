"""``fednorm run``: one federated experiment, or one per seed (``--seeds``) with a mean ± std table."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..config import ExperimentConfig
from ..errors import ConfigError
from .common import add_config_options, config_from, fresh_run_config, keeping_threads, resolve_threads, seed_list
from .errors import exit_code_for_signal

__all__ = ["add_parser", "command", "run_command"]


def add_parser(sub: Any) -> None:
    """The ``run`` subcommand's options."""
    p_run = sub.add_parser("run", help="run one federated experiment", description="Run one federated experiment.")
    p_run.add_argument("--config", type=Path, help="YAML config file (options below override it)")
    p_run.add_argument(
        "--resume", type=Path, metavar="RUN_DIR",
        help="continue a run from its latest checkpoint (only --rounds, --eval-every, --eval-last-rounds, --checkpoint-every, --threads, --device may change)",
    )
    p_run.add_argument("--overwrite", action="store_true", help="start again in an --out directory that holds an earlier run (its files are deleted)")
    p_run.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    seeds = p_run.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", metavar="S,S,...", help="run once per seed (comma-separated) in OUT/seed<k> and report "
                       "mean ± std of every metric (OUT/seeds.json, seeds.csv, accuracy_seeds.png); rerunning the "
                       "command keeps finished seeds and resumes an interrupted one")
    seeds.add_argument("--num-seeds", type=int, metavar="N", help="--seeds SEED, SEED+1, ..., SEED+N-1 (SEED: --seed)")
    p_run.add_argument("--stack", choices=("auto", "off"), default="auto", help="with --seeds: train the seeds together as "
                       "one computation where the method allows (auto, the default; equal to separate runs to float "
                       "rounding), or one after another (off)")
    add_config_options(p_run)


def run_command(args: argparse.Namespace, *, simulation: Any = None, quiet: bool = False, command: str = "run") -> int:
    """``fednorm run`` on parsed options, with any runtime (``fednorm launch`` passes the
    distributed one; only its rank 0 prints)."""
    from ..api import run
    from ..engine.simulator import Simulation

    plain = simulation is None  # this process is the whole run (not a rank of `fednorm launch`)
    simulation = simulation or Simulation
    if plain and not quiet:
        from ..models.summary import announcing

        simulation = announcing(simulation)  # "model ...: N parameters" once the model is built
    progress = False if (args.quiet or quiet) else None
    on_round = None
    if progress is None:  # also rank 0 of `fednorm launch` (the other ranks are quiet)
        from .progress import ProgressLines, wants_lines

        on_round = ProgressLines() if wants_lines() else None
    if getattr(args, "overwrite", False) and args.resume is not None:
        raise ConfigError("--overwrite starts a run again and --resume continues one; pass one of them")
    import contextlib

    again = "fednorm launch --nproc N" if command == "launch" else "fednorm run"
    out: Path | None = None  # the run directory, known before the run starts
    try:
        with contextlib.ExitStack() as held:
            if args.resume is not None:
                if args.config is not None:
                    raise ConfigError("--resume takes its settings from RUN_DIR/config.yaml; do not pass --config")
                if plain and (Path(args.resume) / "config.yaml").is_file():  # else the resume says what is there
                    from ..engine.rundir import check_existing_run

                    # a read-only run directory: one line, not a raw [Errno 30] with exit 1 (issue 50)
                    check_existing_run(args.resume, "run --resume", "its checkpoints and metrics", verb="resume")
                fields = {k: v for k, v in vars(args).items() if k in ExperimentConfig.model_fields}
                out = Path(args.resume)
                result = run(resume=args.resume, progress=progress, simulation=simulation, on_round=on_round, **fields)
            else:
                if plain:
                    cfg, _ = resolve_threads(fresh_run_config(args, "fednorm run", held))
                    if cfg.out is None:  # named here rather than inside the run, so a second Ctrl-C can name it
                        from ..engine.outputs import default_run_dir

                        cfg = cfg.model_copy(update={"out": str(default_run_dir(cfg))})
                    out = Path(cfg.out)  # type: ignore[arg-type]
                else:
                    cfg = config_from(args)
                result = run(cfg, progress=progress, simulation=simulation, on_round=on_round,
                             overwrite=True)  # fresh_run_config applied the CLI's rule (and --overwrite) already
    except KeyboardInterrupt as exc:
        # A second SIGINT/SIGTERM stops the run mid-round; its last checkpoint stands: say how to go
        # on from it (main.py's bare "interrupted" named no command, issue 50).
        if plain and out is not None and any((out / n).is_file() for n in ("checkpoint.pt", "checkpoint.prev.pt")):
            import sys

            print(f"fednorm {command}: interrupted; continue from the last checkpoint with: {again} --resume {out}",
                  file=sys.stderr, flush=True)
            return exit_code_for_signal(getattr(exc, "signum", None))
        raise
    if quiet:
        return 0
    s = result.summary
    if s["status"] == "interrupted":
        print(f"interrupted after round {s['rounds']}; continue with: {again} --resume {result.out_dir}")
    threads = f", {s['threads']} thread{'s' if s['threads'] != 1 else ''}" if s.get("threads") else ""
    print(
        f"{s['method']}+{s['norm']} on {s['dataset']} ({s['partition']}, {s['num_clients']} clients): "
        f"final test accuracy {100 * (s['final_test_accuracy'] if s['final_test_accuracy'] is not None else float('nan')):.2f}%, "
        f"best {100 * (s['best_test_accuracy'] if s['best_test_accuracy'] is not None else float('nan')):.2f}% "
        f"(round {s['best_round']}), mean client accuracy {100 * (s['final_mean_client_accuracy'] or float('nan')):.2f}%, "
        f"{s['rounds']} rounds in {s['wall_seconds']:.1f}s{threads}" + (f" on {s['runtime']}" if s.get("runtime") else "")
    )
    if s.get("final_domain_accuracies"):  # feature shift: FedBN's per-domain figures
        from ..domain_results import format_domain_accuracies

        print(format_domain_accuracies(s["final_domain_accuracies"]))
    if s.get("executor_note"):
        print(f"executor: {s['executor_note']}")
    print(f"run directory: {result.out_dir}")
    if s["status"] == "interrupted" and command == "run":  # a scheduler must not read an interrupted run as done
        return exit_code_for_signal(result.stop_signal)
    return 0


def command(args: argparse.Namespace) -> int:
    """``fednorm run``: one run, or one per seed."""
    if args.seeds is not None or args.num_seeds is not None:
        return keeping_threads(_run_seeds_command, args)
    return keeping_threads(run_command, args)


def _run_seeds_command(args: argparse.Namespace) -> int:
    """``fednorm run --seeds``: :func:`fednorm.seeds.run_seeds` with the run's options."""
    from ..engine.outputs import default_run_dir
    from ..seeds import run_seeds
    from ..engine import rundir

    if args.resume is not None or args.overwrite:
        raise ConfigError("--seeds keeps finished seeds and resumes an interrupted one by itself: rerun the same "
                          "command (without --resume/--overwrite), or pick a new --out")
    cfg, _ = resolve_threads(config_from(args))
    seeds = seed_list(args, cfg.seed)
    root = Path(cfg.out) if cfg.out else default_run_dir(cfg)
    rundir.check_writable(root)
    if rundir.holds_run(root):
        raise ConfigError(f"{root} holds a single run; --seeds writes one run directory per seed under OUT: pick a new --out")
    progress = False if args.quiet else None
    on_round = None
    if progress is None:
        from .progress import OverallBar, ProgressLines, wants_lines

        on_round = ProgressLines() if wants_lines() else OverallBar(len(seeds), cfg.rounds, desc="all seeds")
    try:
        import shlex

        again = shlex.join(["fednorm", *getattr(args, "argv", [])]) if getattr(args, "argv", None) else None
        result = run_seeds(cfg, seeds, root, progress=progress, on_round=on_round, stack=args.stack != "off", command=again)
    finally:
        getattr(on_round, "close", lambda: None)()
    if result.stacking.get("blockers"):
        print(f"seeds ran one after another: {'; '.join(result.stacking['blockers'])}")
    elif result.stacking:
        print(f"seeds ran stacked: {result.stacking['joint_rounds']} joint rounds"
              + (f", {result.stacking['separate_rounds']} run by run" if result.stacking["separate_rounds"] else ""))
    if result.reused:
        print(f"kept the finished seed(s) {', '.join(map(str, result.reused))}")
    statuses = [s.get("status") for s in result.summaries.values()]
    if "interrupted" in statuses or result.stop_signal is not None:
        print(f"interrupted; the finished seeds are kept: run the same command again to continue ({root})")
        return exit_code_for_signal(result.stop_signal)
    print(result.table())
    return 0
