"""The options a distributed worker adds to ``fednorm run``'s (``fednorm launch`` forwards them).

Kept apart from :mod:`fednorm.distributed.worker` so that building the CLI's parser imports
neither ``torch.distributed`` nor the worker: the worker imports the CLI, never the reverse.
"""

from __future__ import annotations

import argparse

__all__ = ["add_worker_options"]


def add_worker_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=["gloo", "nccl"], help="collective backend (default: nccl with CUDA, else gloo)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds any collective may wait for the other ranks before the run fails (default: 300)")
