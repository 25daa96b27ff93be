"""``fednorm adapt RUN_DIR``: a never-trained client's model and accuracy (:mod:`fednorm.engine.adapt`), by
FedBN's recipe for an unseen-domain client (Li et al. 2021, "FedBN", App. G): the clients' averaged
local tensors and BN statistics of the client's own data."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    """The ``adapt`` subcommand's options."""
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


def command(args: argparse.Namespace) -> int:
    import json

    from ..engine.adapt import adapt

    result = adapt(args.run_dir, domain=args.domain, client=args.client, num_samples=args.num_samples, data_dir=args.data_dir)
    print(json.dumps(result.summary(), indent=2))
    return 0
