"""The papers' tables as data: one YAML file per table under ``configs/reproduce/<paper>/``.

A table file holds everything needed to rerun a table of a paper and to compare with it, and no
number lives in Python::

    paper: hbn                    # the folder name
    table: table1                 # the file name
    title: ...                    # what the table is
    source: spec/000_hbn.md §3    # where the setting and the numbers come from
    claim: ...                    # the paper's headline claim for this table (free text)
    metric: test_accuracy         # what a cell reads from a run (a column may override it)
    compare: [best, last10]       # statistics compared with the paper's number; the first ranks
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
    notes: [...]                  # differences from the paper, printed in the report
    extra_tests: [f.npz]          # test-set files in the data folder every finished full-scale run is also scored on

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

from ..config import ExperimentConfig, load_config
from ..errors import ConfigError
from .subset import check_subset_spec

__all__ = [
    "PAPERS",
    "SCALES",
    "STATS",
    "Row",
    "Column",
    "Cell",
    "Table",
    "configs_root",
    "list_tables",
    "load_table",
    "load_paper",
    "merge_fields",
    "validate_table",
]

PAPERS = ("hbn", "fedtan", "fbn", "ln", "fedbn")
SCALES = ("full", "reduced")
STATS = ("final", "best", "last10")
METRICS = ("test_accuracy", "mean_client_accuracy")
ENV_CONFIGS = "FEDNORM_REPRODUCE_CONFIGS"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_TABLE_KEYS = {"paper", "table", "title", "source", "claim", "metric", "compare", "seeds", "base", "reduced",
               "rows", "columns", "cells", "notes", "extra_tests"}
_REDUCED_KEYS = {"description", "set", "data_subset", "rows", "columns", "seeds"}
_ROW_KEYS = {"id", "label", "set", "seeds"}
_COLUMN_KEYS = {"id", "label", "set", "metric"}
_CELL_KEYS = {"paper", "approx", "note", "set", "skip"}


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

    @property
    def paper_display(self) -> str:
        if self.paper is None:
            return self.paper_text or "—"
        return f"{'≈' if self.approx else ''}{self.paper:.2f}"


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

    def cell(self, row: str, column: str) -> Cell:
        return self.cells.get((row, column)) or Cell(row, column)

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
    if isinstance(value, str) and (value in METRICS or (value.startswith("client:") and len(value) > 7)):
        return value
    raise _fail(path, f"{what} must be one of {', '.join(METRICS)} or 'client:<source>', got {value!r}")


def _check_seeds(value: Any, path: Path, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(path, f"{what} must be a positive integer, got {value!r}")
    return value


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
    return Cell(row, column, paper=number, paper_text=paper if isinstance(paper, str) else None,
                approx=bool(spec.get("approx", False)), note=spec.get("note"),
                set=_mapping(spec.get("set"), path, f"{where}.set"), skip=skip)


def load_table(path: str | Path) -> Table:
    """Parse and check one table file (structure only; :func:`validate_table` checks every config)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"table config not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
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
    return Table(
        extra_tests=extra,
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
