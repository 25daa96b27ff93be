"""The papers' tables as data: one YAML file per table under ``configs/reproduce/<paper>/``.

A table file holds everything needed to rerun a table of a paper and to compare with it, and no
number lives in Python::

    paper: hbn                    # the folder name
    table: table1                 # the file name
    title: ...                    # what the table is
    source: HBN paper, Table 1    # where the setting and the numbers come from
    claim: ...                    # the paper's headline claim for this table (free text)
    metric: test_accuracy         # what a cell reads from a run (a column may override it)
    compare: [best, last10]       # statistics compared with the paper's number; the first ranks
                                  #   (final, best, last10, best_val: the test accuracy at the round of the
                                  #   best validation accuracy, for runs with validation_fraction > 0)
    seeds: 1                      # default number of seeds (a row may override it)
    base: {...}                   # ExperimentConfig fields: the paper's setting at full scale
    reduced:                      # the stated reduced scale
      description: ...
      set: {...}                  # fields changed at reduced scale
      data_subset: {train_per_class: 40, test_per_class: 20, seed: 0}   # optional
      rows: {<row>: {...}}        # per-row fields at reduced scale (e.g. FixBN's switch round)
      columns: {<column>: {...}}
      seeds: 1                    # optional default seeds at reduced scale
    rows:    [{id: bn, label: BN, set: {...}, seeds: 3}, ...]
    columns: [{id: phi0.6, label: "φ = 0.6", set: {alpha: 0.6}}, {id: mnist, metric: "client:mnist"}, ...]
    cells:                        # row -> column -> the paper's number, or a mapping:
      bn: {phi0.6: 75.82}         #   {paper: 80, approx: true, note: ..., set: {...}, skip: "why"}
    notes: [...]                  # remarks printed in the report (setting differences go in settings:)
    extra_tests: [f.npz]          # test-set files in the data folder every finished full-scale run is also scored on
    paper_statistic:              # what the paper's number is, so the report computes ours the same way
      kind: final                 #   final | best | last_mean | best_val | best_val_client (each client at its own
                                  #   best validation round), or a list of candidates when the paper does not say
      evaluations: 10             #   last_mean: the mean of this many last evaluations
      eval_every: 1               #   best/last_mean/best_val: the paper's (or its code's) evaluation cadence, in rounds
      runs: 5                     #   the paper's number is a mean over this many runs (omit if not stated)
      source: "paper, Sec. ..."   #   where the paper or its released code says so
      note: ...                   #   optional
    settings:                     # every setting where our run differs from the paper, or the paper from its code
      - {setting: ..., paper: ..., code: ..., ours: ..., effect: ..., source: "paper, Sec. ...", option: ...}
    unseen:                       # clients that never trained, each scored after a run finishes (FedBN App. G):
      morpho_global:              #   a column's metric "unseen:morpho_global" reads it
        dataset: morpho_mnist     #   a registered dataset, read from the run's data folder
        dataset_args: {variant: global}
        num_samples: 743          #   training images its BN statistics are computed on (seeded draw; default all)

An ``unseen:<name>`` column is the accuracy, after the last round, of a client that never trained and
holds the ``unseen`` entry's dataset: the clients' averaged weights (FedBN: the averaged BN affine) with
BN statistics computed on its own training images (:mod:`fednorm.evaluation.unseen`, recorded in the
run's ``unseen.json``); one value per run, so its final, best and the paper's ``final`` agree.

A cell may name its own ``statistic:`` (one of the kinds) where the paper's number for it is another
statistic than the table's (FBN's prose gives best-case figures beside Fig. 3a's final accuracies).

A cell's config is ``base``, then (reduced) ``reduced.set``, the column's ``set``, the row's
``set``, the cell's ``set``, then (reduced) ``reduced.rows[row]`` and ``reduced.columns[column]``;
mappings such as ``method_args`` are merged key by key (an empty mapping clears one). A column without ``set`` only selects a
metric, so such columns share the row's run (FedBN's per-domain accuracies are one run).
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from .. import yaml_io
from ..config import ExperimentConfig, load_config
from ..errors import ConfigError
from .subset import check_subset_spec

__all__ = [
    "PAPERS",
    "SCALES",
    "STATS",
    "PAPER_STATS",
    "PaperStatistic",
    "Setting",
    "Row",
    "Column",
    "Cell",
    "Table",
    "UnseenClient",
    "configs_root",
    "list_tables",
    "load_table",
    "load_paper",
    "merge_fields",
    "validate_table",
]

PAPERS = ("hbn", "fedtan", "fbn", "ln", "fedbn")
SCALES = ("full", "reduced")
STATS = ("final", "best", "last10", "best_val")
PAPER_STATS = ("final", "best", "last_mean", "best_val", "best_val_client")
METRICS = ("test_accuracy", "mean_client_accuracy")
ENV_CONFIGS = "FEDNORM_REPRODUCE_CONFIGS"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_TABLE_KEYS = {"paper", "table", "title", "source", "claim", "metric", "compare", "seeds", "base", "reduced",
               "rows", "columns", "cells", "notes", "extra_tests", "paper_statistic", "settings", "unseen"}
_UNSEEN_KEYS = {"dataset", "dataset_args", "num_samples"}
_REDUCED_KEYS = {"description", "set", "data_subset", "rows", "columns", "seeds"}
_ROW_KEYS = {"id", "label", "set", "seeds"}
_COLUMN_KEYS = {"id", "label", "set", "metric"}
_CELL_KEYS = {"paper", "approx", "note", "set", "skip", "statistic"}
_PAPER_STAT_KEYS = {"kind", "evaluations", "eval_every", "runs", "source", "note"}
_SETTING_REQUIRED = ("setting", "paper", "code", "ours", "effect", "source")
_SETTING_KEYS = set(_SETTING_REQUIRED) | {"option"}


def configs_root() -> Path:
    """``$FEDNORM_REPRODUCE_CONFIGS``, else ``configs/reproduce`` of the repository holding fednorm."""
    env = os.environ.get(ENV_CONFIGS)
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[2] / "configs" / "reproduce"


def merge_fields(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``update``; nested mappings (``method_args`` ...) are merged key by key,
    and an empty mapping (``method_args: {}``) clears one."""
    out = copy.deepcopy(dict(base))
    for key, value in update.items():
        if isinstance(value, Mapping) and value and isinstance(out.get(key), Mapping):
            out[key] = merge_fields(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass(frozen=True)
class Row:
    id: str
    label: str
    set: dict[str, Any]
    seeds: int | None = None


@dataclass(frozen=True)
class Column:
    id: str
    label: str
    set: dict[str, Any]
    metric: str | None = None


@dataclass(frozen=True)
class Cell:
    """One (row, column) of a table: the paper's number (or words) and whether it is run."""

    row: str
    column: str
    paper: float | None = None
    paper_text: str | None = None
    approx: bool = False
    note: str | None = None
    set: dict[str, Any] = field(default_factory=dict)
    skip: str | None = None
    statistic: str | None = None
    """The paper's statistic for this cell where it is not the table's (one of :data:`PAPER_STATS`)."""

    @property
    def paper_display(self) -> str:
        if self.paper is None:
            return self.paper_text or "—"
        return f"{'≈' if self.approx else ''}{self.paper:.2f}"


@dataclass(frozen=True)
class PaperStatistic:
    """What the paper's number is: which statistic of a run's accuracy curve, over how many runs.

    ``kinds`` has one entry when the paper (or its code) says which; several when it does not
    (HBN: the paper does not say; the authors' released code logs the best and the mean of the
    last 10 evaluations), so the report computes ours each way.
    """

    kinds: tuple[str, ...]
    source: str
    evaluations: int | None = None
    """``last_mean``: the mean of this many last evaluations."""
    eval_every: int | None = None
    """How often the paper's (or its code's) run evaluates, in rounds: decides whether our run,
    evaluated at its own cadence, holds the same evaluations."""
    runs: int | None = None
    """The paper's number is a mean over this many runs; None: not stated."""
    note: str | None = None

    def cadence(self) -> str:
        e = self.eval_every
        return "every round" if e == 1 else f"every {e} rounds"

    def describe(self, kind: str) -> str:
        """One statistic in words."""
        if kind == "final":
            return "the accuracy after the last round"
        if kind == "best":
            return f"the best accuracy over the run's evaluations ({self.cadence()})"
        if kind == "best_val":
            return (f"the test accuracy at the round of the best mean validation accuracy over the run's evaluations "
                    f"({self.cadence()})")
        if kind == "best_val_client":
            return (f"each client's test accuracy at the round of its own best validation accuracy over the run's "
                    f"evaluations ({self.cadence()})")
        span = (self.evaluations - 1) * (self.eval_every or 1)
        return (f"the mean of the last {self.evaluations} evaluations ({self.cadence()}: rounds "
                f"R−{span} to R of an R-round run)")

    def words(self) -> str:
        """The paper's statistic in words, with the runs it is averaged over."""
        if len(self.kinds) == 1:
            text = self.describe(self.kinds[0])
        else:
            text = "not stated; one of " + " or ".join(self.describe(k) for k in self.kinds)
        if self.runs:
            text += f", mean over {self.runs} runs" if self.runs > 1 else ", one run"
        return text


@dataclass(frozen=True)
class Setting:
    """One setting where our run differs from the paper, or the paper from its released code."""

    setting: str
    paper: str
    code: str
    ours: str
    effect: str
    source: str
    option: str | None = None
    """How to run the paper's or the code's choice in fednorm, where that is possible."""


@dataclass(frozen=True)
class UnseenClient:
    """A client that never trained, scored on a finished run (``unseen:`` of a table file)."""

    dataset: str
    dataset_args: dict[str, Any] = field(default_factory=dict)
    num_samples: int | None = None
    """Training images its BN statistics are computed on (a seeded draw); None: all."""


@dataclass
class Table:
    """One table of a paper, loaded from its YAML file."""

    paper: str
    id: str
    title: str
    source: str
    claim: str
    metric: str
    compare: list[str]
    seeds: int
    base: dict[str, Any]
    reduced: dict[str, Any]
    rows: list[Row]
    columns: list[Column]
    cells: dict[tuple[str, str], Cell]
    notes: list[str]
    path: Path
    extra_tests: list[str] = field(default_factory=list)
    """Test-set files (in the data folder) every finished full-scale run is also scored on (``fednorm evaluate``)."""
    paper_statistic: PaperStatistic | None = None
    settings: list[Setting] = field(default_factory=list)
    unseen: dict[str, UnseenClient] = field(default_factory=dict)
    """Clients that never trained, by name: scored after each run (``unseen:<name>`` columns)."""

    def cell(self, row: str, column: str) -> Cell:
        return self.cells.get((row, column)) or Cell(row, column)

    def cell_statistics(self, row: str, column: str) -> tuple[str, ...]:
        """The statistic(s) the paper's number of a cell is: the cell's own, else the table's."""
        statistic = self.cell(row, column).statistic
        if statistic is not None:
            return (statistic,)
        return self.paper_statistic.kinds if self.paper_statistic else ()

    def row(self, row_id: str) -> Row:
        return next(r for r in self.rows if r.id == row_id)

    def column(self, column_id: str) -> Column:
        return next(c for c in self.columns if c.id == column_id)

    def column_metric(self, column: Column) -> str:
        return column.metric or self.metric

    def default_seeds(self, row: Row, scale: str) -> int:
        if scale == "reduced" and self.reduced.get("seeds") is not None:
            return int(self.reduced["seeds"])
        return row.seeds if row.seeds is not None else self.seeds

    def data_subset(self, scale: str) -> dict[str, int] | None:
        spec = self.reduced.get("data_subset") if scale == "reduced" else None
        return dict(spec) if spec else None

    def fields(self, row_id: str, column_id: str, scale: str) -> dict[str, Any]:
        """The config fields of a cell at ``scale`` (before seed, data folder and output)."""
        if scale not in SCALES:
            raise ConfigError(f"unknown scale '{scale}'; valid: {', '.join(SCALES)}")
        row, column, cell = self.row(row_id), self.column(column_id), self.cell(row_id, column_id)
        fields = dict(self.base)
        if scale == "reduced":
            fields = merge_fields(fields, self.reduced.get("set", {}))
        for update in (column.set, row.set, cell.set):
            fields = merge_fields(fields, update)
        if scale == "reduced":
            fields = merge_fields(fields, self.reduced.get("rows", {}).get(row_id, {}))
            fields = merge_fields(fields, self.reduced.get("columns", {}).get(column_id, {}))
        return fields

    def run_id(self, row_id: str, column_id: str) -> str:
        """The run directory name of a cell; columns that only select a metric share the row's."""
        if self.column(column_id).set or self.cell(row_id, column_id).set:
            return f"{row_id}__{column_id}"
        return row_id

    def paper_rounds(self, row_id: str, column_id: str) -> int:
        return int(self.fields(row_id, column_id, "full").get("rounds", ExperimentConfig.model_fields["rounds"].default))


def _fail(path: Path, message: str) -> ConfigError:
    return ConfigError(f"{path}: {message}")


def _mapping(value: Any, path: Path, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _fail(path, f"{what} must be a mapping, got {type(value).__name__}")
    return dict(value)


def _check_id(value: Any, path: Path, what: str) -> str:
    if not isinstance(value, str) or not _ID.match(value):
        raise _fail(path, f"{what} must be a name of letters, digits, '_', '.', '-', got {value!r}")
    return value


def _check_metric(value: Any, path: Path, what: str) -> str:
    if isinstance(value, str) and (value in METRICS or any(value.startswith(p) and len(value) > len(p) for p in ("client:", "unseen:"))):
        return value
    raise _fail(path, f"{what} must be one of {', '.join(METRICS)}, 'client:<source>' or 'unseen:<name>', got {value!r}")


def _parse_unseen(value: Any, path: Path) -> dict[str, UnseenClient]:
    out = {}
    for name, entry in _mapping(value, path, "unseen").items():
        where = f"unseen.{_check_id(name, path, 'unseen names')}"
        entry = _mapping(entry, path, where)
        unknown = sorted(set(entry) - _UNSEEN_KEYS)
        if unknown:
            raise _fail(path, f"{where} has unknown keys {unknown}; valid: {', '.join(sorted(_UNSEEN_KEYS))}")
        dataset = _text(entry.get("dataset"), path, f"{where}.dataset")
        samples = _positive_int(entry.get("num_samples"), path, f"{where}.num_samples")
        if samples is not None and samples < 2:
            raise _fail(path, f"{where}.num_samples must be at least 2 (BN statistics need two samples), got {samples}")
        out[name] = UnseenClient(str(dataset), _mapping(entry.get("dataset_args"), path, f"{where}.dataset_args"), samples)
    return out


def _check_seeds(value: Any, path: Path, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(path, f"{what} must be a positive integer, got {value!r}")
    return value


def _positive_int(value: Any, path: Path, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(path, f"{what} must be a positive integer, got {value!r}")
    return value


def _text(value: Any, path: Path, what: str, required: bool = True) -> str | None:
    if value is None and not required:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, f"{what} must be non-empty text, got {value!r}")
    return value.strip()


def _parse_paper_statistic(value: Any, path: Path) -> PaperStatistic | None:
    if value is None:
        return None
    spec = _mapping(value, path, "paper_statistic")
    unknown = sorted(set(spec) - _PAPER_STAT_KEYS)
    if unknown:
        raise _fail(path, f"paper_statistic has unknown keys {unknown}; valid: {', '.join(sorted(_PAPER_STAT_KEYS))}")
    kinds = spec.get("kind")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if (not isinstance(kinds, list) or not kinds or len(set(map(str, kinds))) != len(kinds)
            or any(k not in PAPER_STATS for k in kinds)):
        raise _fail(path, f"paper_statistic.kind must be one of {', '.join(PAPER_STATS)} or a list of them, got {spec.get('kind')!r}")
    stat = PaperStatistic(
        kinds=tuple(kinds), source=_text(spec.get("source"), path, "paper_statistic.source"),
        evaluations=_positive_int(spec.get("evaluations"), path, "paper_statistic.evaluations"),
        eval_every=_positive_int(spec.get("eval_every"), path, "paper_statistic.eval_every"),
        runs=_positive_int(spec.get("runs"), path, "paper_statistic.runs"),
        note=_text(spec.get("note"), path, "paper_statistic.note", required=False),
    )
    _check_kinds_defined(stat, stat.kinds, path, "paper_statistic.kind")
    if stat.evaluations is not None and "last_mean" not in stat.kinds:
        raise _fail(path, "paper_statistic.evaluations belongs to kind last_mean; remove it or add last_mean to kind")
    return stat


def _check_kinds_defined(stat: PaperStatistic, kinds: tuple[str, ...], path: Path, what: str) -> None:
    """``last_mean`` needs ``evaluations``; the others but ``final`` need ``eval_every``."""
    if "last_mean" in kinds and stat.evaluations is None:
        raise _fail(path, f"{what} last_mean needs paper_statistic.evaluations (how many last evaluations the paper averages)")
    if any(k != "final" for k in kinds) and stat.eval_every is None:
        raise _fail(path, f"{what} {'/'.join(k for k in kinds if k != 'final')} needs paper_statistic.eval_every "
                          "(how often the paper's run evaluates, in rounds)")


def _parse_settings(value: Any, path: Path) -> list[Setting]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail(path, f"settings must be a list of mappings, got {type(value).__name__}")
    out = []
    for i, entry in enumerate(value):
        entry = _mapping(entry, path, f"settings[{i}]")
        unknown = sorted(set(entry) - _SETTING_KEYS)
        if unknown:
            raise _fail(path, f"settings[{i}] has unknown keys {unknown}; valid: {', '.join(sorted(_SETTING_KEYS))}")
        missing = [k for k in _SETTING_REQUIRED if k not in entry]
        if missing:
            raise _fail(path, f"settings[{i}] misses {missing}; each entry states {', '.join(_SETTING_REQUIRED)}")
        fields = {k: _text(entry[k], path, f"settings[{i}].{k}") for k in _SETTING_REQUIRED}
        out.append(Setting(**fields, option=_text(entry.get("option"), path, f"settings[{i}].option", required=False)))
    return out


def _parse_cell(row: str, column: str, value: Any, path: Path) -> Cell:
    where = f"cells.{row}.{column}"
    if value is None:
        return Cell(row, column)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Cell(row, column, paper=float(value))
    if isinstance(value, str):
        return Cell(row, column, paper_text=value)
    spec = _mapping(value, path, where)
    unknown = sorted(set(spec) - _CELL_KEYS)
    if unknown:
        raise _fail(path, f"{where} has unknown keys {unknown}; valid: {', '.join(sorted(_CELL_KEYS))}")
    paper = spec.get("paper")
    number = float(paper) if isinstance(paper, (int, float)) and not isinstance(paper, bool) else None
    if paper is not None and number is None and not isinstance(paper, str):
        raise _fail(path, f"{where}.paper must be a number or text, got {paper!r}")
    skip = spec.get("skip")
    if skip is not None and (not isinstance(skip, str) or not skip.strip()):
        raise _fail(path, f"{where}.skip must be the reason, as text")
    statistic = spec.get("statistic")
    if statistic is not None and statistic not in PAPER_STATS:
        raise _fail(path, f"{where}.statistic must be one of {', '.join(PAPER_STATS)}, got {statistic!r}")
    return Cell(row, column, paper=number, paper_text=paper if isinstance(paper, str) else None,
                approx=bool(spec.get("approx", False)), note=spec.get("note"),
                set=_mapping(spec.get("set"), path, f"{where}.set"), skip=skip, statistic=statistic)


def load_table(path: str | Path) -> Table:
    """Parse and check one table file (structure only; :func:`validate_table` checks every config)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"table config not found: {path}")
    try:
        raw = yaml_io.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    spec = _mapping(raw, path, "the file")
    unknown = sorted(set(spec) - _TABLE_KEYS)
    if unknown:
        raise _fail(path, f"unknown keys {unknown}; valid: {', '.join(sorted(_TABLE_KEYS))}")
    for key in ("paper", "table", "base", "rows", "columns"):
        if key not in spec:
            raise _fail(path, f"missing '{key}'")
    paper, table_id = _check_id(spec["paper"], path, "paper"), _check_id(spec["table"], path, "table")
    if path.stem != table_id or path.parent.name != paper:
        raise _fail(path, f"paper/table ({paper}/{table_id}) must match the file's folder and name")
    reduced = _mapping(spec.get("reduced"), path, "reduced")
    unknown = sorted(set(reduced) - _REDUCED_KEYS)
    if unknown:
        raise _fail(path, f"reduced has unknown keys {unknown}; valid: {', '.join(sorted(_REDUCED_KEYS))}")
    if not reduced.get("description"):
        raise _fail(path, "reduced.description must state what the reduced scale is")
    if reduced.get("data_subset") is not None:
        reduced["data_subset"] = check_subset_spec(reduced["data_subset"], f"{path}: reduced")
    _check_seeds(reduced.get("seeds"), path, "reduced.seeds")
    rows: list[Row] = []
    for i, r in enumerate(spec["rows"] or []):
        r = _mapping(r, path, f"rows[{i}]")
        if set(r) - _ROW_KEYS:
            raise _fail(path, f"rows[{i}] has unknown keys {sorted(set(r) - _ROW_KEYS)}; valid: {', '.join(sorted(_ROW_KEYS))}")
        rid = _check_id(r.get("id"), path, f"rows[{i}].id")
        rows.append(Row(rid, str(r.get("label", rid)), _mapping(r.get("set"), path, f"rows[{i}].set"),
                        _check_seeds(r.get("seeds"), path, f"rows[{i}].seeds")))
    columns: list[Column] = []
    for i, c in enumerate(spec["columns"] or []):
        c = _mapping(c, path, f"columns[{i}]")
        if set(c) - _COLUMN_KEYS:
            raise _fail(path, f"columns[{i}] has unknown keys {sorted(set(c) - _COLUMN_KEYS)}; valid: {', '.join(sorted(_COLUMN_KEYS))}")
        cid = _check_id(c.get("id"), path, f"columns[{i}].id")
        metric = _check_metric(c["metric"], path, f"columns[{i}].metric") if c.get("metric") is not None else None
        columns.append(Column(cid, str(c.get("label", cid)), _mapping(c.get("set"), path, f"columns[{i}].set"), metric))
    if not rows or not columns:
        raise _fail(path, "a table needs at least one row and one column")
    for what, ids in (("row", [r.id for r in rows]), ("column", [c.id for c in columns])):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise _fail(path, f"duplicate {what} ids {dup}")
    row_ids, col_ids = {r.id for r in rows}, {c.id for c in columns}
    cells: dict[tuple[str, str], Cell] = {}
    for rid, per_col in _mapping(spec.get("cells"), path, "cells").items():
        if rid not in row_ids:
            raise _fail(path, f"cells names an unknown row '{rid}'; rows: {', '.join(sorted(row_ids))}")
        for cid, value in _mapping(per_col, path, f"cells.{rid}").items():
            if cid not in col_ids:
                raise _fail(path, f"cells.{rid} names an unknown column '{cid}'; columns: {', '.join(sorted(col_ids))}")
            cells[(rid, cid)] = _parse_cell(rid, cid, value, path)
    for key, ids in (("rows", row_ids), ("columns", col_ids)):
        extra = sorted(set(_mapping(reduced.get(key), path, f"reduced.{key}")) - ids)
        if extra:
            raise _fail(path, f"reduced.{key} names unknown {key[:-1]}s {extra}")
    compare = spec.get("compare", ["final"])
    compare = [compare] if isinstance(compare, str) else list(compare)
    if not compare or any(s not in STATS for s in compare):
        raise _fail(path, f"compare must list statistics among {', '.join(STATS)}, got {spec.get('compare')!r}")
    notes = spec.get("notes") or []
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise _fail(path, "notes must be a list of text lines")
    extra = spec.get("extra_tests") or []
    if not isinstance(extra, list) or not all(isinstance(n, str) and n.endswith(".npz") for n in extra):
        raise _fail(path, "extra_tests must be a list of .npz file names in the data folder")
    paper_statistic = _parse_paper_statistic(spec.get("paper_statistic"), path)
    unseen = _parse_unseen(spec.get("unseen"), path)
    for c in columns:
        metric = c.metric or str(spec.get("metric", ""))
        if metric.startswith("unseen:") and metric.split(":", 1)[1] not in unseen:
            raise _fail(path, f"column '{c.id}' reads {metric}, which the table's unseen: does not name "
                              f"(it names: {', '.join(sorted(unseen)) or 'nothing'})")
    if unseen and reduced.get("data_subset") is not None:
        raise _fail(path, "unseen: clients read their dataset from the run's data folder, which reduced.data_subset "
                          "replaces with a subset of the table's own dataset; drop one of them")
    for (rid, cid), cell in cells.items():
        if cell.statistic is not None:
            if paper_statistic is None:
                raise _fail(path, f"cells.{rid}.{cid}.statistic needs the table's paper_statistic (its source and cadence)")
            _check_kinds_defined(paper_statistic, (cell.statistic,), path, f"cells.{rid}.{cid}.statistic")
    return Table(
        extra_tests=extra, paper_statistic=paper_statistic, settings=_parse_settings(spec.get("settings"), path), unseen=unseen,
        paper=paper, id=table_id, title=str(spec.get("title", table_id)), source=str(spec.get("source", "")),
        claim=str(spec.get("claim", "")), metric=_check_metric(spec.get("metric", "test_accuracy"), path, "metric"),
        compare=compare, seeds=_check_seeds(spec.get("seeds", 1), path, "seeds") or 1,
        base=_mapping(spec["base"], path, "base"), reduced=reduced, rows=rows, columns=columns, cells=cells,
        notes=notes, path=path,
    )


def validate_table(table: Table) -> dict[str, int]:
    """Build every cell's config at both scales through :class:`ExperimentConfig`.

    Returns the number of configs checked per scale; raises :class:`ConfigError` naming the file,
    scale and cell of the first invalid one.
    """
    counts = {}
    for scale in SCALES:
        n = 0
        for row in table.rows:
            for column in table.columns:
                fields = table.fields(row.id, column.id, scale)
                try:
                    load_config(None, fields)
                except ConfigError as exc:
                    raise ConfigError(f"{table.path}: cell {row.id}/{column.id} at {scale} scale: {exc}") from None
                n += 1
        counts[scale] = n
    return counts


def list_tables(paper: str, root: Path | None = None) -> list[str]:
    """The table ids of ``paper`` (file names under ``configs/reproduce/<paper>/``), sorted."""
    root = configs_root() if root is None else Path(root)
    if paper not in PAPERS:
        raise ConfigError(f"unknown paper '{paper}'; valid: {', '.join(PAPERS)}")
    folder = root / paper
    if not folder.is_dir():
        raise ConfigError(
            f"no table configs for '{paper}' at {folder} (they ship in the repository's configs/reproduce; "
            f"pass --configs DIR or set ${ENV_CONFIGS})"
        )
    return sorted(p.stem for p in folder.glob("*.yaml"))


def load_paper(paper: str, tables: list[str] | None = None, root: Path | None = None) -> list[Table]:
    """The tables of ``paper`` (all, or those named), parsed."""
    root = configs_root() if root is None else Path(root)
    available = list_tables(paper, root)
    if tables:
        unknown = [t for t in tables if t not in available]
        if unknown:
            raise ConfigError(f"unknown table {', '.join(repr(t) for t in unknown)} for '{paper}'; valid: {', '.join(available)}")
    return [load_table(root / paper / f"{t}.yaml") for t in (tables or available)]
