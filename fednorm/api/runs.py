"""One run: :func:`run` builds the simulation, trains it round by round with checkpoints, and
writes the run directory; a failure ends in one line that says how to continue."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from torch import nn

from ..config import ExperimentConfig
from ..data.federated import FederatedData
from ..engine.simulator import Simulation
from .session import RunResult, RunSession, open_run
from .stop import StopRequest

__all__ = ["RunResult", "run"]


def run(
    config: ExperimentConfig | Mapping[str, Any] | str | Path | None = None,
    *,
    model: str | nn.Module | Callable[[], nn.Module] | None = None,
    data: FederatedData | None = None,
    write: bool = True,
    progress: bool | None = None,
    resume: str | Path | None = None,
    simulation: Callable[..., Simulation] = Simulation,
    on_round: Callable[[Any, Simulation], None] | None = None,
    callbacks: Sequence[Any] = (),
    overwrite: bool = False,
    **overrides: Any,
) -> RunResult:
    """Run one federated experiment, or resume one from its run directory.

    Args:
        config: an :class:`ExperimentConfig`, a mapping of fields, or a YAML path.
        model: a registry name (``"resnet20"``), or your own ``nn.Module`` or a zero-argument
            factory of one (a class, a lambda): its BatchNorm layers are converted for the
            config's ``norm`` as ``--norm`` converts a registry model's (``bn`` keeps them;
            left at ``bn``, methods ``hbn``/``fbn`` convert them to their own layers). Your
            module is never changed: an instance is deep-copied (every run, every seed, starts
            from its weights), a factory is called under the run's seeded initialisation (each
            seed starts from its own). The run records it as ``model: user:ClassName`` with
            its architecture's fingerprint; resume it with the same model passed again.
        data: client data of your own (:meth:`FederatedData.from_tensors`,
            :meth:`FederatedData.from_datasets`), recorded as ``dataset: user:NAME``, or
            already-built data of the config's dataset/partition/seed.
        write: write the run directory (``config.out`` or ``runs/<method>-<norm>-...``),
            including checkpoints every ``checkpoint_every`` rounds and at the end.
        progress: show a progress bar (default: only on a terminal).
        resume: a run directory to continue from its latest checkpoint; its ``config.yaml`` is
            the config, and only ``fednorm.api.RESUMABLE_OVERRIDES`` (``rounds``, ``eval_every``,
            ``eval_last_rounds``, ``checkpoint_every``, ``threads``, ``device``, ...) may be
            overridden (e.g. ``rounds=`` to extend a finished run).
        simulation: the runtime (default: in this process;
            :class:`fednorm.distributed.DistributedSimulation` spreads the clients over
            torch.distributed ranks, and every rank calls ``run``; only rank 0 writes).
        on_round: called as ``on_round(record, simulation)`` after every round (the CLI prints a
            progress line per evaluation with it when stdout is not a terminal).
        callbacks: :class:`fednorm.tracking.Callback` objects (or ``f(record, sim)`` functions)
            whose hooks see the run start, every round and the end; the config's ``log`` adds
            its loggers (TensorBoard, MLflow, W&B) to them.
        overwrite: start again in an ``out`` that already holds a run, deleting that run's files
            (config, metrics, checkpoints, plots, ``report/``, logger folders) first; without it
            such a directory is refused, as ``fednorm run`` refuses it without ``--overwrite``.
        **overrides: config fields, e.g. ``rounds=5``.

    Raises:
        ConfigError: ``out`` already holds a run (continue it with ``resume=``, pass
            ``overwrite=True``, or another ``out``); settings that do not apply to ``data``
            given beside it (``alpha``, ``partition``, ``augment``, ...).

    A first SIGINT/SIGTERM stops the run after the current round with a checkpoint
    (``summary["status"] == "interrupted"``, the signal in ``RunResult.stop_signal``); a second
    one stops at once. Resuming with fewer ``rounds`` than the checkpoint has run is refused.
    """
    import contextlib

    with contextlib.ExitStack() as held:
        opened = open_run(config, model=model, data=data, write=write, resume=resume, held=held, overrides=overrides,
                          existing="overwrite" if overwrite else "refuse")
        # The handler is in place before the data load (minutes for a large dataset), so a SIGTERM
        # then still ends in an interrupted run with a checkpoint rather than a killed process.
        with StopRequest() as stop:
            session = RunSession(opened, data=data, progress=progress, simulation=simulation, on_round=on_round,
                                 callbacks=callbacks)
            return session.run_alone(stop)
