"""One run in phases: open (config, lock, checkpoint), build, start, one round at a time, finish.

:func:`fednorm.run` drives one :class:`RunSession` through its rounds; the run-set driver
(:mod:`fednorm.api.run_set`) drives several in one thread, training their clients together and
handing each its own round back. Either way a run writes the same directory: config, metrics,
checkpoints every ``checkpoint_every`` rounds, a summary whose status says how it ended, and
one line that says how to continue after a failure.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from ..config import ExperimentConfig, load_config
from ..data.federated import FederatedData
from ..engine.outputs import RunWriter, default_run_dir
from ..engine.simulator import RoundRecord, Simulation
from ..errors import ConfigError, DivergenceError, RoundFailedError, RunWriteError
from ..models.user import UserModel
from .inputs import check_data_fields, check_data_type, check_device, record_data, record_model, resolve_config, split_model
from .resume import RESUMABLE_OVERRIDES, base_lr, check_resumable, data_for_resume, lr_restart, model_for_resume

__all__ = ["RunResult", "RunSession", "OpenedRun", "open_run"]

#: The failures that end one run and leave it resumable (the others are bad input: they propagate).
RUN_FAILURES = (DivergenceError, RoundFailedError, RunWriteError)


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
        """The server's global model, the simulation's working model loaded with the final global
        state (not a copy: the next access, or :meth:`client_model`, reloads the same module).

        Under a method that keeps tensors on each client (FedBN, SiloBN, a personal head), the
        run scores each client with its own model and this one holds the server's copies of those
        local tensors, which are their initial values: FedBN's BatchNorm layers here still have
        running mean 0 and variance 1, so this model scores below the run. Use
        :meth:`client_model` for the model the run scored client ``k`` with.
        """
        if self.simulation is None:
            raise ConfigError(f"the run in {self.out_dir} was reloaded from its directory; load its model from "
                              f"{self.out_dir}/checkpoint.pt")
        return self.simulation.global_model()

    def client_model(self, client_id: int) -> nn.Module:
        """Client ``client_id``'s final model, as the run evaluated it: the global state with that
        client's local tensors (FedBN's BatchNorm statistics and affine, SiloBN's statistics, a
        personal head) loaded in. It is a copy, in eval mode: later calls do not change it. For a
        method without local tensors it equals :attr:`model`.

        Raises:
            ConfigError: ``client_id`` is not a client of the run, or the run was reloaded from
                its directory (``fednorm compare --resume``; load ``checkpoint.pt`` instead).

        Example:
            >>> result = fednorm.run(method="fedbn", rounds=2, write=False, progress=False)
            >>> net = result.client_model(0)  # client 0's BatchNorm statistics, not the server's
        """
        import copy
        import operator

        if self.simulation is None:
            raise ConfigError(f"the run in {self.out_dir} was reloaded from its directory; load its clients' tensors from "
                              f"{self.out_dir}/checkpoint.pt")
        n = self.simulation.data.num_clients
        try:
            k = operator.index(client_id) if not isinstance(client_id, bool) else None
        except TypeError:
            k = None
        if k is None or not 0 <= k < n:
            raise ConfigError(f"client_id must be an int in [0, {n}), got {client_id!r}")
        model = copy.deepcopy(self.simulation.client_model(k))
        self.simulation.global_model()  # the working model back to the global state, as `model` leaves it
        return model.eval()


@dataclass
class OpenedRun:
    """A run's resolved config, the checkpoint it continues from (or None) and the user's model."""

    config: ExperimentConfig
    checkpoint: dict[str, Any] | None
    user: UserModel | None
    write: bool


def open_run(config: Any, *, model: Any, data: FederatedData | None, write: bool, resume: str | Path | None,
             held: contextlib.ExitStack, overrides: dict[str, Any], checkpoint_round: int | None = None,
             existing: str = "keep") -> OpenedRun:
    """Resolve a new run's config, or a resumed run's from its directory and checkpoint, and take
    its directory's lock into ``held``. ``checkpoint_round``: resume from the checkpoint of that
    round (the latest or the previous one), so that a set's runs continue from one round.
    ``existing``: what a new run does with a directory that already holds a run: ``"refuse"``
    (:func:`fednorm.run`'s default, the CLI's rule), ``"overwrite"`` (delete its run files
    first, as ``--overwrite``), or ``"keep"`` (write over it: a caller that owns the directory,
    such as a run set, has decided)."""
    from ..engine.checkpoint import load_latest

    check_data_type(data)
    overrides = dict(overrides)
    config, user = split_model(config, overrides, model)
    if resume is None:
        cfg = resolve_config(config, **overrides)
        if data is not None:
            check_data_fields(cfg, data)
            cfg = record_data(cfg, data)
        if user is not None:
            cfg = record_model(cfg, user)
        if write:
            out = Path(cfg.out) if cfg.out else default_run_dir(cfg)
            cfg = cfg.model_copy(update={"out": str(out)})
            held.enter_context(writer_lock(out, "run"))
            if existing != "keep" and _writes():
                _check_earlier_run(out, overwrite=existing == "overwrite")
        return OpenedRun(cfg, None, user, write)
    run_dir = Path(resume)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"cannot resume {run_dir}: no config.yaml there ({_what_is_there(run_dir)})")
    new_lr = overrides.pop("lr", None)
    bad = [k for k in overrides if k not in RESUMABLE_OVERRIDES and overrides[k] is not None]
    if bad:
        raise ConfigError(f"cannot change {', '.join(sorted(bad))} when resuming; only {', '.join(RESUMABLE_OVERRIDES)} may change"
                          " (and lr, after a divergence)")
    held.enter_context(writer_lock(run_dir, "resume", "wait for it to finish or stop it"))  # no other writer mid-write
    cfg = load_config(run_dir / "config.yaml", {**overrides, "out": str(run_dir)})
    model_for_resume(cfg, user, data, run_dir)
    checkpoint = load_latest(run_dir, at_round=checkpoint_round)
    cfg = data_for_resume(cfg, data, run_dir)
    cfg = lr_restart(cfg, new_lr, run_dir, int(checkpoint.get("server_round", 0)))
    check_resumable(cfg, {**checkpoint["config"], "lr_restarts": cfg.lr_restarts}, run_dir)
    done = int(checkpoint.get("server_round", 0))
    if cfg.rounds < done:
        raise ConfigError(f"cannot resume {run_dir} with rounds={cfg.rounds}: its checkpoint has already run {done} rounds "
                          f"(a shorter run is a new run: pass another --out)")
    return OpenedRun(cfg, checkpoint, user, True)


def _what_is_there(path: Path) -> str:
    """What a directory that is not a run holds, and how to continue it: the seeds of a
    ``--seeds`` command continue with that command (``seeds.json`` names it)."""
    import json

    if not path.is_dir():
        return "it does not exist" if not path.exists() else "it is a file"
    members = sorted(c.name for c in path.iterdir() if (c / "config.yaml").is_file())
    if not members:
        return "is it a fednorm run directory?"
    try:
        command = json.loads((path / "seeds.json").read_text()).get("command")
    except (OSError, ValueError, AttributeError):
        command = None
    how = f"rerun `{command}`" if command else "rerun the command that made them (the same --seeds or compare command, same --out)"
    return (f"it holds the runs {', '.join(members[:4])}{', ...' if len(members) > 4 else ''} of a set; to continue them "
            f"all, {how}; to continue one, fednorm run --resume {path / members[0]}")


def _writes() -> bool:
    """Whether this process writes the run directory: a torch.distributed rank other than 0 does not."""
    return not (torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_rank() != 0)


def writer_lock(path: Path, purpose: str, hint: str | None = None) -> Any:
    """The run directory's lock (:mod:`fednorm.engine.runlock`), taken by the process that writes:
    a torch.distributed rank other than 0 writes nothing and takes none."""
    from ..engine.runlock import run_lock

    if not _writes():
        return contextlib.nullcontext()
    return run_lock(path, purpose, hint)


def _check_earlier_run(out: Path, *, overwrite: bool) -> None:
    """The CLI's rule for a new run's directory (:func:`fednorm.engine.rundir.check_run_dir`), from
    Python: a directory holding a run is refused unless ``overwrite``, which deletes that run's
    files first (its ``report/`` too), so nothing of the earlier run is left beside the new one."""
    from ..engine import rundir

    rundir.check_run_dir(out, overwrite=overwrite, python=True)
    if overwrite and rundir.holds_run(out):
        rundir.clear_run(out)


class RunSession:
    """One run between its build and its summary. The driver calls :meth:`start`, then for each
    round it trained :meth:`after_round`, and :meth:`fail`/:meth:`interrupt` when the run ends
    early; :meth:`finish` writes the summary and returns the result (or raises the failure as
    one line that says how to continue)."""

    def __init__(self, opened: OpenedRun, *, data: FederatedData | None, progress: bool | None,
                 simulation: Callable[..., Simulation], on_round: Callable[[Any, Simulation], None] | None,
                 callbacks: Sequence[Any], again: str | None = None) -> None:
        from ..models.user import using_model
        from ..tracking import as_callbacks, build_loggers
        from ..tracking.partition import PartitionRecord

        cfg, checkpoint, user = opened.config, opened.checkpoint, opened.user
        check_device(cfg.device)
        loggers = build_loggers(cfg.log, cfg.log_args)  # a missing package fails before anything runs
        with using_model(user, cfg):  # the registry's user:NAME builds this module (fednorm/models/user.py)
            sim = simulation(cfg, data=data)
        if user is not None:
            check_outputs(sim)
        self.hooks = as_callbacks(on_round, callbacks, [PartitionRecord(), *loggers] if sim.is_main else None)
        if checkpoint is not None:
            sim.load_state_dict(checkpoint)
        self.sim = sim
        self.write = opened.write
        self.resumed = checkpoint is not None
        self.saved_round: int | None = int(checkpoint.get("server_round", 0)) if checkpoint is not None else None
        self.writer: RunWriter | None = None
        self.status: str | None = None  # None while running; completed, interrupted, diverged, failed
        self.error: BaseException | None = None
        self.stop_signal: int | None = None
        self.progress = progress
        self.again = again  # the command that continues the run's set, when it is one run of a set
        self.config = cfg
        self.bar: Any = None
        self.exploded: dict[str, float] | None = None  # the first round whose train loss blew up (finite)

    # -- phases -----------------------------------------------------------------------------
    def start(self) -> None:
        """Open the run directory and the progress bar; write round 0's checkpoint for a new run,
        so that a run that fails early still has a good one."""
        from tqdm.auto import tqdm

        from ..code_version import code_record
        from ..tracking import call_all

        sim, cfg = self.sim, self.config
        sim.code.append(code_record(sim.server_round))  # saved with every checkpoint: a resume appends its own
        if self.write:
            out = Path(cfg.out) if cfg.out else default_run_dir(cfg)
            cfg = self.config = cfg.model_copy(update={"out": str(out)})
            sim.config = cfg
            if sim.is_main:
                call_all(self.hooks, "on_run_start", sim, out)
                self.writer = RunWriter(out, cfg, history=sim.history if self.resumed else None)
        elif sim.is_main:
            call_all(self.hooks, "on_run_start", sim, None)
        progress = self.progress
        self.bar = tqdm(total=cfg.rounds, initial=sim.server_round, desc=f"{cfg.method}+{cfg.norm}", unit="round",
                        disable=(None if progress is None else not progress) if sim.is_main else True, leave=False)
        if self.write and not self.resumed:
            self.checkpoint_now()

    @property
    def running(self) -> bool:
        """Whether the run has rounds left to train and has not ended."""
        return self.status is None and self.sim.server_round < self.config.rounds

    @property
    def next_round(self) -> int:
        return self.sim.server_round + 1

    def checkpoint_now(self) -> None:
        from ..engine.checkpoint import save_checkpoint

        state = self.sim.state_dict()  # on every rank: a distributed runtime collects the clients' states
        if self.writer is not None:
            try:
                save_checkpoint(self.writer.dir, state)
            except OSError as exc:
                raise RunWriteError(self.writer.dir / "checkpoint.pt", exc) from exc
            self.saved_round = self.sim.server_round

    def after_round(self, record: RoundRecord) -> None:
        """Log the round's record, call the hooks, write the checkpoint when due."""
        from ..tracking import call_all

        cfg = self.config
        self.bar.update(1)
        self._check_loss(record)
        post = {"loss": f"{record.train_loss:.3f}"}
        if record.metrics:
            post["acc"] = f"{100 * record.metrics['test_accuracy']:.1f}"
            if "dp/epsilon" in record.metrics:  # client-level DP: the privacy spent so far
                post["eps"] = f"{record.metrics['dp/epsilon']:.3g}"
            if self.writer is not None:
                self.writer.log(record.metrics)
        self.bar.set_postfix(post)
        call_all(self.hooks, "on_round_end", record, self.sim)
        if self.write and cfg.checkpoint_every and self.sim.server_round % cfg.checkpoint_every == 0:
            self.checkpoint_now()

    def _check_loss(self, record: RoundRecord) -> None:
        """Warn once when the training loss explodes but stays finite (``lr=50``: 1.8e11 and a
        completed run): only NaN/Inf or weights beyond :data:`BLOWN_UP` stop a run, so without
        this its accuracies would read as those of a run that trained."""
        import math
        import warnings

        loss = record.train_loss
        if self.exploded is not None or not math.isfinite(loss) or loss <= EXPLODED_LOSS:
            return
        self.exploded = {"round": record.server_round, "train_loss": loss}
        warnings.warn(f"{self.config.method}+{self.config.norm}: the training loss is {loss:.3g} at round "
                      f"{record.server_round} (above {EXPLODED_LOSS:g}: the training has blown up, though it stays "
                      f"finite); its accuracies are not meaningful: lower the learning rate (--lr "
                      f"{base_lr(self.config) / 10:g}) or clip gradients (--max-grad-norm)", RuntimeWarning, stacklevel=2)

    def fail(self, exc: BaseException) -> None:
        """End the run on a failure of its own (a divergence, a lost round, a full disk)."""
        self.status = "diverged" if isinstance(exc, DivergenceError) else "failed"
        self.error = exc

    def interrupt(self, signum: int | None, exc: BaseException | None = None) -> None:
        """End the run after its last finished round (``exc``: a second signal stopped it mid-round,
        so its last checkpoint is what resumes)."""
        from ..errors import StoppedAtOnce

        self.status, self.stop_signal = "interrupted", signum
        self.error = StoppedAtOnce(signum) if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, StoppedAtOnce) else exc

    def run_alone(self, stop: Any) -> RunResult:
        """The rounds of a run made alone (:func:`fednorm.run`), then :meth:`finish`."""
        try:
            self.start()
            # a signal while the data loaded stops the run before its first round, with a checkpoint
            if self.sim.agree_to_stop(stop.requested):
                self.interrupt(stop.signal)
            else:
                for record in self.sim.rounds():
                    self.after_round(record)
                    if self.sim.agree_to_stop(stop.requested):
                        self.interrupt(stop.signal)
                        break
        except RUN_FAILURES as exc:
            self.fail(exc)
        except KeyboardInterrupt as exc:
            self.interrupt(stop.signal, exc)
        return self.finish()

    def finish(self) -> RunResult:
        """Write the summary (and the final checkpoint of a run that ended well); the result, or
        the failure raised as one line that says what to do next."""
        from ..tracking import call_all

        sim, writer = self.sim, self.writer
        if self.bar is not None:
            self.bar.close()
        status = self.status or "completed"
        error = self.error
        final = sim.method.final_state(sim) if status == "completed" else None
        summary = sim.summary()
        summary["status"] = status
        if self.exploded is not None:  # the run says so too (summary.json), not only the warning
            summary["train_loss_exploded"] = self.exploded
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
            if self.saved_round is not None:
                summary["last_checkpoint_round"] = self.saved_round
        if self.write and error is None:  # never overwrite the last good checkpoint with a failed state
            try:
                self.checkpoint_now()
            except RunWriteError as exc:
                status, error = "failed", exc
                summary.update(status=status, error=str(exc), last_checkpoint_round=self.saved_round)
        if writer is not None:
            try:
                writer.finish(summary, sim.history)
            except RunWriteError as exc:
                if error is None or isinstance(error, KeyboardInterrupt):
                    status, error = "failed", exc
                # else the summary could not say why the run failed; the message below does
        self.status = status
        if sim.is_main:
            call_all(self.hooks, "on_run_end", sim, summary, writer.dir if writer is not None else None)
        if error is not None:
            raise with_advice(error, self.config, writer.dir if writer is not None else None, self.saved_round,
                              again=self.again) from error
        return RunResult(self.config, sim.history, summary, writer.dir if writer else None, sim, self.stop_signal)


def check_outputs(sim: Simulation) -> None:
    """One line, before the first round, for a user's module that does not fit the data: a
    forward pass that fails, or logits of the wrong shape."""
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


#: A finite training loss above this has blown up: cross-entropy is about ln(classes) (2.3 for 10)
#: at the start and falls from there, and each unit of it is a logit off by about as much, so a
#: loss of 1000 means logits wrong by hundreds (``lr=50`` on the digits reaches 1e5 to 1e11).
EXPLODED_LOSS = 1e3

#: A checkpoint whose weights or statistics exceed this (in absolute value) is on its way to a
#: divergence: healthy weights are O(1-100) and BatchNorm variances of normalised inputs far below;
#: restarting from it diverges again (issue 46: at --lr 8 the last checkpoint held weights of 6e9).
BLOWN_UP = 1e8


def blown_up(run_dir: Path) -> float | None:
    """The largest magnitude in ``run_dir``'s latest checkpoint when it exceeds :data:`BLOWN_UP`."""
    from ..engine.checkpoint import CheckpointError, load_latest

    try:
        state = load_latest(run_dir)["global_state"]
    except (CheckpointError, KeyError):
        return None
    peak = max((float(t.abs().max()) for t in state.values() if t.is_floating_point() and t.numel()), default=0.0)
    return peak if not peak < BLOWN_UP else None  # NaN counts as blown up


def with_advice(error: BaseException, cfg: ExperimentConfig, run_dir: Path | None, saved: int | None,
                again: str | None = None) -> BaseException:
    """``error`` as one line that says what to do next: the resume command from the last good
    checkpoint (with a smaller lr after a divergence), a new run when nothing usable was written,
    or, for one run of a set (``again``: the set's command), how to continue the set."""
    if isinstance(error, KeyboardInterrupt):
        return error
    if isinstance(error, DivergenceError):
        smaller = f"{base_lr(cfg) / 10:g}"
        if run_dir is None or saved is None:
            return DivergenceError(f"{error}; lower the learning rate (--lr {smaller}) or clip gradients (--max-grad-norm)")
        peak = blown_up(run_dir)
        if peak is not None:
            return DivergenceError(f"{error}; the last checkpoint (round {saved}) already holds values of {peak:.1e}, so a "
                                   f"restart from it diverges again: start over with a smaller learning rate "
                                   f"(--lr {smaller}) in a new --out")
        if again is not None:
            return DivergenceError(f"{error}; rerun the set's command with --lr {smaller} in place of its lr: the diverged "
                                   f"runs restart from their last good checkpoint (here round {saved}), the finished ones "
                                   f"are kept: {again}")
        return DivergenceError(f"{error}; restart from the last good checkpoint (round {saved}) with a smaller learning "
                               f"rate: fednorm run --resume {run_dir} --lr {smaller}")
    if isinstance(error, RunWriteError) and run_dir is not None and saved is None:
        return RunWriteError(error.path, error.cause).with_hint(
            f"no checkpoint was saved; free space or raise the limit, then start again: fednorm run ... --out {run_dir} --overwrite")
    if run_dir is None or saved is None:
        return error
    resume = f"`{again}`" if again is not None else f"fednorm run --resume {run_dir}"
    if isinstance(error, RunWriteError):
        import errno

        denied = getattr(error.cause, "errno", None) in (errno.EROFS, errno.EACCES, errno.EPERM)
        fix = "make the directory writable again" if denied else "free space or raise the limit"
        return RunWriteError(error.path, error.cause).with_hint(
            f"the last good checkpoint is round {saved}; {fix}, then: {resume.strip('`')}")
    return type(error)(f"{error} (the last good checkpoint is round {saved}: {resume.strip('`')})")
