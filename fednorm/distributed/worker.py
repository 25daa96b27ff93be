"""The worker of a distributed run (see ``python -m fednorm.distributed``)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

import torch.distributed as dist

from ..cli.worker_options import add_worker_options

__all__ = ["main", "add_worker_options", "FAULT_ENV"]

# Fault injection for tests and drills: "RANK:ROUND" makes that rank exit abruptly (os._exit)
# when it starts that round, as a crashed machine would; "RANK:ROUND:hang" makes it stop
# answering instead (the others' collectives then time out after --timeout).
FAULT_ENV = "FEDNORM_KILL_RANK_AT_ROUND"


def _fault_hook():
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return None
    parts = spec.split(":")
    rank, round_, hang = int(parts[0]), int(parts[1]), parts[2:] == ["hang"]
    if dist.get_rank() != rank:
        return None

    def hook(server_round: int) -> None:
        if server_round == round_:
            print(f"[fault injection] rank {rank} {'hangs' if hang else 'exits'} at the start of round {round_}",
                  file=sys.stderr, flush=True)
            if hang:
                import signal
                import time

                signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a stuck process the launcher can still stop
                while True:
                    time.sleep(60)
            os._exit(17)

    return hook


def main(argv: Sequence[str] | None = None) -> int:
    from ..cli.main import build_parser, run_command
    from ..engine.checkpoint import CheckpointError
    from ..errors import ConfigError, DatasetError, DivergenceError, FednormError, RoundFailedError
    from .runtime import DistributedSimulation, init_distributed

    own = argparse.ArgumentParser(prog="python -m fednorm.distributed", add_help=False)
    add_worker_options(own)
    known, rest = own.parse_known_args(argv)
    from ..plugins import load_plugins

    load_plugins()  # FEDNORM_PLUGINS, set by the launcher's --plugin, and the entry points
    args = build_parser().parse_args(["run", *rest])
    try:
        init_distributed(known.backend, known.timeout)
    except ConfigError as exc:
        print(f"fednorm.distributed: error: {exc}", file=sys.stderr)
        return 2
    if args.resume is None:  # one run directory for every rank
        from ..cli.main import _config_from
        from ..engine.outputs import default_run_dir

        cfg = _config_from(args)
        box = [cfg.out or str(default_run_dir(cfg)) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        args.out = box[0]
    hook = _fault_hook()

    class Runtime(DistributedSimulation):
        def begin_round(self):  # noqa: D102 - fault injection only
            if hook is not None:
                hook(self.server_round + 1)
            return super().begin_round()

    factory = Runtime if hook is not None else DistributedSimulation
    rank = dist.get_rank()
    code = 1
    try:
        code = run_command(args, simulation=factory, quiet=rank != 0, command="launch")
    except (FednormError, DatasetError, DivergenceError, RoundFailedError, CheckpointError) as exc:
        # the same on every rank (the runtime raises round errors everywhere): rank 0 reports
        if rank == 0:
            print(f"fednorm launch: error: {exc}", file=sys.stderr, flush=True)
        code = 2 if isinstance(exc, FednormError) else 1
    except Exception as exc:  # a lost peer or a collective timeout: say where to resume
        out = args.resume or getattr(args, "out", None)
        print(
            f"fednorm launch: rank {rank} stopped: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}\n"
            f"fednorm launch: another process probably died or stopped answering; the last checkpoint is in "
            f"{out}; continue with: fednorm launch --nproc N --resume {out}",
            file=sys.stderr, flush=True,
        )
        code = 1
    finally:
        if dist.is_initialized():
            try:
                if code == 0:
                    dist.barrier()  # no rank tears down while another still talks to it
                dist.destroy_process_group()
            except Exception:
                pass
    return code
