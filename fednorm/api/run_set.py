"""Run sets: several runs (seeds, table cells, learning rates) driven in one thread, round by round.

:func:`run_stacked` opens every run as :func:`fednorm.run` would (its directory, lock, checkpoint,
writer) and then steps them all through the simulator's round phases: each run samples its
clients (``begin_round``), the clients of every run standing at that round train together in one
stacked model (:class:`~fednorm.engine.stacked_runs.StackedRunsExecutor`, rows ordered by run and
client), and each run aggregates, evaluates and writes its round (``server_update``,
``finish_round``). There are no threads: the order of everything is fixed by the runs' order, so
the same set gives the same bits twice, and the same bits after a kill and a resume.

- A first SIGINT/SIGTERM stops every run after the round it is in, each with a checkpoint; a
  second stops at once (the last checkpoints stand). Either way the summaries say
  ``interrupted`` and ``info["stop_signal"]`` says which signal.
- A joint round that diverges is undone (every requested client's local state is put back) and
  rerun run by run on each run's own executor, so only the run that diverged stops; the others
  go on equal to their runs alone. A run that fails ends alone; the others go on.
- Runs that cannot stack (:func:`~fednorm.engine.stacked_runs.stack_blockers`) are driven the
  same way, each round trained on the run's own executor: interruptible together, one at a time
  on the process's generator and threads.
- Resumed runs continue from one round where they can: a kill between two runs' checkpoint
  writes leaves one run a checkpoint ahead, and that run resumes from its previous checkpoint
  (:func:`~fednorm.engine.checkpoint.load_latest` ``at_round``), so the set trains as it did.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from ..config import ExperimentConfig
from ..data.federated import FederatedData
from ..engine.simulator import RoundPlan, Simulation
from ..engine.stacked_runs import StackedRunsExecutor, stack_blockers
from ..errors import ConfigError, DivergenceError
from ..methods.base import ClientUpdates
from .session import RUN_FAILURES, RunSession, open_run
from .stop import StopRequest

__all__ = ["run_stacked"]

#: ``fednorm.run`` arguments that are not config fields.
_RUN_ARGS = ("model", "write", "callbacks", "simulation")


def _common_round(resume: Sequence[str | Path | None]) -> int | None:
    """The round every resumed run can continue from: the lowest of their latest checkpoints."""
    from ..engine.checkpoint import saved_round

    rounds = [saved_round(d) for d in resume if d is not None]
    rounds = [r for r in rounds if r is not None]
    return min(rounds) if rounds else None


def _check_outs(configs: Sequence[ExperimentConfig], resume: Sequence[str | Path | None]) -> None:
    """Two runs of a set writing one directory would interleave their files (the directory's lock
    is per process): refused before anything is written."""
    seen: dict[str, int] = {}
    for i, (cfg, res) in enumerate(zip(configs, resume)):
        out = res if res is not None else cfg.out
        if out is None:
            continue
        key = str(Path(out).resolve())
        if key in seen:
            raise ConfigError(f"runs {seen[key]} and {i} of the set both write {out}: give each run its own out")
        seen[key] = i


def run_stacked(configs: Sequence[ExperimentConfig], *, resume: Sequence[str | Path | None] | None = None,
                data: Sequence[FederatedData | None] | None = None, progress: bool | None = False,
                on_round: Callable[[Any, Simulation], None] | None = None, again: str | None = None,
                **run_kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    """Run ``configs`` as one set (each with its own run directory, as :func:`fednorm.run` writes it).

    ``resume``: per run, a run directory to continue instead (it continues with the plan's
    ``rounds``, ``eval_every`` and ``eval_last_rounds``). ``data``: per run, its client data
    already built (as :func:`fednorm.run`'s ``data``). ``run_kwargs``: :func:`fednorm.run`'s
    ``model``, ``write``, ``callbacks`` and config overrides, for every run. ``again``: the
    command that continues the set, named in a failed run's advice.

    Returns each run's :class:`~fednorm.api.RunResult` (or the exception that ended it; a run not
    started because the set was stopped gets ``KeyboardInterrupt``) and how the rounds ran:
    ``joint_rounds``, ``separate_rounds``, ``blockers`` (why the runs trained each on its own)
    and ``stop_signal`` (the signal that stopped the set, else None).
    """
    configs = list(configs)
    n = len(configs)
    resume = list(resume) if resume is not None else [None] * n
    given = list(data) if data is not None else [None] * n
    kwargs = {k: run_kwargs.pop(k) for k in _RUN_ARGS if k in run_kwargs}
    write = kwargs.get("write", True)
    if write:
        _check_outs(configs, resume)
    blockers = stack_blockers(configs) if n > 1 else ["one run"]
    at_round = _common_round(resume)
    sessions: list[RunSession | None] = [None] * n
    results: list[Any] = [None] * n
    info: dict[str, Any] = {"joint_rounds": 0, "separate_rounds": 0, "blockers": list(blockers), "stop_signal": None}
    with contextlib.ExitStack() as held, StopRequest() as stop:
        try:
            for i in range(n):
                if stop.requested:  # stopped while the runs were being built: the rest do not start
                    results[i] = KeyboardInterrupt()
                    continue
                try:
                    sessions[i] = _open(configs[i], resume[i], given[i], at_round, held, progress, on_round, kwargs, run_kwargs,
                                        again)
                except Exception as exc:  # noqa: BLE001 - reported per run; the others go on
                    results[i] = exc
            built = [i for i in range(n) if sessions[i] is not None]
            executor = None
            if not blockers and len(built) > 1:
                try:
                    executor = StackedRunsExecutor([s.sim if s is not None else None for s in sessions])
                except ValueError as exc:  # NotStackableError too: a model the stacked executor cannot hold
                    info["blockers"] = [f"the runs do not stack: {exc}"]
            elif not blockers:
                info["blockers"] = ["one run"] if len(built) == 1 else []
            for i in built:
                try:
                    sessions[i].start()
                except RUN_FAILURES as exc:
                    sessions[i].fail(exc)
            _drive([sessions[i] for i in built], built, executor, stop, info)
        except KeyboardInterrupt as exc:  # a second signal: every run stops now, its last checkpoint stands
            for s in sessions:
                if s is not None and s.status is None:
                    s.interrupt(stop.signal, exc)
        info["stop_signal"] = stop.signal
        for i, s in enumerate(sessions):
            if s is None:
                continue
            try:
                results[i] = s.finish()
            except BaseException as exc:  # noqa: BLE001 - reported per run
                results[i] = exc
    return results, info


def _open(config: ExperimentConfig, resume: str | Path | None, data: FederatedData | None, at_round: int | None,
          held: contextlib.ExitStack, progress: bool | None, on_round: Any, kwargs: dict[str, Any],
          overrides: dict[str, Any], again: str | None = None) -> RunSession:
    """One run of the set opened and built, as :func:`fednorm.run` does it. A diverged run
    restarts from its last good checkpoint when the set's learning rate is now another one (the
    set's command rerun with a smaller ``--lr``: one command restarts the set)."""
    from ..engine.checkpoint import CheckpointError

    write = kwargs.get("write", True)
    model = kwargs.get("model")
    if resume is not None:
        plan = {"rounds": config.rounds, "eval_every": config.eval_every, "eval_last_rounds": config.eval_last_rounds}
        restart = _lr_restart(Path(resume), config, again)
        if restart is not None:
            plan["lr"] = restart
        try:
            opened = open_run(None, model=model, data=data, write=True, resume=resume, held=held,
                              overrides={**overrides, **plan}, checkpoint_round=at_round)
        except CheckpointError:  # no checkpoint of the set's round: this run continues from its latest
            opened = open_run(None, model=model, data=data, write=True, resume=resume, held=held, overrides={**overrides, **plan})
    else:
        opened = open_run(config, model=model, data=data, write=write, resume=None, held=held, overrides=dict(overrides))
    return RunSession(opened, data=data, progress=progress, simulation=kwargs.get("simulation", Simulation),
                      on_round=on_round, callbacks=kwargs.get("callbacks", ()), again=again)


def _lr_restart(run_dir: Path, config: ExperimentConfig, again: str | None) -> float | None:
    """The learning rate a diverged run of the set restarts with: the set's, when it differs
    from the one the run diverged at; a diverged run asked to go on at that same rate is refused
    with the set's way forward."""
    from ..config import load_config
    from ..engine.outputs import read_summary
    from .resume import base_lr

    try:
        diverged = read_summary(run_dir).get("status") == "diverged"
    except (OSError, ValueError, AttributeError):
        return None
    if not diverged:
        return None
    recorded = base_lr(load_config(run_dir / "config.yaml"))
    if config.lr != recorded:
        return config.lr
    smaller = f"{recorded / 10:g}"
    how = f"rerun the set's command with --lr {smaller} in place of its lr ({again})" if again else \
        f"run the set again with lr={smaller}"
    raise ConfigError(f"{run_dir} diverged at lr {recorded:g}; the same lr diverges again: {how} (the diverged runs "
                      "restart from their last good checkpoints at that rate, the finished ones are kept)")


def _drive(sessions: list[RunSession], runs: list[int], executor: StackedRunsExecutor | None, stop: StopRequest,
           info: dict[str, Any]) -> None:
    """Step the runs round by round until each has ended; ``runs``: their indices in the set (the
    stacked executor's run numbers)."""
    by_run = dict(zip(runs, sessions))
    if stop.requested:  # a signal while the runs were built: they stop before their first round
        for s in sessions:
            if s.status is None:
                s.interrupt(stop.signal)
        return
    while True:
        active = [r for r in runs if by_run[r].running]
        if not active:
            return
        server_round = min(by_run[r].next_round for r in active)
        plans: dict[int, RoundPlan] = {}
        planning: dict[int, float] = {}
        for r in active:
            if by_run[r].next_round != server_round:
                continue  # ahead of the others (resumed later): it waits for them
            try:
                t0 = time.perf_counter()
                plans[r] = by_run[r].sim.begin_round()
                planning[r] = time.perf_counter() - t0
            except RUN_FAILURES as exc:
                by_run[r].fail(exc)
        trained, training = _train(by_run, plans, executor, info)
        for r, plan in plans.items():
            s = by_run[r]
            outcome = trained.get(r)
            if isinstance(outcome, BaseException):
                s.fail(outcome)
                continue
            # The run's round clock: its own planning, its part of the training, then its own server
            # work, not the aggregation and evaluation of the runs before it in this loop.
            plan = dataclasses.replace(plan, start=time.perf_counter() - planning[r] - training.get(r, 0.0))
            try:
                record = s.sim.server_update(plan, outcome)
                s.sim.finish_round(record)
                s.after_round(record)
            except RUN_FAILURES as exc:
                s.fail(exc)
        if stop.requested:
            for s in sessions:
                if s.status is None:
                    s.interrupt(stop.signal)
            return


def _train(by_run: dict[int, RunSession], plans: dict[int, RoundPlan], executor: StackedRunsExecutor | None,
           info: dict[str, Any]) -> tuple[dict[int, ClientUpdates | BaseException], dict[int, float]]:
    """The round's local training of every planned run: together, or (cannot stack, or the joint
    round diverged) each run on its own executor. Also each run's seconds of it: an equal share
    of a joint round (and of a joint attempt undone), a run trained alone its own time."""
    requests = {r: plan.training for r, plan in plans.items() if plan.training}
    if not requests:
        return {}, {}
    server_round = next(iter(plans.values())).server_round
    started = time.perf_counter()
    if executor is not None:
        saved = executor.snapshot(requests)
        try:
            out: dict[int, ClientUpdates | BaseException] = dict(
                executor.train(server_round, requests, {r: plans[r].lr for r in requests}))
            for r, clients in requests.items():
                by_run[r].sim.note_training(executor.samples_seen(r, clients), executor.run_traffic.get(r))
            info["joint_rounds"] += 1
            share = (time.perf_counter() - started) / len(requests)
            return out, {r: share for r in requests}
        except DivergenceError:  # one run's clients diverged: undo the round, train each run alone
            executor.restore(saved)
            info["separate_rounds"] += 1
    undone = (time.perf_counter() - started) / len(requests)
    out, seconds = {}, {}
    for r, clients in requests.items():
        t0 = time.perf_counter()
        try:
            out[r] = by_run[r].sim.train_clients(server_round, clients, plans[r].lr)
        except RUN_FAILURES as exc:
            out[r] = exc
        seconds[r] = undone + time.perf_counter() - t0
    return out, seconds
