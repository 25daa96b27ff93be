"""Running a suite's pending runs: one after another (a cell's seeds stacked, :mod:`.stacking`) or
over ``jobs`` worker processes, stopping cleanly on SIGINT/SIGTERM (every started run keeps its
checkpoint; the same command resumes)."""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .runner import Outcome, RunSpec, RunState, _append_record, execute
from .stacking import execute_stacked, group_blockers, stack_groups

__all__ = ["run_all", "SuiteInterrupted"]


def _work(payload: dict[str, Any]) -> dict[str, Any]:
    """One run in a worker process (``--jobs``); it also stops after its current round when the
    suite writes the stop file (:func:`_run_pool`)."""
    from ..api import STOP_FILE_ENV

    os.environ[STOP_FILE_ENV] = payload["stop_file"]
    spec = RunSpec(**{**payload["spec"], "dir": Path(payload["spec"]["dir"]),
                      "cells": [tuple(c) for c in payload["spec"]["cells"]]})
    outcome = execute(spec, RunState(**payload["state"]), command=payload["command"], git=payload["git"])
    out = asdict(outcome)
    out["summary"] = None if outcome.summary is None else {k: outcome.summary.get(k) for k in (
        "status", "rounds", "final_test_accuracy", "best_test_accuracy", "last10_mean_test_accuracy", "final_mean_client_accuracy")}
    return out


class SuiteInterrupted(KeyboardInterrupt):
    """The suite stopped on SIGINT/SIGTERM; every started run wrote a checkpoint."""

    def __init__(self, message: str, signum: int | None = None) -> None:
        super().__init__(message)
        self.signum = signum


def run_all(
    work: Sequence[tuple[RunSpec, RunState]],
    *,
    jobs: int = 1,
    command: str = "",
    git: Mapping[str, Any] | None = None,
    on_done: Callable[[RunSpec, Outcome], None] | None = None,
    progress: bool | None = None,
    stack: bool = False,
    stack_cells: bool = False,
    on_group: Callable[[list[RunSpec], list[str]], None] | None = None,
) -> list[Outcome]:
    """Execute ``work`` (runs that are not done), in this process or over ``jobs`` processes.

    ``stack``: the runs of a cell that differ only in seed train together as one computation
    (:mod:`fednorm.reproduce.stacking`; equal to running them one by one to float rounding);
    ``on_group(specs, blockers)`` hears of each group before it starts (``blockers`` empty when
    it stacks). ``stack_cells``: with ``stack``, runs of different cells stack too where their
    configs allow (:func:`~fednorm.reproduce.stacking.stack_groups`). An interrupted run (SIGINT/SIGTERM: the engine checkpoints after the current
    round) stops the suite with :class:`SuiteInterrupted`; the same command resumes it.
    """
    outcomes: list[Outcome] = []
    if jobs <= 1:
        groups = stack_groups(work, across_cells=stack_cells) if stack else [[item] for item in work]
        for group in groups:
            blockers = group_blockers(group) if len(group) > 1 else []
            if on_group and len(group) > 1:
                on_group([spec for spec, _ in group], blockers)
            stacked: list[Outcome | None] = [None] * len(group)
            if len(group) > 1 and not blockers:
                stacked = list(execute_stacked(group, command=command, git=git, progress=progress)[0])
            for (spec, state), outcome in zip(group, stacked):
                if outcome is None:  # one by one: each reported (and stoppable) as it finishes
                    outcome = execute(spec, state, command=command, git=git, progress=progress)
                outcomes.append(outcome)
                if on_done:
                    on_done(spec, outcome)
                if outcome.status == "interrupted":
                    raise SuiteInterrupted(f"interrupted during {spec.dir}", outcome.stop_signal)
        return outcomes
    return _run_pool(list(work), jobs, command, git, on_done, outcomes)


def _process_main(payload: dict[str, Any], conn: Any) -> None:
    """A worker process: one run; sends ``("ok", outcome)`` or ``("raise", exception)`` back."""
    try:
        from ..plugins import load_plugins

        load_plugins()  # the suite's plugins, from FEDNORM_PLUGINS (spawned processes import nothing else)
        message: tuple[str, Any] = ("ok", _work(payload))
    except BaseException as exc:  # noqa: BLE001 - the suite decides (bad input propagates, a second signal is a stop)
        try:
            import pickle

            pickle.dumps(exc)
            message = ("raise", exc)
        except Exception:  # noqa: BLE001 - an exception that cannot travel travels as text
            message = ("raise", RuntimeError(f"{type(exc).__name__}: {exc}"))
    try:
        conn.send(message)
    finally:
        conn.close()


def _run_pool(pending: list[tuple[RunSpec, RunState]], jobs: int, command: str, git: Mapping[str, Any] | None,
              on_done: Callable[[RunSpec, Outcome], None] | None, outcomes: list[Outcome]) -> list[Outcome]:
    """``run_all`` over ``jobs`` worker processes, a fresh one per run.

    One process per run, not a pool, so that the suite knows which run each process holds: a
    worker killed from outside (the kernel's out-of-memory killer, ``kill -9``) ends that run as
    ``killed`` with the signal named, and the others go on (``concurrent.futures``' pool did not
    notice such a death until another run ended, hours later, and then failed every run).

    A SIGINT/SIGTERM to this process alone (a scheduler's ``kill PID``, ``timeout``) must not
    orphan the workers mid-run: the first one writes a stop file that every worker reads after
    each round (the signal a worker receives itself, from a terminal or ``kill -- -PGID``, acts the
    same, and the file does not count as a second signal), then this process waits for every
    started run to checkpoint and record its invocation, starts no new run and raises
    :class:`SuiteInterrupted`. A second signal stops the workers at once. An error in a run (bad
    data, a bad setting) stops the others the same way and is raised once they have stopped.
    """
    import multiprocessing
    import shutil
    import signal
    import tempfile
    import threading
    from multiprocessing.connection import wait

    ctx = multiprocessing.get_context("spawn")  # no forked torch thread pools
    stop_dir = Path(tempfile.mkdtemp(prefix="fednorm-reproduce-"))
    stop_file = stop_dir / "stop"
    received: list[int] = []
    interrupted: list[int | None] = []
    errors: list[BaseException] = []

    def request_stop(signum: int) -> None:
        if not stop_file.exists():
            stop_file.write_text(str(signum))

    def on_signal(signum: int, frame: Any) -> None:
        if received:  # a second signal: stop now
            raise KeyboardInterrupt
        received.append(signum)
        request_stop(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    running: dict[Any, tuple[Any, Any, RunSpec, RunState, float, str]] = {}  # receiving end -> (process, ...)

    def start() -> None:
        while pending and len(running) < jobs and not interrupted and not received and not errors:
            spec, state = pending.pop(0)
            payload = {"spec": {**asdict(spec), "dir": str(spec.dir)}, "state": asdict(state), "command": command,
                       "git": dict(git or {}), "stop_file": str(stop_file)}
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_process_main, args=(payload, send), name=f"fednorm-{spec.run_id}")
            proc.start()
            send.close()
            running[recv] = (proc, recv, spec, state, time.perf_counter(), time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    def finish(recv: Any) -> None:
        proc, _, spec, state, began, started = running.pop(recv)
        try:
            kind, value = recv.recv()
        except (EOFError, OSError):  # the process died without a word
            proc.join()
            code = proc.exitcode
            try:
                name = signal.Signals(-code).name if code is not None and code < 0 else f"exit status {code}"
            except ValueError:  # a signal number Python has no name for
                name = f"signal {-code}"
            outcome = Outcome(str(spec.dir), state.action, "killed", None, time.perf_counter() - began, None,
                              f"its worker process was ended by {name} (the out-of-memory killer sends SIGKILL); "
                              "the same command resumes it from its last checkpoint")
            _append_record(spec, {"started": started, "action": state.action, "status": "killed", "rounds": None,
                                  "wall_seconds": round(outcome.wall_seconds, 3), "command": command, "error": outcome.error,
                                  "pid": proc.pid, **(git or {})})
        else:
            proc.join()
            if kind == "raise":
                if isinstance(value, KeyboardInterrupt):
                    interrupted.append(received[0] if received else None)
                else:
                    errors.append(value)
                    request_stop(signal.SIGTERM)
                return
            outcome = Outcome(**value)
        finally:
            recv.close()
        outcomes.append(outcome)
        if on_done:
            on_done(spec, outcome)
        if outcome.status == "interrupted":
            interrupted.append(outcome.stop_signal)

    try:
        start()
        while running:
            try:
                for recv in wait(list(running)):  # a result, or the end of a process that sent none
                    finish(recv)
            except KeyboardInterrupt:  # a second signal: stop the workers now
                interrupted.append(received[0] if received else None)
                pending.clear()
                for proc, *_ in running.values():
                    if proc.is_alive():
                        proc.terminate()
                for recv in list(running):
                    finish(recv)
            start()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for proc, recv, *_ in running.values():  # only after an error in this process
            proc.kill()
            recv.close()
        shutil.rmtree(stop_dir, ignore_errors=True)
    if errors:
        raise errors[0]
    if interrupted or received:
        signum = received[0] if received else next((s for s in interrupted if s is not None), None)
        raise SuiteInterrupted("interrupted", signum)
    return outcomes
