"""A table's seeds run as one computation (:mod:`fednorm.engine.stacked_runs`).

The runs of one cell differ only in their seed; :func:`stack_groups` puts the pending ones
together (with ``across_cells``, also the runs of other cells whose configs differ only in what
the engine stacks: seed, partition, learning rate, length) and :func:`execute_stacked` trains them stacked, each in its own run directory, with its
own lock, invocation record and scoring on the extra test sets, exactly as
:func:`~fednorm.reproduce.runner.execute` does for one run. Results equal the runs made one by one
to float rounding (tested in ``tests/test_stacked_runs.py`` and ``tests/test_reproduce_stacking.py``).
Groups whose method cannot stack (:func:`~fednorm.engine.stacked_runs.stack_blockers`) run one
by one and say why once.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, Mapping, Sequence

from ..config_roles import EXECUTION_FIELDS
from ..engine.runlock import RunLockedError, describe_holder, run_lock
from .runner import Outcome, RunSpec, RunState, _append_record, _data_for, finish_invocation

__all__ = ["stack_groups", "group_blockers", "execute_stacked"]

# How a run is executed, not what it computes: may differ inside a group
_EXECUTION_FIELDS = EXECUTION_FIELDS


def _group_key(spec: RunSpec) -> str:
    return json.dumps({k: v for k, v in spec.config.items() if k not in _EXECUTION_FIELDS}, sort_keys=True, default=str)


def _engine_key(spec: RunSpec) -> str:
    """What :func:`~fednorm.engine.stacked_runs.stack_blockers` needs equal across stacked runs."""
    from ..config import ExperimentConfig
    from ..config_roles import STACK_SHARED_FIELDS

    config = ExperimentConfig(**spec.config)
    return json.dumps({k: getattr(config, k) for k in STACK_SHARED_FIELDS}, sort_keys=True, default=str)


def stack_groups(work: Sequence[tuple[RunSpec, RunState]], max_runs: int | None = None,
                 across_cells: bool = False) -> list[list[tuple[RunSpec, RunState]]]:
    """``work`` in groups of runs that differ only in seed (in their order of first appearance),
    each at most ``max_runs`` long. ``across_cells``: runs of different cells join a group when
    the engine can stack them (a table's columns that differ in partition or learning rate), so
    that a GPU, which runs a few stacked rows as fast as many, trains a whole row of the table
    as one computation."""
    key = _engine_key if across_cells else _group_key
    groups: dict[str, list[tuple[RunSpec, RunState]]] = {}
    for item in work:
        groups.setdefault(key(item[0]), []).append(item)
    out = []
    for members in groups.values():
        size = max_runs or len(members)
        out.extend(members[i:i + size] for i in range(0, len(members), size))
    return out


def execute_stacked(group: Sequence[tuple[RunSpec, RunState]], *, command: str = "", git: Mapping[str, Any] | None = None,
                    progress: bool | None = False) -> tuple[list[Outcome], dict[str, Any]]:
    """Run, resume or extend ``group``'s runs stacked; each run's outcome and how they ran
    (``joint_rounds``, ``separate_rounds``, ``blockers``). A run directory held by another live
    process is left alone (``running elsewhere``), as :func:`~fednorm.reproduce.runner.execute` does."""
    import torch

    from ..config import ExperimentConfig
    from ..data.federated import repartition
    from ..api.run_set import run_stacked
    from ..errors import DivergenceError, RoundFailedError

    outcomes: dict[int, Outcome] = {}
    with contextlib.ExitStack() as held:
        todo = []
        for i, (spec, state) in enumerate(group):
            try:
                held.enter_context(run_lock(spec.dir, "reproduce"))
                todo.append(i)
            except RunLockedError as exc:
                outcomes[i] = Outcome(str(spec.dir), state.action, "running elsewhere", state.rounds, 0.0, None,
                                      f"held by {describe_holder(exc.holder)}")
        info: dict[str, Any] = {"joint_rounds": 0, "separate_rounds": 0, "blockers": []}
        if todo:
            specs = [group[i][0] for i in todo]
            states = [group[i][1] for i in todo]
            threads = torch.get_num_threads()
            started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            # engine_clock: each run's metrics.jsonl clock counts its own share of the stack (run_set._drive),
            # not the stack's time as before it, which close_interrupted divided
            bases = [{"started": started, "action": st.action, "command": command, "pid": os.getpid(), "stacked_with": len(todo),
                      "engine_clock": "per run", **(git or {})} for st in states]
            for spec, base in zip(specs, bases):
                _append_record(spec, {**base, "status": "running", "rounds": None, "wall_seconds": 0.0})
            start = time.perf_counter()
            try:
                cfg0 = specs[0].config
                if cfg0.get("threads"):
                    torch.set_num_threads(int(cfg0["threads"]))
                first = _data_for(cfg0)  # one copy of the dataset; each seed its own split of it
                configs = [ExperimentConfig(**{k: v for k, v in s.config.items()}) for s in specs]
                datas = [first, *(repartition(first, c) or _data_for(s.config) for c, s in zip(configs[1:], specs[1:]))]
                resume = [s.dir if st.action in ("resume", "extend") else None for s, st in zip(specs, states)]
                results, info = run_stacked(configs, resume=resume, data=datas, progress=progress)
            finally:
                torch.set_num_threads(threads)
            wall = time.perf_counter() - start
            for i, spec, base, result in zip(todo, specs, bases, results):
                if isinstance(result, BaseException) and not isinstance(result, (DivergenceError, RoundFailedError)):
                    raise result  # missing data, bad settings: as a run alone
                # the group's wall time, shared: each run's record says it ran stacked with the others
                outcomes[i] = finish_invocation(spec, group[i][1].action, base, result, wall / len(todo),
                                                extra={"stacked_with": len(todo)})
    return [outcomes[i] for i in range(len(group))], info


def group_blockers(group: Sequence[tuple[RunSpec, RunState]]) -> list[str]:
    """Why ``group`` cannot run stacked (empty when it can)."""
    from ..config import ExperimentConfig
    from ..engine.stacked_runs import stack_blockers

    if len(group) < 2:
        return ["one run"]
    return stack_blockers([ExperimentConfig(**spec.config) for spec, _ in group])
