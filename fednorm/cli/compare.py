"""``fednorm compare``: several methods or norms on the same data, partition and seed, with a table
and a plot; ``--resume`` continues an interrupted comparison and ``--seeds`` repeats it per seed."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ..config import ExperimentConfig
from ..errors import ConfigError
from .common import add_config_options, config_from, resolve_threads, seed_list, split_names
from .errors import exit_code_for_signal

__all__ = ["QUICKSTART", "add_parser", "command"]

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
    "eval_last_rounds": 10,  # each of rounds 6-15 evaluated too: the table's last-10 column is their mean (issue 50)
    "seed": 0,
}


def add_parser(sub: Any) -> None:
    """The ``compare`` subcommand's options."""
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
    add_config_options(p_cmp, defaults={**QUICKSTART, "out": "runs/compare-<dataset>-<time>"})


def _method_variant(name: str, base_method: str) -> dict[str, str]:
    """``--methods`` entry: a method, or a client optimizer run with the config's method
    (``fedlc`` = FedAvg with FedLC's objective when the config's method is FedAvg)."""
    from ..methods.registry import METHODS
    from ..optim import CLIENT_OPTIMIZERS

    key = name.lower()
    if key not in METHODS and key in CLIENT_OPTIMIZERS and key != "none":
        return {"method": base_method, "client_opt": key}
    return {"method": name}


def command(args: argparse.Namespace) -> int:
    """``fednorm compare``: a new comparison, or ``--resume OUT``."""
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
    from ..engine.rundir import shown

    try:
        there = (args.resume / "compare.json").is_file()
    except OSError as exc:  # a name too long for the file system
        raise ConfigError(f"cannot resume {shown(args.resume)}: {exc.strerror or exc}") from None
    if there:  # else the one line of compare(resume=...) says what is wrong, with nothing before it
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
    from ..engine import rundir

    for option, value, hint in (("--variants", args.variants, "method:norm,method:norm"), ("--methods", args.methods, "fedavg,fedbn"),
                                ("--norms", args.norms, "bn,gn"), ("--client-opts", args.client_opts, "none,fedprox")):
        if value is not None and not split_names(value):  # `--methods ""` ran all 8 default variants (issue 50)
            raise ConfigError(f"{option} is empty: name at least one ({option} {hint}; fednorm list), or leave it out")
    cfg = config_from(args, base=QUICKSTART)
    if args.variants:
        variants = []
        for item in split_names(args.variants):
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
        methods = [_method_variant(m, cfg.method) for m in split_names(args.methods)] or [{"method": cfg.method}]
        norms = split_names(args.norms) or [cfg.norm]
        opts = [{} if o == "none" else {"client_opt": o} for o in split_names(args.client_opts)] or [{}]
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
    earlier = rundir.check_comparison_dir(out, overwrite=args.overwrite)
    cfg, why = resolve_threads(cfg.model_copy(update={"out": None}))
    plan_variants(cfg, variants, out)  # every variant valid before anything is deleted or trained
    if earlier:
        rundir.clear_comparison(out)
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
    seeds = seed_list(args, cfg.seed)
    cfg, why = resolve_threads(cfg.model_copy(update={"out": None}))
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
        return exit_code_for_signal(result.stop_signal)
    return 0
