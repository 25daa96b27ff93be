"""``torchrun --nproc-per-node N -m fednorm.distributed [--backend B] [--timeout S] RUN-OPTIONS``.

One worker process of a distributed run: it joins the process group from torchrun's environment
and runs ``fednorm run RUN-OPTIONS`` with its share of the clients. ``fednorm launch`` starts these
workers on one machine; on a cluster, start torchrun on every node with the same options.
"""

import sys

from .worker import main

if __name__ == "__main__":
    sys.exit(main())
