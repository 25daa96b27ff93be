"""``torchrun --nproc-per-node N -m fednorm.distributed [--backend B] [--timeout S] RUN-OPTIONS``.

One worker process of a distributed run: it joins the process group from torchrun's environment
and runs ``fednorm run RUN-OPTIONS`` with its share of the clients. ``fednorm launch`` starts these
workers on one machine; on a cluster, start torchrun on every node with the same options.
"""

import os
import sys

from .worker import main

if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without interpreter finalisation: the run directory is written and the process group
    # destroyed, and gloo's worker threads can otherwise abort the process while Python shuts
    # down ("terminate called without an active exception", pytorch/pytorch#179291).
    os._exit(code)
