"""The ``fednorm`` command: the top-level parser, plugin loading and dispatch to the subcommands.

Each subcommand is one module with ``add_parser(sub)`` and ``command(args)``: ``run``,
``launch``, ``compare``, ``partition``, ``analyze``, ``adapt``, ``flower-app`` and ``list`` in
fednorm/cli/ (run.py ... listing.py), ``reproduce`` and ``evaluate`` beside them, ``report`` in
fednorm/report/cli.py and ``diagnose`` in fednorm/diagnostics/cli.py; what they share (the
options generated from the config schema, the config and run directory of a command) is
fednorm/cli/common.py.

``fednorm run`` and ``fednorm compare`` take every :class:`~fednorm.config.ExperimentConfig`
field as an option (``local_epochs`` -> ``--local-epochs``), generated from the config
schema so the CLI and YAML files never drift apart. Options override ``--config``'s values.
Bad input prints one clear message and exits with status 2, never a traceback (fednorm/cli/errors.py);
a run never writes over an earlier one without ``--overwrite`` (fednorm/engine/rundir.py); off a
terminal a run prints one progress line per evaluation (fednorm/cli/progress.py); without
``--threads`` a run uses the cores that are free (fednorm/cli/threads.py). Exit status: 0 done,
1 the run failed, 2 bad input (options, config, data), 130/143 stopped by SIGINT/SIGTERM (after writing a checkpoint).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ..errors import DatasetError, DivergenceError, FednormError, RoundFailedError, RunWriteError
from . import adapt, analyze, compare, flower_app, launch, listing, partition, run
from .common import config_from as _config_from  # noqa: F401  (fednorm.distributed.worker imports it from here)
from .common import keeping_threads as _keeping_threads
from .compare import QUICKSTART
from .errors import EXIT_BAD_INPUT, EXIT_FAILED, ArgumentParser, exit_code_for_signal, one_line_warnings
from .run import run_command

__all__ = ["main", "build_parser", "run_command", "QUICKSTART"]


def _torch_version() -> str:
    import torch

    return torch.__version__


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

    for module in (run, launch, compare, partition, analyze, adapt, flower_app):  # in `fednorm --help` order
        module.add_parser(sub)

    from .reproduce import add_parser as add_reproduce_parser  # fednorm reproduce <paper> (fednorm/cli/reproduce.py)

    add_reproduce_parser(sub)
    from ..report.cli import add_parser as add_report_parser  # fednorm report RUN_DIR... (fednorm/report)

    add_report_parser(sub)
    from ..diagnostics.cli import add_parser as add_diagnose_parser  # fednorm diagnose RUN_DIR (fednorm/diagnostics)

    add_diagnose_parser(sub)
    from .evaluate import add_parser as add_evaluate_parser  # fednorm evaluate RUN_DIR --test-file F (fednorm/evaluation)

    add_evaluate_parser(sub)

    listing.add_parser(sub)
    return parser


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
            return launch.command(args, forwarded)
        except FednormError as exc:
            print(f"fednorm launch: error: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    handler = {"run": run.command, "compare": lambda a: _keeping_threads(compare.command, a), "partition": partition.command,
               "list": listing.command, "analyze": analyze.command, "flower-app": flower_app.command,
               "adapt": adapt.command, "reproduce": lambda a: _cmd_reproduce(a, argv), "report": _cmd_report,
               "diagnose": _cmd_diagnose, "evaluate": _cmd_evaluate}[args.command]
    args.argv = list(argv)  # a run set records the command that continues it
    try:
        return handler(args)
    except DatasetError as exc:  # bad or missing data is bad input too: nothing ran (issue 19); before FednormError, its base
        text = " ".join(str(exc).replace("You can use download=True to download it", "Pass --download true to download it").split())
        print(f"fednorm {args.command}: error: {text}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except FednormError as exc:
        print(f"fednorm {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (DivergenceError, RoundFailedError, CheckpointError, RunWriteError) as exc:
        print(f"fednorm {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:  # a disk that filled up or a folder that vanished while running
        import errno

        if exc.errno in (errno.ENAMETOOLONG, errno.ELOOP):  # a path no file system takes: bad input (issue 50)
            from ..engine.rundir import shown

            where = f"{shown(exc.filename)}: " if exc.filename else ""
            print(f"fednorm {args.command}: error: {where}{exc.strerror or exc}; pass a shorter path", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(f"fednorm {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt as exc:
        print(f"fednorm {args.command}: interrupted", file=sys.stderr)
        return exit_code_for_signal(getattr(exc, "signum", None))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
