"""Python API: run or compare experiments from a notebook, with the same results as the CLI.

Example:
    >>> import fednorm
    >>> result = fednorm.run(dataset="digits", partition="iid", rounds=5, out="runs/demo")
    >>> result.summary["final_test_accuracy"]
    >>> table = fednorm.compare(rounds=10, variants=[{"norm": "bn"}, {"norm": "gn"}])
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from .config import ExperimentConfig, load_config
from .errors import FednormError, RunWriteError
from .data.federated import FederatedData
from .engine.outputs import RunWriter, default_run_dir
from .engine.simulator import Simulation
from .models.user import UserModel

__all__ = ["RunResult", "CompareResult", "run", "compare", "resolve_config", "variant_label", "check_device", "plan_variants"]


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
            from .errors import ConfigError

            raise ConfigError(f"the run in {self.out_dir} was reloaded from its directory; load its model from "
                              f"{self.out_dir}/checkpoint.pt")
        return self.simulation.global_model()


def resolve_config(config: ExperimentConfig | Mapping[str, Any] | str | Path | None = None, **overrides: Any) -> ExperimentConfig:
    """A config from an object, a mapping or a YAML path, with keyword overrides applied."""
    if isinstance(config, ExperimentConfig):
        base = config.model_dump()
        base.update({k: v for k, v in overrides.items() if v is not None})
        return load_config(None, base)
    if isinstance(config, (str, Path)):
        return load_config(config, overrides)
    merged = dict(config or {})
    merged.update({k: v for k, v in overrides.items() if v is not None})
    return load_config(None, merged)


# Settings that may change when a run is resumed; every other field must match the checkpoint.
RESUMABLE_OVERRIDES = ("rounds", "eval_every", "eval_last_rounds", "eval_batch_size", "checkpoint_every", "threads", "out", "device",
                       "log", "log_args", "diagnostics")  # diagnostics measure, they do not change training


#: A file whose appearance asks a run to stop after the current round, as a first SIGINT/SIGTERM
#: does; it holds the signal's number. ``fednorm launch`` sets it for its workers, which run in
#: their own session so that a Ctrl-C reaches the launcher only (torchrun would print a traceback).
STOP_FILE_ENV = "FEDNORM_STOP_FILE"


class _StopRequest:
    """Turns the first SIGINT/SIGTERM (or the stop file of :data:`STOP_FILE_ENV`) into a request
    to stop after the current round."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}
        self._file = os.environ.get(STOP_FILE_ENV) or None

    @property
    def requested(self) -> bool:
        if self.signal is None and self._file is not None:
            try:
                text = Path(self._file).read_text().strip()
            except OSError:
                return False
            self.signal = int(text) if text.isdigit() else 2  # SIGINT's number when the file gives none
        return self.signal is not None

    def __enter__(self) -> "_StopRequest":
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None:  # a second signal: stop now
            raise KeyboardInterrupt
        self.signal = signum

    def __exit__(self, *exc: Any) -> None:
        import signal

        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def check_device(device: str) -> None:
    """Raise :class:`ConfigError` unless tensors can be made on ``device`` with this torch build
    (``cuda`` on a CPU build, a GPU index that does not exist, ``mps`` off Apple silicon)."""
    from .errors import ConfigError

    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(f"unknown device '{device}' ({exc})") from None
    if dev.type == "cuda":
        if torch.version.cuda is None and torch.version.hip is None:
            raise ConfigError(
                f"device '{device}': this torch build ({torch.__version__}) has no CUDA support; install a CUDA build "
                "of torch (https://pytorch.org/get-started/locally/) or use --device cpu"
            )
        count = torch.cuda.device_count()
        if count == 0:
            raise ConfigError(f"device '{device}': torch sees no CUDA GPU on this machine; use --device cpu")
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"device '{device}' does not exist: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
        return
    if dev.type == "cpu":
        return
    try:
        torch.empty(1, device=dev)
    except (RuntimeError, AssertionError, NotImplementedError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"device '{device}' is not usable with this torch build ({torch.__version__}): {first}") from None


def _check_resumable(cfg: ExperimentConfig, saved: Mapping[str, Any], run_dir: Path) -> None:
    from .errors import ConfigError

    now = cfg.model_dump(mode="json")
    # A field added after the checkpoint was written is absent from it; the run had that
    # field's default behaviour (new fields default to the old behaviour), so compare with it.
    defaults = ExperimentConfig().model_dump(mode="json")
    saved = {**{k: defaults[k] for k in now if k not in saved}, **saved}
    diff = [k for k in now if k not in RESUMABLE_OVERRIDES and now[k] != saved.get(k)]
    if diff:
        detail = ", ".join(f"{k}: checkpoint {saved.get(k)!r} vs now {now[k]!r}" for k in diff)
        raise ConfigError(f"cannot resume {run_dir}: settings differ from the checkpoint ({detail})")


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
            the config, and only :data:`RESUMABLE_OVERRIDES` (``rounds``, ``eval_every``,
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

    from .engine.checkpoint import load_latest
    from .errors import ConfigError

    _check_data_type(data)
    config, user = _split_model(config, overrides, model)
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
            _model_for_resume(cfg, user, data, run_dir)
            checkpoint = load_latest(run_dir)
            cfg = _data_for_resume(cfg, data, run_dir)
            cfg = _lr_restart(cfg, new_lr, run_dir, int(checkpoint.get("server_round", 0)))
            _check_resumable(cfg, {**checkpoint["config"], "lr_restarts": cfg.lr_restarts}, run_dir)
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
        with _StopRequest() as stop:
            return _execute(cfg, checkpoint, stop, data=data, user=user, write=write, progress=progress,
                            simulation=simulation, on_round=on_round, callbacks=callbacks)


def _lr_restart(cfg: ExperimentConfig, lr: float | None, run_dir: Path, done: int) -> ExperimentConfig:
    """A diverged run resumes only with a smaller learning rate from its last good checkpoint
    (the same lr would diverge the same way); the change is recorded in ``lr_restarts``."""
    from .engine.outputs import read_summary
    from .errors import ConfigError

    try:
        summary = read_summary(run_dir)
    except (OSError, ValueError):
        summary = {}
    diverged = summary.get("status") == "diverged"
    if lr is None:
        if diverged:
            raise ConfigError(f"{run_dir} diverged; resuming with the same lr diverges again: restart from its last good "
                              f"checkpoint (round {done}) with a smaller one: fednorm run --resume {run_dir} --lr {_base_lr(cfg) / 10:g}")
        return cfg
    if not diverged:
        raise ConfigError(f"cannot change lr when resuming {run_dir}: only a diverged run restarts with another lr "
                          "(a new lr is a new run: pass another --out)")
    restarts = [r for r in cfg.lr_restarts if r["round"] < done] + [{"round": done, "lr": float(lr)}]
    return resolve_config(cfg, lr_restarts=restarts)


def _base_lr(cfg: ExperimentConfig) -> float:
    """The learning rate the schedule starts from now: the last restart's, else ``lr``."""
    return float(cfg.lr_restarts[-1]["lr"]) if cfg.lr_restarts else cfg.lr


def _writer_lock(path: Path, purpose: str, hint: str | None = None) -> Any:
    """The run directory's lock (:mod:`fednorm.engine.runlock`), taken by the process that writes:
    a torch.distributed rank other than 0 writes nothing and takes none."""
    import contextlib

    from .engine.runlock import run_lock

    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return contextlib.nullcontext()
    return run_lock(path, purpose, hint)


def record_data(cfg: ExperimentConfig, data: FederatedData) -> ExperimentConfig:
    """``cfg`` recording what ``data`` is: unchanged when ``data`` was built from ``cfg``'s data
    fields, else ``dataset``/``partition`` ``user:NAME`` with its description and fingerprint
    (:mod:`fednorm.data.provenance`), so the run never claims to have trained on the config's dataset."""
    from .data.provenance import USER_PREFIX, data_name, data_recipe, describe_data

    if data.recipe is not None and data.recipe == data_recipe(cfg):
        return cfg
    tag = f"{USER_PREFIX}:{data_name(data)}"
    recorded = cfg.model_copy(update={"dataset": tag, "partition": tag, "dataset_args": describe_data(data),
                                      "num_clients": data.num_clients, "partition_args": {}, "data_dir": None})
    return load_config(None, recorded.model_dump())  # validated: the name is spelled as config.yaml reads it back


def _check_data_type(data: Any) -> None:
    from .errors import ConfigError

    if data is not None and not isinstance(data, FederatedData):
        raise ConfigError(f"data must be a fednorm.FederatedData, got {type(data).__name__}; build one from your tensors "
                          "or datasets (FederatedData.from_tensors / from_datasets, docs/data.md) or leave data out to "
                          "build it from the config")


def _split_model(config: Any, overrides: dict[str, Any], model: Any) -> tuple[Any, UserModel | None]:
    """``model=`` as a registry name (a config field) or a user's module (kept out of the config:
    :class:`~fednorm.models.user.UserModel`); a module inside a mapping config counts too."""
    if model is None and isinstance(config, Mapping) and "model" in config and not isinstance(config["model"], str):
        config = dict(config)
        model = config.pop("model")
    if model is None:
        return config, None
    if isinstance(model, str):
        overrides["model"] = model
        return config, None
    return config, model if isinstance(model, UserModel) else UserModel(model)


def record_model(cfg: ExperimentConfig, user: UserModel) -> ExperimentConfig:
    """``cfg`` recording a user's module: ``model: user:ClassName`` with its description in
    ``model_args``, and the norm the method needs where ``norm`` was left at ``bn``."""
    from .errors import ConfigError
    from .models.user import is_user_model, method_norm

    if cfg.model_args and not is_user_model(cfg.model):
        raise ConfigError(f"model_args ({', '.join(map(str, cfg.model_args))}) are options of a registry model's builder; "
                          "build your module with its options before passing it as model=")
    return resolve_config(cfg, model=user.tag(), model_args=user.describe(), norm=method_norm(cfg.method, cfg.norm))


def _model_for_resume(cfg: ExperimentConfig, user: UserModel | None, data: FederatedData | None, run_dir: Path) -> None:
    """A run of a user's module resumes only from Python, with a module of the same architecture
    (its weights come from the checkpoint); a run of a registry model takes no module."""
    from .data.provenance import is_user_dataset
    from .errors import ConfigError
    from .models.user import is_user_model, user_model_error

    if not is_user_model(cfg.model):
        if user is not None:
            raise ConfigError(f"cannot resume {run_dir}: it trained model '{cfg.model}' built from its config; leave model out")
        return
    if user is None:
        if is_user_dataset(cfg.dataset) and data is None:
            raise ConfigError(f"cannot resume {run_dir} from its config: model '{cfg.model}' and dataset '{cfg.dataset}' were "
                              f"given from Python; resume from Python with the same model and data: "
                              f"fednorm.run(resume='{run_dir}', model=..., data=...)")
        raise ConfigError(f"cannot resume {run_dir} from its config: {user_model_error(cfg.model, str(run_dir))}")
    user.check_same(cfg.model_args, str(run_dir))


def _check_outputs(sim: Simulation) -> None:
    """One line, before the first round, for a user's module that does not fit the data: a
    forward pass that fails, or logits of the wrong shape."""
    from .errors import ConfigError

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


def _data_for_resume(cfg: ExperimentConfig, data: FederatedData | None, run_dir: Path) -> ExperimentConfig:
    """Check that a resumed run gets its data back: data given from Python must match the
    fingerprint the run recorded; a run of such data cannot rebuild it from its config."""
    from .data.provenance import check_same_data, is_user_dataset, user_data_error
    from .errors import ConfigError

    if is_user_dataset(cfg.dataset):
        if data is None:
            raise ConfigError(str(user_data_error(cfg.dataset, str(run_dir))))
        check_same_data(cfg.dataset_args, data, str(run_dir))
        return cfg
    if data is not None:
        recorded = record_data(cfg, data)
        if recorded.dataset != cfg.dataset:
            raise ConfigError(f"cannot resume {run_dir}: it trained on dataset '{cfg.dataset}' built from its config, and "
                              "the data given was not built from that config; leave data out to rebuild it")
    return cfg


def _execute(cfg: ExperimentConfig, checkpoint: dict[str, Any] | None, stop: _StopRequest, *, data: FederatedData | None,
             user: UserModel | None, write: bool, progress: bool | None, simulation: Callable[..., Simulation],
             on_round: Callable[[Any, Simulation], None] | None, callbacks: Sequence[Any]) -> RunResult:
    """The body of :func:`run` once the config is resolved: build, train, evaluate, write."""
    from .engine.checkpoint import save_checkpoint
    from .errors import DivergenceError, RoundFailedError
    from .models.user import using_model

    check_device(cfg.device)
    from .tracking import as_callbacks, build_loggers, call_all
    from .tracking.partition import PartitionRecord

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
    from .errors import DivergenceError

    if isinstance(error, KeyboardInterrupt):
        return error
    if isinstance(error, DivergenceError):
        smaller = f"{_base_lr(cfg) / 10:g}"
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


def variant_label(variant: Mapping[str, Any]) -> str:
    """A short label such as ``fedavg+bn`` or ``fedavg+gn(lr=0.1)``."""
    method = variant.get("method", "?")
    norm = variant.get("norm", "?")
    rest = {k: v for k, v in variant.items() if k not in ("method", "norm")}
    extra = "(" + ", ".join(f"{k}={v}" for k, v in rest.items()) + ")" if rest else ""
    return f"{method}+{norm}{extra}"


def _personalized(result: RunResult) -> bool:
    """Whether ``result`` was evaluated per client (a reloaded result has no simulation)."""
    if result.simulation is not None:
        return bool(result.simulation.method.personalized)
    if "personalized" in result.summary:
        return bool(result.summary["personalized"])
    from .methods import METHODS

    return bool(getattr(METHODS.get_builder(result.config.method), "personalized", False))


@dataclass
class CompareResult:
    """Results of several variants run on the same data, partition and seed."""

    results: dict[str, RunResult]
    out_dir: Path | None
    stop_signal: int | None = None
    """The signal that stopped the comparison early, else None."""
    interrupted: str | None = None
    """The variant a signal stopped (it has a checkpoint and is not in the table)."""
    not_run: list[str] = field(default_factory=list)
    """Variants that did not start because the comparison was stopped."""

    def rows(self) -> list[dict[str, Any]]:
        from .domain_results import domain_columns, domain_names_of

        rows = []
        domains = domain_names_of([r.summary for r in self.results.values()])
        for label, r in self.results.items():
            s = r.summary
            rows.append(
                {
                    "variant": label,
                    "evaluation": "per client" if _personalized(r) else "global",
                    "final_acc": s["final_test_accuracy"],
                    "best_acc": s["best_test_accuracy"],
                    "last10_acc": s["last10_mean_test_accuracy"],
                    "mean_client_acc": s["final_mean_client_accuracy"],
                    "final_test_loss": s["final_test_loss"],
                    "rounds": s["rounds"],
                    "wall_s": s["wall_seconds"],
                    "uplink_MB": s["uplink_bytes"] / 1e6,
                    **domain_columns(s, domains),  # feature shift: one column per domain
                }
            )
        return rows

    def markdown(self) -> str:
        def pct(v: Any) -> str:
            return "n/a" if v is None else f"{100 * v:.2f}"

        rows = self.rows()
        dom = [k for k in (rows[0] if rows else {}) if k.startswith("acc[")]  # per-domain columns
        lines = [
            "| variant | evaluated | final acc (%) | best acc (%) | last-10 acc (%) | mean client acc (%) | rounds | wall (s) | uplink (MB) |"
            + "".join(f" {k[4:-1]} (%) |" for k in dom),
            "|---|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(dom),
        ]
        for r in rows:
            lines.append(
                f"| {r['variant']} | {r['evaluation']} | {pct(r['final_acc'])} | {pct(r['best_acc'])} | {pct(r['last10_acc'])} | "
                f"{pct(r['mean_client_acc'])} | {r['rounds']} | {r['wall_s']:.1f} | {r['uplink_MB']:.2f} |"
                + "".join(f" {pct(r[k])} |" for k in dom)
            )
        if self.stop_signal is not None:
            import signal

            name = signal.Signals(self.stop_signal).name if self.stop_signal in signal.Signals._value2member_map_ else str(self.stop_signal)
            note = f"\nStopped by {name}."
            if self.interrupted:
                note += f" {self.interrupted} was interrupted (its run directory has a checkpoint) and is not in the table."
            if self.not_run:
                note += f" Not run: {', '.join(self.not_run)}."
            lines.append(note)
        return "\n".join(lines)

    def headline(self) -> str:
        """One sentence on what the table shows: FedAvg+BN against the best other variant
        evaluated as one global model (per-client accuracies are not comparable with it)."""
        rows = [r for r in self.rows() if r["evaluation"] == "global" and r["final_acc"] is not None]
        bn = next((r for r in rows if r["variant"].startswith("fedavg+bn")), None)
        others = [r for r in rows if r is not bn]
        if bn is None or not others:
            best = max(rows, key=lambda r: r["final_acc"], default=None)
            return f"Best global model: {best['variant']} ({100 * best['final_acc']:.1f}%)." if best else ""
        best = max(others, key=lambda r: r["final_acc"])
        beaten = sum(r["final_acc"] > bn["final_acc"] for r in others)
        gap = 100 * (best["final_acc"] - bn["final_acc"])
        if gap <= 0:
            return (f"FedAvg with averaged BatchNorm statistics ({100 * bn['final_acc']:.1f}%) leads every other global model "
                    "here: BatchNorm does not break on this setting.")
        return (f"FedAvg with averaged BatchNorm statistics reaches {100 * bn['final_acc']:.1f}%; {beaten} of {len(others)} "
                f"other global models do better, up to {best['variant']} at {100 * best['final_acc']:.1f}% "
                f"(+{gap:.1f} points).")

    def csv(self) -> str:
        buf = io.StringIO()
        rows = self.rows()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["variant"])
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue()


# The papers' methods beside FedAvg with BN and GN (`fednorm compare` with no variants).
DEFAULT_VARIANTS: tuple[dict[str, Any], ...] = (
    {"method": "fedavg", "norm": "bn"},
    {"method": "fedavg", "norm": "gn"},
    {"method": "fedavg", "norm": "ln"},
    {"method": "fedavg", "norm": "fn"},
    {"method": "fedbn", "norm": "bn"},
    {"method": "fedtan", "norm": "bn"},
    {"method": "fbn", "norm": "fbn"},
    {"method": "hbn", "norm": "hbn"},
)


def _variant_dir(root: Path, label: str) -> str:
    return str(root / label.replace("+", "_").replace("(", "_").replace(")", "").replace(", ", "_").replace("=", ""))


def plan_variants(base: ExperimentConfig, variants: Sequence[Mapping[str, Any]], root: Path | None, *,
                  model: UserModel | None = None) -> list[tuple[str, ExperimentConfig]]:
    """Each variant's label and full config (run directory under ``root``), every one validated
    (fields, registry names, device; with a user's ``model``, that it converts for the variant's
    norm and method): a typo in the last variant is reported before the first trains."""
    from .data.provenance import DATA_FIELDS, is_user_dataset
    from .engine.simulator import check_names
    from .errors import ConfigError
    from .models.user import is_user_model, method_norm

    planned: list[tuple[str, ExperimentConfig]] = []
    for variant in variants:
        variant = dict(variant)
        given = variant.pop("label", None)  # a variant may name itself (e.g. the centralized reference)
        if not isinstance(variant.get("model", ""), str):
            shown = {"method": base.method, "norm": base.norm, **{k: v for k, v in variant.items() if k != "model"}}
            raise ConfigError(f"variant {given or variant_label(shown)}: a variant's model "
                              "is a registry name; pass your own nn.Module as fednorm.compare(model=net), which every variant trains")
        full = {"method": base.method, "norm": base.norm, **variant}
        if is_user_model(base.model):  # the norm a user's module runs with under this method
            full["norm"] = method_norm(full["method"], full["norm"])
        label = given or variant_label(full)
        if is_user_model(base.model) and ({"model", "model_args"} & set(variant)):
            raise ConfigError(f"variant {label}: every variant trains the model given as model=; leave model and "
                              "model_args out of the variants (compare another model in its own comparison)")
        changed = sorted(k for k in variant if k in DATA_FIELDS and k != "seed")
        if is_user_dataset(base.dataset) and changed:
            raise ConfigError(f"variant {label}: every variant trains on the data given as data=; it cannot change "
                              f"{', '.join(changed)}")
        try:
            cfg = resolve_config(base, **full, out=_variant_dir(root, label) if root else None)
            check_names(cfg)
            check_device(cfg.device)
            if model is not None:
                _check_builds(cfg, model)
        except ConfigError as exc:
            raise ConfigError(f"variant {label}: {exc}") from None
        planned.append((label, cfg))
    return planned


def compare(
    config: ExperimentConfig | Mapping[str, Any] | str | Path | None = None,
    *,
    variants: Sequence[Mapping[str, Any]] = DEFAULT_VARIANTS,
    model: str | nn.Module | Callable[[], nn.Module] | None = None,
    data: FederatedData | None = None,
    out: str | Path | None = None,
    progress: bool | None = None,
    on_round: Callable[[Any, Simulation], None] | None = None,
    resume: str | Path | None = None,
    **overrides: Any,
) -> CompareResult:
    """Run several variants (method/norm/any field) on one setting and tabulate them.

    Every variant shares the base config's data, partition and seed; the client data is built
    once and reused. ``model`` and ``data`` are as :func:`run`'s: every variant trains its own copy
    of your module (its BatchNorm converted for the variant's norm; left at ``bn``, the ``hbn`` and
    ``fbn`` variants convert it to their layers) on your data. Every variant's config is validated
    (fields and registry names, and that your module converts for it) before the first one trains.
    Writes ``compare.json`` (the plan), ``results.md``, ``results.csv``, ``accuracy.png`` and one
    run directory per variant under ``out`` (nothing when ``out`` is None).

    A SIGINT/SIGTERM stops the comparison after the current round of the current variant: the
    table holds the variants that finished, and ``CompareResult.stop_signal`` the signal.
    ``resume=OUT`` continues such a comparison from ``OUT/compare.json``: finished variants are
    kept, the interrupted one resumes from its checkpoint, the rest run (only
    :data:`RESUMABLE_OVERRIDES` may be passed, e.g. ``rounds=`` to extend every variant; a
    comparison of your own model or data resumes with them passed again).
    """
    import contextlib

    from .compare_plan import load_plan, save_plan
    from .engine.runlock import run_lock

    _check_data_type(data)
    config, user = _split_model(config, overrides, model)
    if resume is not None:
        from .errors import ConfigError

        bad = sorted(k for k, v in overrides.items() if v is not None and k not in RESUMABLE_OVERRIDES)
        if config is not None or variants is not DEFAULT_VARIANTS or bad:
            raise ConfigError(f"resuming {resume} takes the comparison's settings from its compare.json; only "
                              f"{', '.join(RESUMABLE_OVERRIDES)} may be passed" + (f" (got {', '.join(bad)})" if bad else ""))
        root: Path | None = Path(resume)
    else:
        root = Path(out) if out is not None else None
    with contextlib.ExitStack() as held:
        if root is not None:
            held.enter_context(run_lock(root, "compare"))
        if resume is not None:
            saved, variants = load_plan(root)  # type: ignore[arg-type]
            base = resolve_config(saved, **{k: v for k, v in overrides.items() if k != "out"})
            _inputs_for_compare_resume(base, user, data, root)  # type: ignore[arg-type]
        else:
            base = resolve_config(config, **overrides)
            if data is not None:
                base = record_data(base, data)
            if user is not None:
                base = record_model(base, user)
        planned = plan_variants(base, variants, root, model=user)  # every typo is reported before anything trains
        if root is not None:
            save_plan(root, base, variants)
        return _compare(base, planned, root, progress=progress, on_round=on_round, resume=resume is not None,
                        user=user, user_data=data)


def _check_builds(cfg: ExperimentConfig, user: UserModel) -> None:
    """Build ``cfg``'s copy of the user's module once, as the run will (norm conversion, the
    method's checks, FN's wrapper), so that a variant it cannot serve fails before any trains."""
    from .errors import ConfigError
    from .models import get_model
    from .models.user import using_model

    with using_model(user, cfg), torch.random.fork_rng(devices=[]):  # a factory's draws leave the caller's stream alone
        try:
            get_model(cfg.model, norm=cfg.norm, norm_args=cfg.norm_args, **cfg.model_args)
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"model '{cfg.model}' with norm '{cfg.norm}': {exc}") from None


def _inputs_for_compare_resume(base: ExperimentConfig, user: UserModel | None, data: FederatedData | None, root: Path) -> None:
    """A comparison of a user's model or data resumes only with them given again (checked
    against what it recorded), so that the variants still to run train what the others did."""
    from .data.provenance import check_same_data, is_user_dataset
    from .errors import ConfigError
    from .models.user import is_user_model

    missing = [n for n, recorded, given in (("model", is_user_model(base.model), user), ("data", is_user_dataset(base.dataset), data))
               if recorded and given is None]
    if missing:
        raise ConfigError(f"cannot resume {root} from its compare.json: its {' and '.join(missing)} came from Python; resume "
                          f"from Python with the same {' and '.join(missing)}: fednorm.compare(resume='{root}', "
                          + ", ".join(f"{n}=..." for n in missing) + ")")
    if user is not None:
        if not is_user_model(base.model):
            raise ConfigError(f"cannot resume {root}: it compares model '{base.model}' built from its config; leave model out")
        user.check_same(base.model_args, str(root))
    if data is not None:
        if not is_user_dataset(base.dataset):
            raise ConfigError(f"cannot resume {root}: it compares dataset '{base.dataset}' built from its config; leave data out")
        check_same_data(base.dataset_args, data, str(root))


def _reload(cfg: ExperimentConfig) -> RunResult | None:
    """A variant that already finished ``cfg.rounds`` rounds in ``cfg.out`` with ``cfg``'s settings."""
    from .engine.outputs import read_metrics, read_summary

    d = Path(cfg.out)  # type: ignore[arg-type]
    try:
        summary = read_summary(d)
        saved = load_config(d / "config.yaml")
    except (OSError, ValueError, FednormError):
        return None
    if summary.get("status") != "completed" or summary.get("rounds") != cfg.rounds:
        return None
    _check_resumable(cfg, saved.model_dump(mode="json"), d)
    return RunResult(saved, read_metrics(d), summary, d, None, None)  # type: ignore[arg-type]


def _compare(base: ExperimentConfig, planned: list[tuple[str, ExperimentConfig]], root: Path | None, *,
             progress: bool | None, on_round: Callable[[Any, Simulation], None] | None, resume: bool,
             user: UserModel | None = None, user_data: FederatedData | None = None) -> CompareResult:
    results: dict[str, RunResult] = {}
    interrupted: str | None = None
    stop_signal: int | None = None
    data = None
    data_keys = ("dataset", "dataset_args", "data_dir", "partition", "alpha", "classes_per_client", "gamma", "min_size",
                 "partition_args", "num_clients", "seed", "augment", "input_norm", "dtype", "device")
    with _StopRequest() as stop:  # a signal between two variants stops too
        for label, cfg in planned:
            if stop.signal is not None:
                stop_signal = stop.signal
                break
            kept = _reload(cfg) if resume else None
            if kept is not None:
                results[label] = kept
                continue
            same_data = all(getattr(cfg, k) == getattr(base, k) for k in data_keys)
            given = data if data is not None and same_data else None
            if user_data is not None:  # the user's data: every variant's (plan_variants let none change it)
                given = user_data
            if resume and any((Path(cfg.out) / n).exists() for n in ("checkpoint.pt", "checkpoint.prev.pt")):  # type: ignore[arg-type]
                keep = {k: getattr(cfg, k) for k in RESUMABLE_OVERRIDES if k != "out" and getattr(cfg, k) is not None}
                result = run(resume=cfg.out, model=user, data=given, progress=progress, on_round=on_round, **keep)
            else:
                result = run(cfg, model=user, data=given, write=root is not None, progress=progress, on_round=on_round)
            if same_data:
                data = result.simulation.data
            if result.summary.get("status") == "interrupted":
                interrupted, stop_signal = label, result.stop_signal or stop.signal
                break
            results[label] = result
    comparison = CompareResult(results, root, stop_signal=stop_signal, interrupted=interrupted,
                               not_run=[label for label, _ in planned if label not in results and label != interrupted])
    if root is not None:
        from .plotting import plot_comparison

        root.mkdir(parents=True, exist_ok=True)
        (root / "results.md").write_text(comparison.markdown() + "\n")
        (root / "results.csv").write_text(comparison.csv())
        if results:
            plot_comparison(
                {label: r.history for label, r in results.items()},
                root / "accuracy.png",
                title=f"{base.dataset}, {base.partition}, {base.num_clients} clients",
            )
    return comparison
