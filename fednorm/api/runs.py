"""One run: :func:`run` builds the simulation, trains it round by round with checkpoints, and
writes the run directory; a failure ends in one line that says how to continue."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from ..config import ExperimentConfig, load_config
from ..data.federated import FederatedData
from ..engine.outputs import RunWriter, default_run_dir
from ..engine.simulator import Simulation
from ..errors import RunWriteError
from ..models.user import UserModel
from .inputs import check_data_type, check_device, record_data, record_model, resolve_config, split_model
from .resume import RESUMABLE_OVERRIDES, base_lr, check_resumable, data_for_resume, lr_restart, model_for_resume
from .stop import StopRequest

__all__ = ["RunResult", "run"]


@dataclass
class RunResult:
    """What a finished run returns: its config, per-evaluation metrics, summary and model."""

    config: ExperimentConfig
    history: list[dict[str, Any]]
    summary: dict[str, Any]
    out_dir: Path | None
    simulation: Simulation | None = field(repr=False)
    """None for a run reloaded from its directory (``fednorm compare --resume`` keeps finished variants)."""
    stop_signal: int | None = None
    """The signal (SIGINT, SIGTERM) that stopped an interrupted run, else None."""

    @property
    def model(self) -> nn.Module:
        """The working model loaded with the final global state."""
        if self.simulation is None:
            from ..errors import ConfigError

            raise ConfigError(f"the run in {self.out_dir} was reloaded from its directory; load its model from "
                              f"{self.out_dir}/checkpoint.pt")
        return self.simulation.global_model()


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
        **overrides: config fields, e.g. ``rounds=5``.

    A first SIGINT/SIGTERM stops the run after the current round with a checkpoint
    (``summary["status"] == "interrupted"``, the signal in ``RunResult.stop_signal``); a second
    one stops at once. Resuming with fewer ``rounds`` than the checkpoint has run is refused.
    """
    import contextlib

    from ..engine.checkpoint import load_latest
    from ..errors import ConfigError

    check_data_type(data)
    config, user = split_model(config, overrides, model)
    checkpoint = None
    with contextlib.ExitStack() as held:
        if resume is not None:
            run_dir = Path(resume)
            if not (run_dir / "config.yaml").is_file():
                raise ConfigError(f"cannot resume {run_dir}: no config.yaml there (is it a fednorm run directory?)")
            new_lr = overrides.pop("lr", None)
            bad = [k for k in overrides if k not in RESUMABLE_OVERRIDES and overrides[k] is not None]
            if bad:
                raise ConfigError(
                    f"cannot change {', '.join(sorted(bad))} when resuming; only {', '.join(RESUMABLE_OVERRIDES)} may change"
                    " (and lr, after a divergence)"
                )
            held.enter_context(_writer_lock(run_dir, "resume", "wait for it to finish or stop it"))  # no other writer mid-write
            cfg = load_config(run_dir / "config.yaml", {**overrides, "out": str(run_dir)})
            model_for_resume(cfg, user, data, run_dir)
            checkpoint = load_latest(run_dir)
            cfg = data_for_resume(cfg, data, run_dir)
            cfg = lr_restart(cfg, new_lr, run_dir, int(checkpoint.get("server_round", 0)))
            check_resumable(cfg, {**checkpoint["config"], "lr_restarts": cfg.lr_restarts}, run_dir)
            done = int(checkpoint.get("server_round", 0))
            if cfg.rounds < done:
                raise ConfigError(
                    f"cannot resume {run_dir} with rounds={cfg.rounds}: its checkpoint has already run {done} rounds "
                    f"(a shorter run is a new run: pass another --out)"
                )
            write = True
        else:
            cfg = resolve_config(config, **overrides)
            if data is not None:
                cfg = record_data(cfg, data)
            if user is not None:
                cfg = record_model(cfg, user)
            if write:
                out = Path(cfg.out) if cfg.out else default_run_dir(cfg)
                cfg = cfg.model_copy(update={"out": str(out)})
                held.enter_context(_writer_lock(out, "run"))
        # The handler is in place before the data load (minutes for a large dataset), so a SIGTERM
        # then still ends in an interrupted run with a checkpoint rather than a killed process.
        with StopRequest() as stop:
            return _execute(cfg, checkpoint, stop, data=data, user=user, write=write, progress=progress,
                            simulation=simulation, on_round=on_round, callbacks=callbacks)


def _writer_lock(path: Path, purpose: str, hint: str | None = None) -> Any:
    """The run directory's lock (:mod:`fednorm.engine.runlock`), taken by the process that writes:
    a torch.distributed rank other than 0 writes nothing and takes none."""
    import contextlib

    from ..engine.runlock import run_lock

    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return contextlib.nullcontext()
    return run_lock(path, purpose, hint)


def _check_outputs(sim: Simulation) -> None:
    """One line, before the first round, for a user's module that does not fit the data: a
    forward pass that fails, or logits of the wrong shape."""
    from ..errors import ConfigError

    x = sim.data.train_x[:2]
    k = sim.data.num_classes
    name = sim.config.model
    modes = {m: m.training for m in sim.model.modules()}
    sim.model.eval()  # in eval mode no running statistics move: the model is as it was
    try:
        with torch.no_grad():
            out = sim.model(x)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's forward is reported as one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"model '{name}' fails on a batch of the data (shape {tuple(x.shape)}): {first}") from None
    finally:
        for m, training in modes.items():
            m.training = training
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    if shape != (len(x), k):
        raise ConfigError(f"model '{name}' returns {shape} for a batch of {len(x)} samples; the data has {k} classes, so it "
                          f"must return logits of shape ({len(x)}, {k})")


def _execute(cfg: ExperimentConfig, checkpoint: dict[str, Any] | None, stop: StopRequest, *, data: FederatedData | None,
             user: UserModel | None, write: bool, progress: bool | None, simulation: Callable[..., Simulation],
             on_round: Callable[[Any, Simulation], None] | None, callbacks: Sequence[Any]) -> RunResult:
    """The body of :func:`run` once the config is resolved: build, train, evaluate, write."""
    from ..engine.checkpoint import save_checkpoint
    from ..errors import DivergenceError, RoundFailedError
    from ..models.user import using_model

    check_device(cfg.device)
    from ..tracking import as_callbacks, build_loggers, call_all
    from ..tracking.partition import PartitionRecord

    loggers = build_loggers(cfg.log, cfg.log_args)  # a missing package fails before anything runs
    with using_model(user, cfg):  # the registry's user:NAME builds this module (fednorm/models/user.py)
        sim = simulation(cfg, data=data)
    if user is not None:
        _check_outputs(sim)
    hooks = as_callbacks(on_round, callbacks, [PartitionRecord(), *loggers] if sim.is_main else None)
    if checkpoint is not None:
        sim.load_state_dict(checkpoint)
    writer = None

    saved_round = [int(checkpoint.get("server_round", 0)) if checkpoint is not None else None]  # the last good checkpoint

    def checkpoint_now() -> None:
        state = sim.state_dict()  # on every rank: a distributed runtime collects the clients' states
        if writer is not None:
            try:
                save_checkpoint(writer.dir, state)
            except OSError as exc:
                raise RunWriteError(writer.dir / "checkpoint.pt", exc) from exc
            saved_round[0] = sim.server_round

    if write:
        out = Path(cfg.out) if cfg.out else default_run_dir(cfg)
        cfg = cfg.model_copy(update={"out": str(out)})
        sim.config = cfg
        if sim.is_main:
            call_all(hooks, "on_run_start", sim, out)
            writer = RunWriter(out, cfg, history=sim.history if checkpoint is not None else None)
    elif sim.is_main:
        call_all(hooks, "on_run_start", sim, None)
    from tqdm.auto import tqdm

    status = "completed"
    error: BaseException | None = None
    stop_signal: int | None = None
    bar = tqdm(total=cfg.rounds, initial=sim.server_round, desc=f"{cfg.method}+{cfg.norm}", unit="round",
               disable=(None if progress is None else not progress) if sim.is_main else True, leave=False)
    try:
        if write and checkpoint is None:  # round 0, so a run that fails early still has a good checkpoint
            checkpoint_now()
        # a signal while the data loaded stops the run before its first round, with a checkpoint
        if sim.agree_to_stop(stop.requested):
            status, stop_signal = "interrupted", stop.signal
        else:
            for record in sim.rounds():
                bar.update(1)
                post = {"loss": f"{record.train_loss:.3f}"}
                if record.metrics:
                    post["acc"] = f"{100 * record.metrics['test_accuracy']:.1f}"
                    if "dp/epsilon" in record.metrics:  # client-level DP: the privacy spent so far
                        post["eps"] = f"{record.metrics['dp/epsilon']:.3g}"
                    if writer is not None:
                        writer.log(record.metrics)
                bar.set_postfix(post)
                call_all(hooks, "on_round_end", record, sim)
                if write and cfg.checkpoint_every and sim.server_round % cfg.checkpoint_every == 0:
                    checkpoint_now()
                if sim.agree_to_stop(stop.requested):
                    status, stop_signal = "interrupted", stop.signal
                    break
    except (DivergenceError, RoundFailedError, RunWriteError) as exc:
        status = "diverged" if isinstance(exc, DivergenceError) else "failed"
        error = exc
    except KeyboardInterrupt as exc:
        status, error = "interrupted", exc
    finally:
        bar.close()
    final = sim.method.final_state(sim) if status == "completed" else None
    summary = sim.summary()
    summary["status"] = status
    if final is not None:  # e.g. HBN's statistics-only round T+1
        res = sim.evaluate(final)
        summary["final_sync"] = {k: res.get(k) for k in ("test_accuracy", "test_loss", "mean_client_accuracy")}
        if writer is not None:
            try:
                torch.save(final, writer.dir / "final_model.pt")
            except OSError as exc:
                status, error = "failed", RunWriteError(writer.dir / "final_model.pt", exc)
                summary["status"] = status
    if error is not None:
        summary["error"] = str(error) or type(error).__name__
        if saved_round[0] is not None:
            summary["last_checkpoint_round"] = saved_round[0]
    if write and error is None:  # never overwrite the last good checkpoint with a failed state
        try:
            checkpoint_now()
        except RunWriteError as exc:
            status, error = "failed", exc
            summary.update(status=status, error=str(exc), last_checkpoint_round=saved_round[0])
    if writer is not None:
        try:
            writer.finish(summary, sim.history)
        except RunWriteError as exc:
            if error is None or isinstance(error, KeyboardInterrupt):
                status, error = "failed", exc
            # else the summary could not say why the run failed; the message below does
    if sim.is_main:
        call_all(hooks, "on_run_end", sim, summary, writer.dir if writer is not None else None)
    if error is not None:
        raise _with_advice(error, cfg, writer.dir if writer is not None else None, saved_round[0]) from error
    return RunResult(cfg, sim.history, summary, writer.dir if writer else None, sim, stop_signal)


def _with_advice(error: BaseException, cfg: ExperimentConfig, run_dir: Path | None, saved: int | None) -> BaseException:
    """``error`` as one line that says what to do next: the resume command from the last good
    checkpoint (with a smaller lr after a divergence), or a new run when nothing was written."""
    from ..errors import DivergenceError

    if isinstance(error, KeyboardInterrupt):
        return error
    if isinstance(error, DivergenceError):
        smaller = f"{base_lr(cfg) / 10:g}"
        if run_dir is None or saved is None:
            return DivergenceError(f"{error}; lower the learning rate (--lr {smaller}) or clip gradients (--max-grad-norm)")
        return DivergenceError(f"{error}; restart from the last good checkpoint (round {saved}) with a smaller learning "
                               f"rate: fednorm run --resume {run_dir} --lr {smaller}")
    if isinstance(error, RunWriteError) and run_dir is not None and saved is None:
        return RunWriteError(error.path, error.cause).with_hint(
            f"no checkpoint was saved; free space or raise the limit, then start again: fednorm run ... --out {run_dir} --overwrite")
    if run_dir is None or saved is None:
        return error
    if isinstance(error, RunWriteError):
        return RunWriteError(error.path, error.cause).with_hint(
            f"the last good checkpoint is round {saved}; free space or raise the limit, then: fednorm run --resume {run_dir}")
    return type(error)(f"{error} (the last good checkpoint is round {saved}: fednorm run --resume {run_dir})")
