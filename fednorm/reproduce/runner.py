"""Plan and run a paper's tables: one run directory per (cell, seed), cached and resumable.

Layout under the output folder (default ``reproduce/<paper>/<scale>``)::

    <table>/<row>[__<column>]/seed<k>/   a fednorm run directory (config.yaml, metrics.jsonl,
                                         summary.json, checkpoint.pt) plus reproduce.json
    _data/<subset>/                      the reduced scale's class-balanced data subsets
    report.md, results.json, plots/      written by fednorm.reproduce.report

A run whose ``summary.json`` says ``completed`` (at the planned number of rounds) is never run
again; an interrupted one continues from its checkpoint (``fednorm.api.run(resume=...)``); a
completed run with fewer rounds than now planned (``--rounds``) is extended from its last
checkpoint. ``reproduce.json`` records every invocation on the run: git commit, command, wall
time, status.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..code_version import CODE_PATHS, git_info  # noqa: F401 (re-exported: the reproduce records name their code)
from ..config import load_config
from ..config_roles import CACHE_IGNORED_FIELDS, DATA_OBJECT_FIELDS, fields_with_role
from ..engine.runlock import LOCK_NAME as RUN_LOCK_NAME
from ..engine.runlock import RunLockedError, describe_holder, is_locked, run_lock
from ..errors import ConfigError, DatasetError
from .subset import make_subset, subset_folder_name
from .suite import SCALES, Table

__all__ = [
    "IGNORED_FIELDS",
    "RunSpec",
    "plan",
    "run_state",
    "config_differences",
    "default_data_dir",
    "git_info",
    "refuse_uncommitted",
    "prepare_data",
    "execute",
    "RECORD_NAME",
]

RECORD_NAME = "reproduce.json"
# Fields that may differ between a cached run directory and the plan: where things are, how the
# run is executed and logged, and rounds (a longer plan extends a completed run; see run_state).
IGNORED_FIELDS = CACHE_IGNORED_FIELDS
# Fields that decide the client data object (api.compare's too), for reusing it between runs.
DATA_KEYS = DATA_OBJECT_FIELDS
# How a resumed or extended run is executed, evaluated and logged: the plan's, not the old record's
# (its directory and its rounds are passed on their own).
_PLAN_FIELDS = tuple(k for k in CACHE_IGNORED_FIELDS if k not in ("out", "rounds") and k not in fields_with_role("data_source"))
SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@dataclass
class RunSpec:
    """One run: a (row, column) config of a table at one seed, and where it lives."""

    paper: str
    table: str
    run_id: str
    seed: int
    scale: str
    config: dict[str, Any]
    dir: Path
    cells: list[tuple[str, str]]
    label: str
    paper_rounds: int
    extra_tests: list[str] = field(default_factory=list)
    """Test-set files (data folder) a finished full-scale run is also scored on (``fednorm evaluate``)."""
    unseen: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Clients that never trained a finished run is scored on (the table's ``unseen:``, as
    ``{name: {dataset, dataset_args, num_samples}}``), into ``unseen.json``."""

    def describe(self) -> str:
        return f"{self.table} {self.label} seed {self.seed}"


def default_data_dir(cli_value: str | None = None) -> str | None:
    """The data folder: the option, else ``$FEDNORM_DATA``, else ``../shared/data`` beside the
    repository when it exists, else None (each loader's default, ``~/.cache/fednorm``)."""
    if cli_value:
        return str(Path(cli_value).expanduser().resolve())
    if os.environ.get("FEDNORM_DATA"):
        return os.environ["FEDNORM_DATA"]
    if SHARED_DATA.is_dir():
        return str(SHARED_DATA)
    return None


def _seeds(table: Table, row_id: str, scale: str, seeds: int | None, base_seed: int) -> list[int]:
    n = seeds if seeds is not None else table.default_seeds(table.row(row_id), scale)
    return [base_seed + i for i in range(n)]


def _select(ids: Sequence[str], wanted: Sequence[str] | None) -> list[str]:
    return list(ids) if not wanted else [i for i in ids if i in wanted]


def check_selection(tables: Sequence[Table], rows: Sequence[str] | None, columns: Sequence[str] | None) -> None:
    """A --rows/--columns name that no selected table has is a user mistake: say which exist."""
    for what, wanted, ids in (("row", rows, {r.id for t in tables for r in t.rows}),
                              ("column", columns, {c.id for t in tables for c in t.columns})):
        unknown = sorted(set(wanted or ()) - ids)
        if unknown:
            raise ConfigError(f"unknown {what} {', '.join(map(repr, unknown))}; the selected tables have: {', '.join(sorted(ids))}")


def plan(
    tables: Sequence[Table],
    *,
    scale: str,
    out: Path,
    seeds: int | None = None,
    rows: Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
    data_dir: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> list[RunSpec]:
    """Every run of the selected cells, each config validated; identical configs within a
    table become one run (e.g. the centralized row of every column). Skipped cells (``skip:``
    in the table) are not planned. Runs are ordered so that consecutive ones share client data."""
    if scale not in SCALES:
        raise ConfigError(f"unknown scale '{scale}'; valid: {', '.join(SCALES)}")
    out = Path(out).resolve()
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    specs: list[RunSpec] = []
    for t_index, table in enumerate(tables):
        subset = table.data_subset(scale)
        by_config: dict[str, RunSpec] = {}
        keyed: list[tuple[tuple, RunSpec]] = []
        row_ids = _select([r.id for r in table.rows], rows)
        col_ids = _select([c.id for c in table.columns], columns)

        def cell_fields(row_id: str, col_id: str) -> dict[str, Any]:
            fields = table.fields(row_id, col_id, scale)
            if subset is not None:
                fields["data_dir"] = str(out / "_data" / subset_folder_name(fields.get("dataset", "digits"), subset))
            elif data_dir is not None:
                fields["data_dir"] = data_dir
            fields.update(overrides)
            return fields

        keys: dict[tuple[str, str, int], tuple[dict[str, Any], str]] = {}

        def config_key(row_id: str, col_id: str, seed: int) -> tuple[dict[str, Any], str]:
            """The cell's validated config and its identity (without ``out``), computed once."""
            if (row_id, col_id, seed) not in keys:
                cfg = load_config(None, {**cell_fields(row_id, col_id), "seed": seed}).model_dump(mode="json")
                keys[(row_id, col_id, seed)] = cfg, json.dumps({k: v for k, v in cfg.items() if k != "out"}, sort_keys=True)
            cfg, key = keys[(row_id, col_id, seed)]
            return dict(cfg), key

        def shared_run_id(row_id: str, col_id: str, seed: int, key: str) -> str:
            """The run id of the first column of the whole table (selected or not) whose cell
            has this config, so a run that serves several columns has one directory whatever
            ``--columns`` selects."""
            for col in table.columns:
                if col.id == col_id:
                    break
                if not table.cell(row_id, col.id).skip and config_key(row_id, col.id, seed)[1] == key:
                    return table.run_id(row_id, col.id)
            return table.run_id(row_id, col_id)

        for r_index, row_id in enumerate(row_ids):
            for c_index, col_id in enumerate(col_ids):
                if table.cell(row_id, col_id).skip:
                    continue
                fields = cell_fields(row_id, col_id)
                base_seed = int(fields.get("seed", 0))
                for seed in _seeds(table, row_id, scale, seeds, base_seed):
                    cfg, key = config_key(row_id, col_id, seed)
                    if key in by_config:  # the same run serves another cell
                        by_config[key].cells.append((row_id, col_id))
                        continue
                    run_id = shared_run_id(row_id, col_id, seed, key)
                    run_dir = out / table.id / run_id / f"seed{seed}"
                    cfg["out"] = str(run_dir)
                    label = f"{table.row(row_id).label} | {table.column(col_id).label}" if run_id != row_id else table.row(row_id).label
                    spec = RunSpec(table.paper, table.id, run_id, seed, scale, cfg, run_dir, [(row_id, col_id)], label,
                                   table.paper_rounds(row_id, col_id), list(table.extra_tests) if scale == "full" else [],
                                   {name: dataclasses.asdict(u) for name, u in table.unseen.items()})
                    by_config[key] = spec
                    keyed.append(((t_index, seed - base_seed, c_index, r_index), spec))
        specs += [s for _, s in sorted(keyed, key=lambda item: item[0])]
    return specs


def config_differences(saved: Mapping[str, Any], planned: Mapping[str, Any]) -> list[str]:
    """Fields (other than :data:`IGNORED_FIELDS`) whose values differ, as ``field: saved -> planned``."""
    keys = sorted((set(saved) | set(planned)) - set(IGNORED_FIELDS))
    return [f"{k}: {saved.get(k)!r} -> {planned.get(k)!r}" for k in keys if saved.get(k) != planned.get(k)]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@dataclass
class RunState:
    """What to do with a planned run: ``new``, ``done``, ``resume`` (interrupted), ``extend``
    (completed with fewer rounds), or a final failure (``diverged``, ``failed``) not retried."""

    action: str
    rounds: int | None = None
    detail: str = ""


def run_state(spec: RunSpec) -> RunState:
    """Inspect ``spec.dir``; raises :class:`ConfigError` when it holds a different experiment."""
    d = spec.dir
    holder = lock_holder(d)
    if holder is not None and holder.startswith(f"pid {os.getpid()} "):
        holder = None
    if not (d / "config.yaml").is_file():
        return RunState("new", detail=f"being started by {holder}" if holder else "")
    try:
        saved = load_config(d / "config.yaml").model_dump(mode="json")
    except ConfigError as exc:
        raise ConfigError(f"{d} is not a usable run directory ({exc}); delete it to rerun this cell") from None
    diff = config_differences(saved, spec.config)
    if diff:
        raise ConfigError(
            f"{d} holds a different experiment than the table now plans ({'; '.join(diff)}); "
            "delete that directory to rerun it, or pass another --out"
        )
    target = int(spec.config["rounds"])
    summary = _read_json(d / "summary.json")
    has_checkpoint = (d / "checkpoint.pt").is_file() or (d / "checkpoint.prev.pt").is_file()
    if summary is not None:
        status, rounds = summary.get("status"), int(summary.get("rounds") or 0)
        if rounds > target:
            raise ConfigError(f"{d} holds a longer run ({rounds} rounds) than planned ({target}); pass --rounds {rounds} or another --out")
        if status == "completed":
            if rounds == target:
                return RunState("done", rounds)
            return RunState("extend" if has_checkpoint else "new", rounds, f"completed {rounds} of {target} rounds")
        if status in ("diverged", "failed"):
            return RunState(status, rounds, str(summary.get("error", "")))
        if has_checkpoint:
            return RunState("resume", rounds, f"interrupted after round {rounds}")
    if holder is not None:
        return RunState("resume", None, f"running now ({holder}); it will be skipped")
    if has_checkpoint:
        return RunState("resume", None, "stopped without a summary")
    return RunState("new")


def refuse_uncommitted(git: Mapping[str, Any], allow: bool) -> None:
    """A reproduce run records the commit that made it; from a tree with uncommitted changes to
    the package or configs that commit does not describe the code, so refuse unless ``allow``."""
    if not git.get("dirty") or allow or os.environ.get("FEDNORM_ALLOW_DIRTY"):
        return
    files = list(git.get("changed") or [])
    shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    raise ConfigError(f"uncommitted changes to {shown}: commit them so every result names the code that made it, "
                      "or pass --allow-dirty (the diff's hash is recorded and the report flags the run)")


def data_missing_file(out: Path, table: str) -> Path:
    return Path(out) / table / "data_missing.txt"


def prepare_data(table: Table, specs: Sequence[RunSpec], *, source_dir: str | None, out: Path, download: bool = False) -> None:
    """Make sure the table's data can be read before its runs start: write the reduced scale's
    subsets (once) or open the test split of each dataset. Raises :class:`DatasetError` with the
    loader's message (which file is missing where) and how to point fednorm at the data."""
    from ..data.datasets import load_dataset

    missing = data_missing_file(out, table.id)
    seen: set[tuple[str, str | None]] = set()
    try:
        for spec in specs:
            dataset = spec.config["dataset"]
            subset = table.data_subset(spec.scale)
            key = (dataset, spec.config.get("data_dir"))
            if key in seen:
                continue
            seen.add(key)
            if subset is not None:
                make_subset(dataset, source_dir, Path(out) / "_data", subset)
                _check_partition(table, spec)
            else:
                test = load_dataset(dataset, spec.config.get("data_dir"), train=False, download=download)
                if getattr(test, "domains", None) is not None:  # a multi-source set may hold fewer sources than the table needs
                    _check_partition(table, spec)
            for unseen in table.unseen.values():  # the clients scored after the runs: their files before any training
                dataset = unseen.dataset
                for train in (True, False):
                    load_dataset(dataset, spec.config.get("data_dir"), train=train, **unseen.dataset_args)
    except DatasetError as exc:
        message = (f"{table.paper}/{table.id} needs '{dataset}': {exc} Pass --data-dir DIR (or set $FEDNORM_DATA) to the "
                   f"folder holding the files" + ("" if download else ", or --download where there is a network") + ".")
        missing.parent.mkdir(parents=True, exist_ok=True)
        missing.write_text(message + "\n")
        raise DatasetError(message) from None
    if missing.is_file():
        missing.unlink()


def _check_partition(table: Table, spec: RunSpec) -> None:
    """Build the run's client data once (cached for the runs of this process): data that loads but
    cannot be split as the table asks (Digits-5 with only some of its domains) is missing data for
    that table, so a suite over every table skips it instead of stopping."""
    from ..errors import PartitionError

    try:
        _data_for(spec.config)
    except PartitionError as exc:
        raise DatasetError(f"the data found cannot be split as {table.paper}/{table.id} needs: {exc}.") from None


# -- executing runs ------------------------------------------------------------------------

_DATA_CACHE: dict[str, Any] = {}


def _data_for(config: Mapping[str, Any]):
    """The client data of ``config``, reused between consecutive runs of this process."""
    from ..data.federated import federated_data_from_config

    key = json.dumps({k: config.get(k) for k in DATA_KEYS}, sort_keys=True)
    if key not in _DATA_CACHE:
        _DATA_CACHE.clear()  # one dataset in memory at a time (full CIFAR-10 is ~600 MB as float32)
        _DATA_CACHE[key] = federated_data_from_config(load_config(None, config))
    return _DATA_CACHE[key]


@dataclass
class Outcome:
    """What one invocation did to one run."""

    dir: str
    action: str
    status: str
    rounds: int | None
    wall_seconds: float
    summary: dict[str, Any] | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    stop_signal: int | None = None
    """The signal (or stop file) that interrupted the run, else None."""


LOCK_NAME = RUN_LOCK_NAME  # one writer per run directory: fednorm.engine.runlock


def lock_holder(run_dir: Path) -> str | None:
    """Who is running ``run_dir`` now (``"pid N on HOST, since ..."``), or None. The lock of a
    process that died is released by the kernel, so it is never reported."""
    holder = is_locked(run_dir)
    return describe_holder(holder) if holder is not None else None


def _metrics_wall(run_dir: Path) -> dict[int, float]:
    """The engine's cumulative wall time at each evaluated round (``metrics.jsonl``; a resumed run
    carries its clock on from the checkpoint)."""
    walls: dict[int, float] = {}
    path = run_dir / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
                walls[int(row["round"])] = float(row["wall_seconds"])
            except (ValueError, KeyError, TypeError):
                continue
    return walls


def close_interrupted(run_dir: Path, invocations: list[dict[str, Any]], current_pid: int | None) -> None:
    """Complete the entries of invocations killed outright (SIGKILL at a session's end, the
    out-of-memory killer) with what they kept: status ``killed``, the rounds of the checkpoint the
    run now holds, and, for an entry left ``running`` (its process had no chance to write), the
    engine's time from its first round to that checkpoint (``metrics.jsonl``; a stacked run's share).

    Called by the next invocation, which holds the run's lock, so no other process runs the run.
    An entry's first round is the rounds its predecessor left (0 for a new run); where that cannot be
    read (a record written before this was kept) its rounds and time stay unknown (``None``)."""
    from ..engine.checkpoint import saved_round

    stale = [i for i, inv in enumerate(invocations)
             if (inv.get("status") == "running" and inv.get("pid") != current_pid)
             or (inv.get("status") == "killed" and inv.get("rounds") is None and "closed_by" not in inv)]
    if not stale:
        return
    reached = saved_round(run_dir) or 0
    walls = _metrics_wall(run_dir)
    for i in stale:
        inv = invocations[i]
        was_running = inv["status"] == "running"
        # only the latest entry ended where the run now stands; an older one was followed by others
        first = None if i != len(invocations) - 1 else (
            0 if i == 0 or inv.get("action") == "new" else invocations[i - 1].get("rounds"))
        if was_running:  # a killed worker's parent timed it already
            wall = None
            if first is not None and reached >= int(first):
                start = 0.0 if int(first) == 0 else walls.get(int(first))
                end = walls.get(reached) if reached else 0.0
                # a stacked run's clock counted the whole stack in entries from before the clock was per run
                # (no engine_clock), whose time its record shares out (execute_stacked)
                share = 1 if inv.get("engine_clock") == "per run" else int(inv.get("stacked_with") or 1)
                wall = round((end - start) / share, 3) if start is not None and end is not None else None
            inv["wall_seconds"] = wall
        inv.update({"status": "killed", "rounds": reached if first is not None else None,
                    "closed_by": ("the next invocation: rounds of the checkpoint it found"
                                  + ("; engine time to it" if was_running else "")) if first is not None
                    else "the next invocation: its rounds and time are not known"})


def _append_record(spec: RunSpec, invocation: dict[str, Any]) -> None:
    """Record one invocation on the run; it replaces the same process's ``running`` entry (written
    when the invocation started, so a process killed outright still leaves its commit and command).
    A new invocation first closes the entries of killed ones (:func:`close_interrupted`)."""
    path = spec.dir / RECORD_NAME
    record = _read_json(path) or {}
    record.update({"paper": spec.paper, "table": spec.table, "run_id": spec.run_id, "seed": spec.seed, "scale": spec.scale,
                   "cells": [list(c) for c in spec.cells], "paper_rounds": spec.paper_rounds,
                   "run_command": f"fednorm run --config {spec.dir / 'config.yaml'}"})
    invocations = record.setdefault("invocations", [])
    pid = invocation.get("pid")
    if invocation.get("status") == "running":
        close_interrupted(spec.dir, invocations, pid)
    same = [i for i, old in enumerate(invocations) if old.get("status") == "running" and pid is not None and old.get("pid") == pid]
    if same:
        invocations[same[-1]] = invocation
    else:
        invocations.append(invocation)
    record["wall_seconds"] = sum(float(i.get("wall_seconds") or 0.0) for i in record["invocations"])
    spec.dir.mkdir(parents=True, exist_ok=True)
    tmp = spec.dir / f".{RECORD_NAME}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)


def execute(spec: RunSpec, state: RunState, *, command: str = "", git: Mapping[str, Any] | None = None,
            progress: bool | None = False) -> Outcome:
    """Run, resume or extend one run with :func:`fednorm.api.run`; record the invocation.

    A run that diverges or loses its clients is a result (its summary says so), not an error of
    the suite; missing data (:class:`DatasetError`) and bad settings propagate. A run directory
    that another live process is running (its lock file) is left alone: status ``running elsewhere``.
    """
    import contextlib

    with contextlib.ExitStack() as held:
        try:
            held.enter_context(run_lock(spec.dir, "reproduce"))
        except RunLockedError as exc:
            return Outcome(str(spec.dir), state.action, "running elsewhere", state.rounds, 0.0, None,
                           f"held by {describe_holder(exc.holder)}")
        return _execute(spec, state, command=command, git=git, progress=progress)


def _execute(spec: RunSpec, state: RunState, *, command: str, git: Mapping[str, Any] | None, progress: bool | None) -> Outcome:
    import torch

    from .. import api
    from ..errors import DivergenceError, RoundFailedError

    cfg = spec.config
    threads = torch.get_num_threads()  # the engine sets the run's threads; give the caller its own back
    start = time.perf_counter()
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    base = {"started": started, "action": state.action, "command": command, "pid": os.getpid(), **(git or {})}
    _append_record(spec, {**base, "status": "running", "rounds": None, "wall_seconds": 0.0})
    try:
        if cfg.get("threads"):
            torch.set_num_threads(int(cfg["threads"]))
        data = _data_for(cfg)
        if state.action in ("resume", "extend"):
            keep = {k: cfg[k] for k in _PLAN_FIELDS if cfg.get(k) is not None}
            result = api.run(resume=spec.dir, data=data, progress=progress, rounds=cfg["rounds"], **keep)
        else:
            result = api.run(cfg, data=data, progress=progress, overwrite=True)  # run_state decided: a new run
    except (DivergenceError, RoundFailedError) as exc:
        result = exc
    finally:
        torch.set_num_threads(threads)
    return finish_invocation(spec, state.action, base, result, time.perf_counter() - start)


def finish_invocation(spec: RunSpec, action: str, base: Mapping[str, Any], result: Any, wall: float,
                      extra: Mapping[str, Any] | None = None) -> Outcome:
    """An invocation's end, alone or stacked: ``result`` is the run's RunResult, or the divergence
    or round failure that ended it (a result of the suite, read back from its summary.json);
    a finished run is scored on the table's other test sets and unseen clients (a scoring that fails
    is recorded and tried again by the next invocation: :func:`complete_scores`); the invocation's
    record is completed."""
    error, stop_signal = None, None
    if isinstance(result, BaseException):
        summary, error = _read_json(spec.dir / "summary.json") or {"status": "failed"}, str(result)
    else:
        summary, stop_signal = result.summary, result.stop_signal
    status, rounds = str(summary.get("status")), summary.get("rounds")
    entry = {**base, "status": status, "rounds": rounds, "wall_seconds": round(wall, 3)}
    extra = dict(extra or {})
    if status == "completed":
        _, failed = score_missing(spec)
        if failed:
            entry["scoring_errors"] = extra["scoring_errors"] = failed
    _append_record(spec, entry)
    return Outcome(str(spec.dir), action, status, rounds, wall, summary, error, extra=extra, stop_signal=stop_signal)


def missing_scores(spec: RunSpec) -> list[str]:
    """What a completed run has not been scored on at its last round: its table's other test sets
    found in the data folder (``test:<file>``, into evaluation.json) and its unseen clients
    (``unseen:<name>``, into unseen.json). Empty for a run that has not completed."""
    from ..evaluation.unseen import read_unseen

    summary = _read_json(spec.dir / "summary.json") or {}
    if summary.get("status") != "completed":
        return []
    rounds = summary.get("rounds")
    scored = _read_json(spec.dir / "evaluation.json") or {}
    folder = spec.config.get("data_dir")
    missing = [f"test:{name}" for name in spec.extra_tests
               if folder and (Path(folder) / name).is_file() and (scored.get(name) or {}).get("round") != rounds]
    unseen = read_unseen(spec.dir)
    missing += [f"unseen:{name}" for name in spec.unseen if (unseen.get(name) or {}).get("round") != rounds]
    return missing


def score_missing(spec: RunSpec) -> tuple[list[str], list[str]]:
    """Score a completed run on what :func:`missing_scores` lists; (scored, failures). A failure (a
    dataset that is not there, a run without its checkpoint) is returned, not raised: the training
    it follows is the result, and the next invocation tries again. The caller holds the run's lock."""
    from ..engine.checkpoint import CheckpointError
    from ..evaluation import evaluate_run_on
    from ..evaluation.unseen import adapt_run_to_dataset

    done, failed = [], []
    for item in missing_scores(spec):
        kind, name = item.split(":", 1)
        try:
            if kind == "test":
                evaluate_run_on(spec.dir, Path(spec.config["data_dir"]) / name)
            else:
                u = spec.unseen[name]
                adapt_run_to_dataset(spec.dir, u["dataset"], dataset_args=u.get("dataset_args"), name=name,
                                     num_samples=u.get("num_samples"))
            done.append(item)
        except (ConfigError, DatasetError, CheckpointError, OSError) as exc:
            failed.append(f"{item}: {exc}")
    return done, failed


def complete_scores(spec: RunSpec) -> tuple[list[str], list[str]]:
    """:func:`score_missing` on a run that is done, under its lock (a run another process holds is
    left alone: nothing scored, nothing failed)."""
    try:
        with run_lock(spec.dir, "reproduce"):
            return score_missing(spec)
    except RunLockedError:
        return [], []


def states(specs: Iterable[RunSpec]) -> list[tuple[RunSpec, RunState]]:
    return [(s, run_state(s)) for s in specs]
