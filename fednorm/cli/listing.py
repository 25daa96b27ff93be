"""``fednorm list``: the registered methods, norms, models, datasets, partitions, optimizers, aggregators and attacks."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    """The ``list`` subcommand's options."""
    p_list = sub.add_parser("list", help="list methods, norms, models, datasets and partitions")
    p_list.add_argument("what", nargs="?", choices=["methods", "norms", "models", "datasets", "partitions", "client_opts", "server_opts", "aggregators", "attacks"], help="one registry (default: all)")
    p_list.add_argument("--verbose", action="store_true", help="methods: a line each, with where BatchNorm buffers and "
                        "affine parameters go (--buffers, --affine: default and supported settings)")


def command(args: argparse.Namespace) -> int:
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
