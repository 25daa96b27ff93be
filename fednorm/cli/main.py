"""The ``fednorm`` command: run, compare, partition, list, analyze.

``fednorm run`` and ``fednorm compare`` take every :class:`~fednorm.config.ExperimentConfig`
field as an option (``local_epochs`` -> ``--local-epochs``), generated from the config
schema so the CLI and YAML files never drift apart. Options override ``--config``'s values.
Bad input prints one clear message and exits with status 2, never a traceback (fednorm/cli/errors.py);
a run never writes over an earlier one without ``--overwrite`` (fednorm/cli/rundir.py); off a
terminal a run prints one progress line per evaluation (fednorm/cli/progress.py); without
``--threads`` a run uses the cores that are free (fednorm/cli/threads.py). Exit status: 0 done,
1 the run failed, 2 bad input (options, config, data), 130/143 stopped by SIGINT/SIGTERM (after writing a checkpoint).
"""

from __future__ import annotations

import argparse
import sys
import time
import types
import typing
from pathlib import Path
from typing import Any, Sequence

import yaml

from ..config import ExperimentConfig
from ..errors import ConfigError, DatasetError, DivergenceError, FednormError, RoundFailedError, RunWriteError
from .errors import EXIT_BAD_INPUT, EXIT_FAILED, ArgumentParser, exit_code_for_signal, one_line_warnings

__all__ = ["main", "build_parser", "QUICKSTART"]

# `fednorm compare` with no arguments: the HBN paper's local setting (label skew, batch 4, SGD with
# momentum, clipping) on the embedded digits, where FedAvg's averaged BatchNorm statistics fall
# behind the fixes (issue 17.8). About 45 s on 2 idle CPU cores with one torch thread (see README).
QUICKSTART: dict[str, Any] = {
    "dataset": "digits",
    "partition": "dirichlet",
    "alpha": 0.1,
    "num_clients": 10,
    "model": "simple_cnn",
    "rounds": 15,
    "local_epochs": 1,
    "batch_size": 4,
    "lr": 0.01,
    "momentum": 0.9,
    "max_grad_norm": 10.0,
    "eval_every": 5,
    "seed": 0,
}


# Config fields a run records about itself rather than options a user sets (`fednorm run --resume
# RUN --lr X` after a divergence appends to lr_restarts).
_RECORDED_FIELDS = ("lr_restarts",)


def _torch_version() -> str:
    import torch

    return torch.__version__


def _bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got '{text}'")


def _optional(inner: Any):
    def parse(text: str) -> Any:
        if text.lower() in ("none", "null"):
            return None
        return inner(text)

    parse.__name__ = getattr(inner, "__name__", "value")
    return parse


def _int_list(text: str) -> list[int]:
    text = text.strip()
    if not text:
        return []
    try:
        return [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None


def _mapping(text: str) -> dict[str, Any]:
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)  # yaml's full message quotes the text twice, with carets
        where = f" at column {mark.column + 1}" if mark is not None else ""
        raise argparse.ArgumentTypeError(f"expected a YAML/JSON mapping, got '{text}' ({getattr(exc, 'problem', None) or 'not YAML'}{where})") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a mapping such as '{{num_groups: 4}}', got '{text}'")
    return value


def _add_config_options(parser: argparse.ArgumentParser, skip: Sequence[str] = (), defaults: dict[str, Any] | None = None) -> None:
    """One option per config field; ``defaults`` replaces the shown default where the command uses
    another (``fednorm compare`` starts from :data:`QUICKSTART`)."""
    group = parser.add_argument_group("experiment settings (override --config)")
    for name, field in ExperimentConfig.model_fields.items():
        if name in skip or name in _RECORDED_FIELDS:
            continue
        ann = field.annotation
        origin = typing.get_origin(ann)
        args = typing.get_args(ann)
        optional = origin in (typing.Union, types.UnionType) and type(None) in args
        if optional:
            ann = next(a for a in args if a is not type(None))
            origin, args = typing.get_origin(ann), typing.get_args(ann)
        kwargs: dict[str, Any] = {"default": argparse.SUPPRESS, "help": field.description}
        if ann is bool:
            kwargs["type"] = _optional(_bool) if optional else _bool
            kwargs["metavar"] = "BOOL"
        elif origin is typing.Literal:
            kwargs["choices"] = list(args)
        elif origin is list and args == (str,):
            kwargs["type"] = _split
            kwargs["metavar"] = "NAME,NAME,..."
        elif origin is list:
            kwargs["type"] = _int_list
            kwargs["metavar"] = "N,N,..."
        elif origin is dict:
            kwargs["type"] = _mapping
            kwargs["metavar"] = "MAPPING"
        elif ann in (int, float, str):
            kwargs["type"] = _optional(ann) if optional else ann
            kwargs["metavar"] = ann.__name__.upper()
        default = field.default if field.default_factory is None else field.default_factory()
        desc = field.description or ""
        if defaults and name in defaults:
            desc = desc.split("; default:")[0].split(" (default")[0]
            kwargs["help"] = f"{desc} (default: {defaults[name]})"
        else:
            kwargs["help"] = desc if "(default" in desc else f"{desc} (default: {default})"
        group.add_argument("--" + name.replace("_", "-"), dest=name, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = ArgumentParser(
        prog="fednorm",
        description="Federated learning with normalization layers on non-IID data.",
    )
    parser.add_argument("--version", action="version", version=f"fednorm {__version__} (torch {_torch_version()}, Python {sys.version.split()[0]})")
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import MODULE (a module name or a .py file) first, so the methods, models, norms and datasets "
                             "it registers can be named (repeatable; also FEDNORM_PLUGINS=a,b and the 'fednorm.plugins' "
                             "entry points; docs/extending.md)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

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
    _add_config_options(p_run)

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
    _add_config_options(p_launch)

    p_cmp = sub.add_parser(
        "compare",
        help="compare methods/norms on one setting",
        description="Run several methods or norms on the same data, partition and seed, and write a table and a plot. "
        "With no arguments: FedAvg with BN and GN, FedLN, FedFN, FedBN, FedTAN, FBN and HBN on the embedded digits "
        "data under label skew at batch 4 (Dirichlet 0.1, 10 clients, 15 rounds).",
    )
    p_cmp.add_argument("--config", type=Path, help="YAML base config")
    p_cmp.add_argument("--methods", help="comma-separated methods (default: the config's method); a client optimizer's name "
                       "(fedlc, fedrs, feddecorr, fedprox, ...) means the config's method with that client optimizer; "
                       "'centralized': the union of the clients' data, the same samples per round (the upper bound)")
    p_cmp.add_argument("--client-opts", help="comma-separated client optimizers, 'none' for plain local SGD (the cross "
                       "product with --methods and --norms is run)")
    p_cmp.add_argument("--norms", help="comma-separated norms (default: the config's norm; the cross product with --methods is run)")
    p_cmp.add_argument("--variants", help="explicit variants 'method:norm,method:norm' (overrides --methods/--norms); "
                       "'method+client_opt:norm' adds a client optimizer (hbn+fedsam:hbn), 'centralized:norm' the reference")
    p_cmp.add_argument("--overwrite", action="store_true", help="write into an --out directory that holds an earlier comparison (its run files are deleted)")
    p_cmp.add_argument("--resume", type=Path, metavar="OUT", help="continue an interrupted comparison from OUT/compare.json: "
                       "finished variants are kept, the interrupted one resumes from its checkpoint, the rest run "
                       "(only --rounds, --threads, --device, --eval-every, ... may be given)")
    p_cmp.add_argument("--quiet", action="store_true", help="no progress bars or progress lines")
    cmp_seeds = p_cmp.add_mutually_exclusive_group()
    cmp_seeds.add_argument("--seeds", metavar="S,S,...", help="run every variant once per seed in OUT/<variant>/seed<k> and "
                           "tabulate mean ± std (results.md/.csv/.json, accuracy.png with ±std bands); rerunning keeps "
                           "finished seeds")
    cmp_seeds.add_argument("--num-seeds", type=int, metavar="N", help="--seeds SEED, SEED+1, ..., SEED+N-1 (SEED: --seed)")
    p_cmp.add_argument("--stack", choices=("auto", "off"), default="auto", help="with --seeds: train each variant's seeds "
                       "together as one computation where the method allows (auto), or one after another (off)")
    _add_config_options(p_cmp, defaults={**QUICKSTART, "out": "runs/compare-<dataset>-<time>"})

    p_part = sub.add_parser("partition", help="print and plot the per-client label histogram of a partition")
    p_part.add_argument("--config", type=Path, help="YAML config file")
    p_part.add_argument("--plot", type=Path, help="write the histogram plot here (PNG)")
    _add_config_options(
        p_part,
        skip=[n for n in ExperimentConfig.model_fields if n not in (
            "dataset", "dataset_args", "data_dir", "download", "partition", "alpha", "classes_per_client", "gamma", "min_size", "partition_args", "num_clients", "seed")],
    )

    # --- fednorm analyze (LN/FN paper's analyses; fednorm/analysis) ---------------------------
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

    # -- adapt (FedBN's new-client recipe, spec/004_fedbn.md §1.6) --
    p_adapt = sub.add_parser(
        "adapt", help="evaluate a never-trained client: averaged weights + BN statistics of its own data",
        description="Build the model of a client that never trained from a finished run: shared weights, the clients' "
        "averaged local tensors (FedBN: BN affine) and BN statistics computed on the client's own data; print its accuracy.",
    )
    p_adapt.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a fednorm run directory")
    who = p_adapt.add_mutually_exclusive_group(required=True)
    who.add_argument("--domain", help="a data source of the run's dataset (e.g. one left out with partition_args.sources)")
    who.add_argument("--client", type=int, help="a client id of the run")
    p_adapt.add_argument("--num-samples", type=int, help="at most this many training samples for the statistics "
                         "(default: all of the domain's or the client's training samples)")
    p_adapt.add_argument("--data-dir", help="dataset folder, if not the run's")

    p_fl = sub.add_parser(
        "flower-app", help="write a Flower app directory that runs this experiment on a Flower federation",
        description="Write DIR/pyproject.toml (a Flower app whose ServerApp and ClientApp are fednorm's) and "
        "DIR/experiment.yaml (the experiment, from the same options as `fednorm run`). Then start a SuperLink and "
        "SuperNodes and submit it with `flwr run DIR <connection>` (docs/deploy.md). Needs the flower extra.",
    )
    p_fl.add_argument("dir", type=Path, metavar="DIR")
    p_fl.add_argument("--config", type=Path, help="YAML config file (options below override it)")
    p_fl.add_argument("--num-nodes", type=int, default=2, help="SuperNodes the ServerApp waits for (default: 2)")
    p_fl.add_argument("--exchange-timeout", type=float, default=600.0, help="seconds one message exchange may take (default: 600)")
    _add_config_options(p_fl)

    from .reproduce import add_parser as add_reproduce_parser  # fednorm reproduce <paper> (fednorm/cli/reproduce.py)

    add_reproduce_parser(sub)
    from ..report.cli import add_parser as add_report_parser  # fednorm report RUN_DIR... (fednorm/report)

    add_report_parser(sub)
    from ..diagnostics.cli import add_parser as add_diagnose_parser  # fednorm diagnose RUN_DIR (fednorm/diagnostics)

    add_diagnose_parser(sub)
    from .evaluate import add_parser as add_evaluate_parser  # fednorm evaluate RUN_DIR --test-file F (fednorm/evaluation)

    add_evaluate_parser(sub)

    p_list = sub.add_parser("list", help="list methods, norms, models, datasets and partitions")
    p_list.add_argument("what", nargs="?", choices=["methods", "norms", "models", "datasets", "partitions", "client_opts", "server_opts", "aggregators", "attacks"], help="one registry (default: all)")
    p_list.add_argument("--verbose", action="store_true", help="methods: a line each, with where BatchNorm buffers and "
                        "affine parameters go (--buffers, --affine: default and supported settings)")
    return parser


def _config_from(args: argparse.Namespace, base: dict[str, Any] | None = None) -> ExperimentConfig:
    from ..config import load_config

    from ..data.partition import check_partition_args

    fields = {k: v for k, v in vars(args).items() if k in ExperimentConfig.model_fields}
    if args.config is None and base:
        fields = {**base, **fields}
    cfg = load_config(args.config, fields)
    check_partition_args(cfg.partition, cfg.partition_args)  # an ignored key must not be recorded as if it ran
    from ..centralized import CENTRALIZED, expand_centralized

    if cfg.method != CENTRALIZED:
        return cfg
    ref = expand_centralized(cfg)  # --method centralized: the union of the clients' data
    steps = f"{ref.local_steps} steps" if ref.local_steps is not None else f"{ref.local_epochs} epoch(s)"
    print(f"centralized reference of {cfg.num_clients} clients ({cfg.sampled_per_round} per round): one client holding "
          f"their union, batch {ref.batch_size}, {steps} per round (fednorm/centralized.py)", flush=True)
    return ref


def _given(args: argparse.Namespace, name: str) -> bool:
    return name in vars(args)


def _resolve_threads(cfg: ExperimentConfig) -> tuple[ExperimentConfig, str]:
    """``cfg`` with ``threads`` set (the user's, else :func:`choose_threads`) and a note on why."""
    if cfg.threads is not None:
        return cfg, "--threads"
    from .threads import choose_threads

    n, why = choose_threads()
    return cfg.model_copy(update={"threads": n}), why


def _fresh_run_config(args: argparse.Namespace, command: str, held: Any = None) -> ExperimentConfig:
    """The config of a new ``fednorm run``/``launch``, with a run directory that loses nothing:
    a repeat from a run's own ``config.yaml`` goes to a new directory beside it; any other
    directory holding a run is refused unless ``--overwrite`` (then its run files are deleted).
    With ``held`` (a :class:`contextlib.ExitStack`), the directory's writer lock is taken into it
    before anything is checked or deleted, so a live run is never overwritten or joined."""
    from . import rundir

    cfg = _config_from(args)
    if cfg.out is None:
        return cfg
    out = Path(cfg.out)
    overwrite = getattr(args, "overwrite", False)
    repeat = (args.config is not None and not _given(args, "out") and rundir.holds_run(out)
              and Path(args.config).resolve() == (out / "config.yaml").resolve())
    if repeat and not overwrite:
        new = rundir.next_free(out)
        print(f"repeating the run of {out} in a new directory {new} ({out} is left as it is)", flush=True)
        return cfg.model_copy(update={"out": str(new)})
    if held is not None:
        from ..engine.runlock import run_lock

        rundir.check_writable(out)
        held.enter_context(run_lock(out, "run"))
    rundir.check_run_dir(out, overwrite=overwrite, command=command)
    if overwrite and rundir.holds_run(out):
        from ..api import check_device
        from ..engine.simulator import check_names

        check_names(cfg)  # a typo must not cost the earlier run
        check_device(cfg.device)
        removed = rundir.clear_run(out)
        print(f"--overwrite: deleted the earlier run in {out} ({', '.join(removed)})", flush=True)
    return cfg


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

    with contextlib.ExitStack() as held:
        if args.resume is not None:
            if args.config is not None:
                raise ConfigError("--resume takes its settings from RUN_DIR/config.yaml; do not pass --config")
            fields = {k: v for k, v in vars(args).items() if k in ExperimentConfig.model_fields}
            result = run(resume=args.resume, progress=progress, simulation=simulation, on_round=on_round, **fields)
        else:
            if plain:
                cfg, _ = _resolve_threads(_fresh_run_config(args, "fednorm run", held))
            else:
                cfg = _config_from(args)
            result = run(cfg, progress=progress, simulation=simulation, on_round=on_round)
    if quiet:
        return 0
    s = result.summary
    again = "fednorm launch --nproc N" if command == "launch" else "fednorm run"
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


def _keeping_threads(fn: Any, *args: Any) -> int:
    """Run ``fn``, then give the process its torch thread count back (``main`` may be called
    in-process, from a notebook or a test, and a run sets the count it chose)."""
    import torch

    threads = torch.get_num_threads()
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(threads)


def _cmd_run(args: argparse.Namespace) -> int:
    if args.seeds is not None or args.num_seeds is not None:
        return _keeping_threads(_run_seeds_command, args)
    return _keeping_threads(run_command, args)


def _run_seeds_command(args: argparse.Namespace) -> int:
    """``fednorm run --seeds``: :func:`fednorm.seeds.run_seeds` with the run's options."""
    from ..engine.outputs import default_run_dir
    from ..seeds import run_seeds
    from . import rundir

    if args.resume is not None or args.overwrite:
        raise ConfigError("--seeds keeps finished seeds and resumes an interrupted one by itself: rerun the same "
                          "command (without --resume/--overwrite), or pick a new --out")
    cfg, _ = _resolve_threads(_config_from(args))
    seeds = _seed_list(args, cfg.seed)
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
        result = run_seeds(cfg, seeds, root, progress=progress, on_round=on_round, stack=args.stack != "off")
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
    if "interrupted" in statuses:
        print(f"interrupted; the finished seeds are kept: run the same command again to continue ({root})")
        return 130
    print(result.table())
    return 0


def _seed_list(args: argparse.Namespace, first: int) -> list[int]:
    """The seeds of ``--seeds S,S,...`` or ``--num-seeds N`` (from ``first``)."""
    if args.num_seeds is not None:
        if args.num_seeds < 1:
            raise ConfigError(f"--num-seeds must be at least 1, got {args.num_seeds}")
        return [first + i for i in range(args.num_seeds)]
    try:
        seeds = [int(t) for t in _split(args.seeds)]
    except ValueError:
        raise ConfigError(f"--seeds takes comma-separated integers, got {args.seeds!r}") from None
    if not seeds:
        raise ConfigError("--seeds needs at least one seed")
    return seeds


def _cmd_launch(args: argparse.Namespace, forwarded: list[str]) -> int:
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
        cfg = _fresh_run_config(args, "fednorm launch --nproc N", held)  # validate here, before any process starts
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
    held.enter_context(run_lock(run_dir, "launch"))  # re-entrant: _fresh_run_config may hold it already
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


def _split(text: str | None) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()] if text else []


def _method_variant(name: str, base_method: str) -> dict[str, str]:
    """``--methods`` entry: a method, or a client optimizer run with the config's method
    (``fedlc`` = FedAvg with FedLC's objective when the config's method is FedAvg)."""
    from ..methods.registry import METHODS
    from ..optim import CLIENT_OPTIMIZERS

    key = name.lower()
    if key not in METHODS and key in CLIENT_OPTIMIZERS and key != "none":
        return {"method": base_method, "client_opt": key}
    return {"method": name}


def _cmd_compare(args: argparse.Namespace) -> int:
    if args.resume is not None:
        return _compare_resume_command(args)
    import contextlib

    from ..engine.runlock import run_lock

    with contextlib.ExitStack() as held:
        return _compare_command(args, lambda out: held.enter_context(run_lock(out, "compare")))


def _compare_resume_command(args: argparse.Namespace) -> int:
    """``fednorm compare --resume OUT``: the comparison of ``OUT/compare.json``, continued."""
    from ..api import RESUMABLE_OVERRIDES, compare

    given = [k for k in vars(args) if k in ExperimentConfig.model_fields and k not in RESUMABLE_OVERRIDES]
    others = [o for o, on in (("--config", args.config), ("--methods", args.methods), ("--norms", args.norms),
                              ("--variants", args.variants), ("--client-opts", args.client_opts), ("--overwrite", args.overwrite),
                              ("--seeds", args.seeds), ("--num-seeds", args.num_seeds)) if on]
    if given or others:
        names = others + ["--" + k.replace("_", "-") for k in given]
        raise ConfigError(f"--resume takes the comparison's settings from OUT/compare.json; drop {', '.join(names)} (only "
                          "--rounds, --threads, --device, --eval-every, --checkpoint-every may change)")
    overrides = {k: v for k, v in vars(args).items() if k in RESUMABLE_OVERRIDES}
    if "threads" not in overrides:
        from .threads import choose_threads

        overrides["threads"], _ = choose_threads()
    on_round = None
    if not args.quiet:
        from .progress import ProgressLines, wants_lines

        on_round = ProgressLines() if wants_lines() else None
    print(f"resuming the comparison in {args.resume}", flush=True)
    result = compare(resume=args.resume, progress=False if args.quiet else None, on_round=on_round, **overrides)
    return _print_comparison(result, args.resume)


def _print_comparison(result: Any, out: Path) -> int:
    print(result.markdown())
    if result.results:
        print(f"\n{result.headline()}")
    print(f"\ntable: {out / 'results.md'}  csv: {out / 'results.csv'}" + (f"  plot: {out / 'accuracy.png'}" if result.results else ""))
    if result.stop_signal is not None:
        print(f"interrupted; continue with: fednorm compare --resume {out}", file=sys.stderr)
        return exit_code_for_signal(result.stop_signal)
    return 0


def _compare_command(args: argparse.Namespace, lock: Any) -> int:
    from ..api import DEFAULT_VARIANTS, compare, plan_variants
    from ..centralized import CENTRALIZED, centralized_overrides
    from . import rundir

    cfg = _config_from(args, base=QUICKSTART)
    if args.variants:
        variants = []
        for item in _split(args.variants):
            method, _, norm = item.partition(":")
            name, _, opt = method.partition("+")  # 'hbn+fedsam:hbn': a method with a client optimizer
            norm = norm or cfg.norm
            if name == CENTRALIZED:
                variants.append({**centralized_overrides(cfg.model_copy(update={"norm": norm})), "norm": norm,
                                 "label": f"centralized+{norm}"})
                continue
            variant = {**_method_variant(name, cfg.method), "norm": norm}
            variants.append({**variant, "client_opt": opt} if opt else variant)
    elif args.methods or args.norms or args.client_opts:
        methods = [_method_variant(m, cfg.method) for m in _split(args.methods)] or [{"method": cfg.method}]
        norms = _split(args.norms) or [cfg.norm]
        opts = [{} if o == "none" else {"client_opt": o} for o in _split(args.client_opts)] or [{}]
        variants = []
        for m in methods:
            for n in norms:
                if m.get("method") == CENTRALIZED:  # the union of the clients' data (fednorm/centralized.py)
                    over = centralized_overrides(cfg.model_copy(update={"norm": n}))
                    variants.append({**over, "norm": n, "label": f"centralized+{n}"})
                else:
                    variants.extend({**m, "norm": n, **o} for o in opts)
    else:
        variants = [dict(v) for v in DEFAULT_VARIANTS]
    if cfg.out:
        out = Path(cfg.out)
    else:
        out = Path("runs") / f"compare-{cfg.dataset}-{time.strftime('%Y%m%d-%H%M%S')}"
        out = rundir.next_free(out) if out.exists() else out
    rundir.check_writable(out)
    lock(out)  # one writer: a second compare into OUT, or a --resume of a live one, is refused
    if args.seeds is not None or args.num_seeds is not None:  # one run per variant and seed (fednorm/seeds.py)
        return _compare_seeds_command(args, cfg, variants, out)
    earlier = rundir.holds_comparison(out)
    if earlier and not args.overwrite:
        raise ConfigError(f"{out} already holds a comparison; continue it with `fednorm compare --resume {out}`, start "
                          "it again with --overwrite, or pass another --out")
    cfg, why = _resolve_threads(cfg.model_copy(update={"out": None}))
    plan_variants(cfg, variants, out)  # every variant valid before anything is deleted or trained
    if earlier:
        for child in [out, *sorted(c for c in out.iterdir() if c.is_dir())]:
            if rundir.holds_run(child):
                rundir.clear_run(child)
        for name in ("results.md", "results.csv", "accuracy.png", "compare.json"):
            (out / name).unlink(missing_ok=True)
        print(f"--overwrite: deleted the earlier comparison in {out}", flush=True)
    on_round = None
    if not args.quiet:
        from .progress import OverallBar, ProgressLines, wants_lines

        on_round = ProgressLines(variants=len(variants)) if wants_lines() else OverallBar(len(variants), cfg.rounds)
    print(
        f"comparing {len(variants)} variants on {cfg.dataset} ({cfg.partition}, {cfg.num_clients} clients, "
        f"{cfg.rounds} rounds, seed {cfg.seed}, {cfg.threads} torch thread{'s' if cfg.threads != 1 else ''}: {why}) -> {out}",
        flush=True,
    )
    result = compare(cfg, variants=variants, out=out, progress=False if args.quiet else None, on_round=on_round)
    getattr(on_round, "close", lambda: None)()
    return _print_comparison(result, out)


def _compare_seeds_command(args: argparse.Namespace, cfg: ExperimentConfig, variants: list[dict[str, Any]], out: Path) -> int:
    """``fednorm compare --seeds``: every variant once per seed, a mean ± std table."""
    from ..api import plan_variants
    from ..seeds import compare_seeds

    if args.overwrite:
        raise ConfigError("--seeds keeps finished seeds by itself: rerun the same command without --overwrite, or pick a new --out")
    seeds = _seed_list(args, cfg.seed)
    cfg, why = _resolve_threads(cfg.model_copy(update={"out": None}))
    planned = plan_variants(cfg, variants, out)  # every variant valid before anything trains
    on_round = None
    if not args.quiet:
        from .progress import OverallBar, ProgressLines, wants_lines

        runs = len(planned) * len(seeds)
        on_round = ProgressLines(variants=runs) if wants_lines() else OverallBar(runs, cfg.rounds)
    print(f"comparing {len(planned)} variants x {len(seeds)} seeds ({', '.join(map(str, seeds))}) on {cfg.dataset} "
          f"({cfg.partition}, {cfg.num_clients} clients, {cfg.rounds} rounds, {cfg.threads} torch "
          f"thread{'s' if cfg.threads != 1 else ''}: {why}) -> {out}", flush=True)
    try:
        result = compare_seeds(planned, seeds, out, progress=False if args.quiet else None, on_round=on_round,
                               stack=args.stack != "off",
                               title=f"{cfg.dataset}, {cfg.partition}, {cfg.num_clients} clients, {len(seeds)} seeds")
    finally:
        getattr(on_round, "close", lambda: None)()
    print(result.markdown())
    print(f"\ntable: {out / 'results.md'}  csv: {out / 'results.csv'}  json: {out / 'results.json'}"
          + (f"  plot: {out / 'accuracy.png'}" if result.results else ""))
    if result.interrupted:
        print(f"interrupted; finished seeds are kept: run the same command again to continue ({out})")
        return 130
    return 0


def _cmd_partition(args: argparse.Namespace) -> int:
    from ..data.federated import federated_data_from_config
    from ..data.partition import describe

    cfg = _config_from(args)
    data = federated_data_from_config(cfg)
    hist = data.histogram()
    print(f"{cfg.partition} partition of {cfg.dataset} over {cfg.num_clients} clients (seed {cfg.seed}):")
    print(describe(hist))
    if data.client_domain is not None and data.domain_names is not None:  # feature shift: one source per client
        print("sources: " + ", ".join(f"{c}={data.domain_names[d]}" for c, d in enumerate(data.client_domain)))
    if args.plot:
        from ..plotting import plot_histogram

        args.plot.parent.mkdir(parents=True, exist_ok=True)
        plot_histogram(hist, args.plot, title=f"{cfg.dataset}: {cfg.partition}")
        print(f"plot: {args.plot}")
    return 0


def _cmd_analyze(args: argparse.Namespace) -> int:
    from ..analysis import analyze_run, format_table

    for name in ("steps", "per_class", "max_test"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.lr is not None and not args.lr > 0:
        raise ConfigError(f"--lr must be positive, got {args.lr}")
    result = analyze_run(args.run_dir, client=args.client, steps=args.steps, lr=args.lr, per_class=args.per_class,
                         max_test=args.max_test, plots=not args.no_plots)
    print(format_table(result))
    print(f"analysis: {args.run_dir / 'analysis.json'}" + ("" if args.no_plots else f"  plots: {args.run_dir}/analysis_*.png"))
    return 0


def _cmd_adapt(args: argparse.Namespace) -> int:
    import json

    from ..engine.adapt import adapt

    result = adapt(args.run_dir, domain=args.domain, client=args.client, num_samples=args.num_samples, data_dir=args.data_dir)
    print(json.dumps(result.summary(), indent=2))
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from ..data.datasets import list_datasets
    from ..data.partition import list_partitions
    from ..methods import list_methods
    from ..models import list_models
    from ..nn.norms import list_norms
    from ..optim import list_client_optimizers, list_server_optimizers
    from ..robust.aggregators import AGGREGATORS
    from ..robust.attacks import ATTACKS

    listing = {
        "methods": sorted([*list_methods(), "centralized"]),  # centralized: a config recipe (fednorm/centralized.py)
        "norms": list_norms(),
        "models": list_models(),
        "datasets": [*list_datasets(), "hf:<path> (hf extra)"],  # docs/data.md
        "partitions": [*list_partitions(), "flwr:<Partitioner> (hf extra)"],
        "client_opts": list_client_optimizers(),
        "server_opts": list_server_optimizers(),
        "aggregators": AGGREGATORS.list(),
        "attacks": ATTACKS.list(),
    }
    for what, names in listing.items():
        if args.what in (None, what):
            if what == "methods" and args.verbose:
                from ..methods.registry import describe_methods

                print("methods (buffers/affine: global = sent and combined, local = kept per client, drop = not sent, "
                      "recomputed by the method):")
                print("\n".join("  " + line for line in describe_methods()))
                continue
            print(f"{what}: {', '.join(names)}")
    return 0


def _cmd_flower_app(args: argparse.Namespace) -> int:
    """``fednorm flower-app DIR``: the experiment and a Flower app that runs it."""
    from ..methods import METHODS

    from ..flower.appdir import check_round_based, write_app  # no flwr needed to write the app

    cfg = _config_from(args)
    check_round_based(cfg.method, getattr(METHODS.get_builder(cfg.method), "requires_lockstep", False))
    args.dir.mkdir(parents=True, exist_ok=True)
    experiment = args.dir / "experiment.yaml"
    data = cfg.model_dump(mode="json")
    out = data.pop("out", None)
    experiment.write_text(yaml.safe_dump(data, sort_keys=False))
    path = write_app(args.dir, config=experiment, out=out, num_nodes=args.num_nodes, timeout=args.exchange_timeout)
    n = args.num_nodes
    print(f"wrote {path} and {experiment}")
    print("next: start a SuperLink and the SuperNodes, then submit (see docs/deploy.md):")
    print("  flower-superlink --insecure --disable-runtime-dependency-installation")
    for i in range(n):
        print(f"  flower-supernode --insecure --superlink 127.0.0.1:8000 --port {9094 + i} "
              f"--node-config 'partition-id={i} num-partitions={n}'")
    print(f"  flwr run {args.dir} <connection>   # [superlink.<connection>] in $FLWR_HOME/config.toml")
    return 0


def _cmd_reproduce(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .reproduce import command

    return command(args, argv)


def _cmd_report(args: argparse.Namespace) -> int:
    from ..report.cli import command

    return command(args)


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from ..diagnostics.cli import command

    return command(args)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from .evaluate import command

    return command(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a one-line argparse error (already printed)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_BAD_INPUT)
    from ..plugins import export_to_environment, load_plugins

    try:  # before any config is read: a plugin's method, model, norm or dataset can then be named
        load_plugins(args.plugin)
    except FednormError as exc:
        print(f"fednorm: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    export_to_environment(args.plugin)  # the processes fednorm starts load them too
    if args.command is None:
        parser.print_help()
        return 0
    import warnings

    shown = warnings.showwarning
    one_line_warnings(f"fednorm {args.command}")
    try:
        return _dispatch(args, argv)
    finally:
        warnings.showwarning = shown


def _dispatch(args: argparse.Namespace, argv: list[str]) -> int:
    from ..engine.checkpoint import CheckpointError

    if args.command == "launch":  # the workers get every option but the launcher's own
        own = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        own.add_argument("--nproc")
        own.add_argument("--backend")
        own.add_argument("--timeout")
        _, forwarded = own.parse_known_args(argv[argv.index("launch") + 1:])
        try:
            return _cmd_launch(args, forwarded)
        except FednormError as exc:
            print(f"fednorm launch: error: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    handler = {"run": _cmd_run, "compare": lambda a: _keeping_threads(_cmd_compare, a), "partition": _cmd_partition, "list": _cmd_list,
               "analyze": _cmd_analyze, "flower-app": _cmd_flower_app,
               "adapt": _cmd_adapt, "reproduce": lambda a: _cmd_reproduce(a, argv), "report": _cmd_report,
               "diagnose": _cmd_diagnose, "evaluate": _cmd_evaluate}[args.command]
    try:
        return handler(args)
    except FednormError as exc:
        print(f"fednorm {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except DatasetError as exc:  # bad or missing data is bad input too: nothing ran (issue 19)
        text = " ".join(str(exc).replace("You can use download=True to download it", "Pass --download true to download it").split())
        print(f"fednorm {args.command}: error: {text}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (DivergenceError, RoundFailedError, CheckpointError, RunWriteError) as exc:
        print(f"fednorm {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:  # a disk that filled up or a folder that vanished while running
        print(f"fednorm {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"fednorm {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
