"""One run: :func:`run` builds the simulation, trains it round by round with checkpoints, and
writes the run directory; a failure ends in one line that says how to continue."""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Sequence

from torch import nn

from ..config import ExperimentConfig
from ..data.federated import FederatedData
from ..engine.simulator import Simulation
from .session import RunResult, RunSession, open_run
from .stop import StopRequest

__all__ = ["RunResult", "run"]


def run(
    config: ExperimentConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    *,
    model: str | nn.Module | Callable[[], nn.Module] | None = None,
    data: FederatedData | None = None,
    write: bool = True,
    progress: bool | None = None,
    resume: str | os.PathLike[str] | None = None,
    simulation: Callable[..., Simulation] = Simulation,
    on_round: Callable[[Any, Simulation], None] | None = None,
    callbacks: Sequence[Any] = (),
    overwrite: bool = False,
    **overrides: Any,
) -> RunResult:
    """Run one federated experiment, or resume one from its run directory.

    Args:
        config: an :class:`ExperimentConfig`, a mapping of fields, or a YAML path (``str`` or any
            ``os.PathLike``; so is every path below, ``out=`` and ``data_dir=`` included).
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

    Returns:
        A :class:`RunResult`: ``config`` (the resolved config, as ``config.yaml`` records it),
        ``history`` (one dict per evaluation: ``round``, ``test_accuracy``, ``test_loss``,
        ``mean_client_accuracy``, ``client_accuracies``, ``train_loss``, ...), ``out_dir`` (None
        with ``write=False``), ``model`` / ``client_model(k)`` and ``summary``, the dict
        ``summary.json`` holds:

        - ``status``: ``"completed"`` or ``"interrupted"`` (a failure raises instead);
        - ``final_test_accuracy``, ``final_test_loss``, ``best_test_accuracy``, ``best_round``,
          ``last10_mean_test_accuracy`` (None unless each of the last 10 rounds was evaluated);
        - ``final_mean_client_accuracy`` and ``final_client_accuracies`` (each client on its own
          test split, with its own model under FedBN), and ``client_weighting``: a sentence on
          how these weigh clients (the mean counts every client once, whatever its test size;
          ``test_accuracy`` counts every test sample once);
        - ``train_loss_exploded``: only when the training loss blew up but stayed finite (``lr=50``),
          ``{"round": r, "train_loss": loss}`` of the first such round (a ``RuntimeWarning`` says
          so too): the accuracies of such a run are not meaningful;
        - ``final_sync``: HBN's accuracies after its statistics-only round T+1;
        - the setting (``method``, ``norm``, ``model``, ``dataset``, ``partition``,
          ``num_clients``, ``clients_per_round``, ``seed``, ``rounds``), the cost
          (``wall_seconds``, ``samples_trained``, ``uplink_bytes``, ``downlink_bytes``,
          ``comm_rounds``, ``executor``, ``threads``), ``personalized``, ``method_summary``,
          ``method_report``, ``dropped_clients``, ``torch_version`` and ``fednorm_version``;
        - ``code``: the code that trained the run, one entry per start and per resume
          (``from_round``, ``fednorm_version``, ``commit`` and ``dirty`` of the git checkout
          fednorm runs from, None when it is not one), so a run resumed under another commit says so.

    Raises:
        ConfigError: an unknown or invalid setting (one line, naming the field); ``out`` already
            holds a run (continue it with ``resume=``, pass ``overwrite=True``, or another
            ``out``); settings that do not apply to ``data`` given beside it (``alpha``,
            ``partition``, ``augment``, ...); a model the method cannot serve; ``resume=`` a
            directory without a run, or with settings that may not change.
        DatasetError: a dataset that cannot be found or read.
        DivergenceError: the training diverged (NaN/Inf); the message says how to resume with
            a lower ``lr`` from the last checkpoint.
        RoundFailedError, RunWriteError: a round that could not finish, a run directory that
            could not be written; the message says how to continue.

    A first SIGINT/SIGTERM stops the run after the current round with a checkpoint
    (``summary["status"] == "interrupted"``, the signal in ``RunResult.stop_signal``); a second
    one stops at once. Resuming with fewer ``rounds`` than the checkpoint has run is refused.

    Example:
        >>> import torch, fednorm
        >>> from torch import nn
        >>> g = torch.Generator().manual_seed(0)
        >>> clients = [(torch.randn(16, 4, generator=g) + k, torch.arange(16) % 2) for k in range(2)]
        >>> data = fednorm.FederatedData.from_tensors(clients, test=(torch.randn(8, 4, generator=g), torch.arange(8) % 2))
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
        >>> result = fednorm.run(model=net, data=data, method="fedbn", rounds=1, out="runs/mine", progress=False)
        >>> result.summary["status"], result.summary["rounds"], len(result.summary["final_client_accuracies"])
        ('completed', 1, 2)
        >>> fednorm.run(model=net, data=data, method="fedbn", rounds=1, out="runs/mine", progress=False)
        Traceback (most recent call last):
        fednorm.errors.ConfigError: runs/mine already holds a completed run of 1 rounds; continue it with ...
        >>> longer = fednorm.run(resume="runs/mine", model=net, data=data, rounds=2, progress=False)
        >>> again = fednorm.run(model=net, data=data, method="fedbn", rounds=1, out="runs/mine", overwrite=True, progress=False)
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
