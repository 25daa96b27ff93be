"""``fednorm flower-app DIR``: a Flower app directory that runs the experiment on a Flower federation."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from .common import add_config_options, config_from

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    """The ``flower-app`` subcommand's options."""
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
    add_config_options(p_fl)


def command(args: argparse.Namespace) -> int:
    """``fednorm flower-app DIR``: the experiment and a Flower app that runs it."""
    from ..methods import METHODS

    from ..flower.appdir import check_round_based, write_app  # no flwr needed to write the app

    cfg = config_from(args)
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
