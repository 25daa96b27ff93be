"""``fednorm adapt RUN_DIR``: a never-trained client's model and accuracy (:mod:`fednorm.engine.adapt`), by
FedBN's recipe for an unseen-domain client (Li et al. 2021, "FedBN", App. G): the clients' averaged
local tensors and BN statistics of the client's own data. The client holds a domain or a client of the
run's dataset (``--domain``, ``--client``), or another dataset with the run's classes (``--dataset``,
:mod:`fednorm.evaluation.unseen`: FedBN Table 17's Morpho-MNIST clients of a digits run)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .common import _mapping

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
    who.add_argument("--dataset", help="another registered dataset with the run's classes (e.g. morpho_mnist for a "
                     "digits run); its images are fitted to the run's input size and channels and normalised as "
                     "the run's; accuracy on all of its test images; recorded in RUN_DIR/unseen.json")
    p_adapt.add_argument("--dataset-args", type=_mapping, default={}, metavar="MAPPING",
                         help="with --dataset: its options as YAML, e.g. '{variant: global}'")
    p_adapt.add_argument("--num-samples", type=int, help="at most this many training samples for the statistics "
                         "(default: all of the domain's, the client's or the dataset's training samples; "
                         "with --dataset a draw seeded by the run's seed)")
    p_adapt.add_argument("--data-dir", help="dataset folder, if not the run's")


def command(args: argparse.Namespace) -> int:
    import json

    if args.dataset_args and args.dataset is None:
        raise ConfigError("--dataset-args goes with --dataset")
    if args.dataset is not None:
        from ..evaluation.unseen import adapt_run_to_dataset, read_unseen

        name = args.dataset + "".join(f"_{v}" for v in args.dataset_args.values() if isinstance(v, (str, int)))
        earlier = read_unseen(args.run_dir).get(name)
        result = adapt_run_to_dataset(args.run_dir, args.dataset, dataset_args=args.dataset_args, name=name,
                                      num_samples=args.num_samples, data_dir=args.data_dir)
        print(json.dumps(result.summary(), indent=2))
        print(f"recorded as '{name}' in {args.run_dir / 'unseen.json'}"
              + (f", replacing the earlier entry (accuracy {earlier.get('accuracy')}, num_samples {earlier.get('num_samples')})"
                 if earlier else ""))
        return 0
    from ..engine.adapt import adapt

    result = adapt(args.run_dir, domain=args.domain, client=args.client, num_samples=args.num_samples, data_dir=args.data_dir)
    print(json.dumps(result.summary(), indent=2))
    return 0
