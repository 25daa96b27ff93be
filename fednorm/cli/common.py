"""What the ``fednorm`` subcommands share: config options generated from the schema, the config a
command's options give, the thread count, and a fresh run directory that loses nothing.

Kept out of :mod:`fednorm.cli.main`, which imports every subcommand's module: a subcommand that
imported ``main`` for these would close an import circle.
"""

from __future__ import annotations

import argparse
import types
import typing
from pathlib import Path
from typing import Any, Sequence

import yaml

from .. import yaml_io
from ..config import ExperimentConfig
from ..config_roles import RECORDED_FIELDS
from ..errors import ConfigError

__all__ = [
    "add_config_options",
    "config_from",
    "resolve_threads",
    "fresh_run_config",
    "seed_list",
    "split_names",
    "keeping_threads",
]

# Config fields a run records about itself rather than options a user sets (`fednorm run --resume
# RUN --lr X` after a divergence appends to lr_restarts).
_RECORDED_FIELDS = RECORDED_FIELDS


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
        value = yaml_io.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)  # yaml's full message quotes the text twice, with carets
        where = f" at column {mark.column + 1}" if mark is not None else ""
        raise argparse.ArgumentTypeError(f"expected a YAML/JSON mapping, got '{text}' ({getattr(exc, 'problem', None) or 'not YAML'}{where})") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a mapping such as '{{num_groups: 4}}', got '{text}'")
    return value


def split_names(text: str | None) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``; ``None`` or ``""`` -> ``[]``."""
    return [t.strip() for t in text.split(",") if t.strip()] if text else []


def add_config_options(parser: argparse.ArgumentParser, skip: Sequence[str] = (), defaults: dict[str, Any] | None = None) -> None:
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
            kwargs["type"] = split_names
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


def config_from(args: argparse.Namespace, base: dict[str, Any] | None = None) -> ExperimentConfig:
    """The config of a command's options over ``--config`` (over ``base`` when no ``--config`` is
    given); ``--method centralized`` becomes the centralized reference's config."""
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


def resolve_threads(cfg: ExperimentConfig) -> tuple[ExperimentConfig, str]:
    """``cfg`` with ``threads`` set (the user's, else :func:`choose_threads`) and a note on why."""
    if cfg.threads is not None:
        return cfg, "--threads"
    from .threads import choose_threads

    n, why = choose_threads()
    return cfg.model_copy(update={"threads": n}), why


def fresh_run_config(args: argparse.Namespace, command: str, held: Any = None) -> ExperimentConfig:
    """The config of a new ``fednorm run``/``launch``, with a run directory that loses nothing:
    a repeat from a run's own ``config.yaml`` goes to a new directory beside it; any other
    directory holding a run is refused unless ``--overwrite`` (then its run files are deleted).
    With ``held`` (a :class:`contextlib.ExitStack`), the directory's writer lock is taken into it
    before anything is checked or deleted, so a live run is never overwritten or joined."""
    from ..engine import rundir

    cfg = config_from(args)
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


def seed_list(args: argparse.Namespace, first: int) -> list[int]:
    """The seeds of ``--seeds S,S,...`` or ``--num-seeds N`` (from ``first``)."""
    if args.num_seeds is not None:
        if args.num_seeds < 1:
            raise ConfigError(f"--num-seeds must be at least 1, got {args.num_seeds}")
        return [first + i for i in range(args.num_seeds)]
    try:
        seeds = [int(t) for t in split_names(args.seeds)]
    except ValueError:
        raise ConfigError(f"--seeds takes comma-separated integers, got {args.seeds!r}") from None
    if not seeds:
        raise ConfigError("--seeds needs at least one seed")
    twice = sorted({s for s in seeds if seeds.count(s) > 1})
    if twice:  # `--seeds 0,0` silently ran one seed and reported it as a mean over seeds (issue 50)
        raise ConfigError(f"--seeds lists seed {twice[0]} more than once ({args.seeds}): each seed is one run "
                          f"(OUT/seed{twice[0]}); list each once")
    bad = [s for s in seeds if s < 0]
    if bad:
        raise ConfigError(f"--seeds takes seeds of 0 or more, got {bad[0]}")
    return seeds


def keeping_threads(fn: Any, *args: Any) -> int:
    """Run ``fn``, then give the process its torch thread count back (``main`` may be called
    in-process, from a notebook or a test, and a run sets the count it chose)."""
    import torch

    threads = torch.get_num_threads()
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(threads)
