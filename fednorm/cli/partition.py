"""``fednorm partition``: the per-client label histogram of a partition, printed and plotted."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..config import ExperimentConfig
from ..config_roles import fields_with_role
from .common import add_config_options, config_from

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    """The ``partition`` subcommand's options."""
    p_part = sub.add_parser("partition", help="print and plot the per-client label histogram of a partition")
    p_part.add_argument("--config", type=Path, help="YAML config file")
    p_part.add_argument("--plot", type=Path, help="write the histogram plot here (PNG)")
    add_config_options(
        p_part,
        skip=[n for n in ExperimentConfig.model_fields if n not in fields_with_role("data", "data_source", "partition", "seed")],
    )


def command(args: argparse.Namespace) -> int:
    from ..data.federated import federated_data_from_config
    from ..data.partition import describe

    cfg = config_from(args)
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
