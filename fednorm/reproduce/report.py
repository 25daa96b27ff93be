"""The reproduction report: ``report.md``, ``results.json`` and plots, from the run directories.

Everything here reads files: the tables (YAML) and the run directories a suite wrote
(``summary.json``, ``metrics.jsonl``, ``config.yaml``, ``reproduce.json``). So the report can be
rebuilt at any time without running (``fednorm reproduce <paper> --report-only``), also while a
suite is still running or after it was interrupted.

For every cell: our mean ± sample standard deviation over the completed seeds of the final, best
and last-10 accuracy (in %), the paper's number and our mean minus it for each statistic the
table compares (``compare:``); the paper's own statistic (``paper_statistic:``) computed from our
runs the same way, beside our final, with a note where what was recorded does not allow it; whether
the paper's ordering of the rows holds within each column (every pair of rows with a paper number,
ranked by the first compared statistic); for a cell without a result, why; and, once per paper, the
settings where our runs differ from the paper or the paper from its code (``settings:``).

"last-10" is the mean over the last 10 *rounds* (R−9 to R of an R-round run), the same span in
every table whatever its evaluation cadence; it is n/a for a run that did not evaluate each of them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..config import load_config
from ..errors import ConfigError
from .runner import RECORD_NAME, RunSpec, config_differences, data_missing_file, git_info, plan
from .suite import STATS, PaperStatistic, Table

__all__ = ["run_metrics", "series", "summarize", "last_rounds_mean", "paper_statistic_value", "ordering", "collect",
           "write_report", "markdown", "settings_markdown"]

MAX_FLIPS = 6  # reversed pairs listed per column in report.md (all are in results.json)
LAST_ROUNDS = 10  # "last-10": the mean over the last 10 rounds of a run
STAT_LABEL = {"final": "final", "best": "best", "last10": "last-10 mean"}
PAPER_STAT_LABEL = {"final": "final", "best": "best"}
METRIC_LABEL = {"test_accuracy": "test accuracy of the global model",
                "mean_client_accuracy": "mean over clients of the accuracy on each client's own test split"}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    try:
        with open(run_dir / "metrics.jsonl") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def series(history: Sequence[Mapping[str, Any]], metric: str, sources: Sequence[str] | None) -> list[tuple[int, float]]:
    """``(round, accuracy in %)`` of ``metric`` at every evaluation that has it.

    ``test_accuracy`` and ``mean_client_accuracy`` are fields of each evaluation;
    ``client:<source>`` is the accuracy of the client holding that data source (FedBN's
    per-domain accuracy), found through the run's ``client_sources``.
    """
    out = []
    index = None
    if metric.startswith("client:"):
        name = metric.split(":", 1)[1]
        if not sources or name not in sources:
            raise ConfigError(f"metric {metric}: the run has no client with source '{name}' (sources: {sources})")
        index = list(sources).index(name)
    for rec in history:
        value = rec.get(metric) if index is None else (rec.get("client_accuracies") or [None] * (index + 1))[index]
        if value is not None and isinstance(value, (int, float)) and math.isfinite(value):
            out.append((int(rec.get("round", len(out) + 1)), 100.0 * float(value)))
    return out


def _saved_config(run_dir: Path) -> dict[str, Any]:
    """A run directory's ``config.yaml`` (written before its first round) as a mapping, or {}."""
    import yaml

    try:
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return saved if isinstance(saved, dict) else {}


def last_rounds_mean(curve: Sequence[tuple[int, float]], final_round: int, n: int = LAST_ROUNDS) -> float | None:
    """The mean accuracy over rounds ``final_round − n + 1`` to ``final_round``, or None unless the
    run evaluated every one of them: the same span of training in every table, whatever its
    evaluation cadence (the mean of the last n *evaluations* of a run evaluated every 100 rounds
    would span 1,000 rounds)."""
    rounds = range(max(1, final_round - n + 1), final_round + 1)
    at = dict(curve)
    if not rounds or any(r not in at for r in rounds):
        return None
    return statistics.fmean(at[r] for r in rounds)


def _cadence(eval_every: Any, eval_last: Any) -> str:
    if not eval_every:
        return "at the rounds in metrics.jsonl"
    text = "every round" if int(eval_every) == 1 else f"every {int(eval_every)} rounds"
    return text + (f" and each of the last {int(eval_last)}" if eval_last and int(eval_every) > 1 else "")


def paper_statistic_value(curve: Sequence[tuple[int, float]], final_round: int, kind: str, stat: PaperStatistic,
                          cadence: str = "at its own cadence") -> tuple[float | None, str | None]:
    """One run's figure computed as the paper's statistic ``kind``: ``(value, None)`` when the run
    recorded what that needs, else ``(value or None, why ours differs)``.

    ``final``: the accuracy at ``final_round``. ``best``: the maximum over the evaluations; the
    paper's is over every ``eval_every``-th round, so a run evaluated more sparsely gives a lower
    bound of it. ``last_mean``: the mean over the evaluations at rounds ``R − i·eval_every``,
    i < ``evaluations`` (the paper's last evaluations); None unless every one of them was evaluated.
    ``cadence`` describes the run's own evaluations for those notes (``"every 10 rounds"``).
    """
    at = dict(curve)
    if kind == "final":
        if final_round in at:
            return at[final_round], None
        return None, f"n/a: no evaluation at round {final_round}"
    every = int(stat.eval_every or 1)
    if kind == "best":
        if not at:
            return None, "n/a: no evaluation"
        needed = range(every, final_round + 1, every)
        missing = sum(1 for r in needed if r not in at)
        if not missing:
            return max(at.values()), None
        paper = "every round" if every == 1 else f"every {every} rounds"
        return max(at.values()), (f"best over our {len(at)} evaluations ({cadence}) where the paper's run evaluates "
                                  f"{paper}: a lower bound of the paper's best")
    if kind == "last_mean":
        n = int(stat.evaluations or 1)
        needed = [final_round - i * every for i in range(n) if final_round - i * every >= 1]
        if all(r in at for r in needed):
            return statistics.fmean(at[r] for r in needed), None
        return None, (f"n/a: the paper's last {n} evaluations are rounds {needed[-1]}–{final_round}"
                      f"{'' if every == 1 else f' every {every}'}; ours evaluated {cadence}")
    raise ConfigError(f"unknown paper statistic '{kind}'")


def _code_versions(invocations: list[dict[str, Any]]) -> list[str]:
    """``["e717bfe809", "0d8d940c3e+dirty:1a2b3c4d"]``: the distinct commits of a run's invocations,
    a dirty tree's with the hash of its diff."""
    versions: list[str] = []
    for inv in invocations:
        if not inv.get("commit"):
            continue
        v = inv["commit"][:10] + (f"+dirty:{str(inv.get('diff_sha256') or '?')[:8]}" if inv.get("dirty") else "")
        if v not in versions:
            versions.append(v)
    return versions


def run_metrics(run_dir: str | Path, metric: str) -> dict[str, Any]:
    """One run directory read for one metric: status, rounds, final/best/last-10 (in %), the
    curve, wall time, and the commit and command from ``reproduce.json``."""
    run_dir = Path(run_dir)
    summary = _read_json(run_dir / "summary.json") or {}
    record = _read_json(run_dir / RECORD_NAME) or {}
    saved = _saved_config(run_dir)
    history = _read_metrics(run_dir)
    curve = series(history, metric, summary.get("client_sources"))
    values = [v for _, v in curve]
    last = (record.get("invocations") or [{}])[-1]
    final_round = int(summary["rounds"]) if summary.get("rounds") else (curve[-1][0] if curve else 0)
    cadence = _cadence(saved.get("eval_every"), saved.get("eval_last_rounds"))
    last10 = last_rounds_mean(curve, final_round) if curve else None
    out: dict[str, Any] = {
        "dir": str(run_dir),
        "seed": summary.get("seed", record.get("seed", saved.get("seed"))),  # no summary before its first round ends
        "status": summary.get("status") or ("running or killed" if history else "not started"),
        "rounds": summary.get("rounds") if summary else (curve[-1][0] if curve else 0),
        "final_round": final_round,
        "final": values[-1] if values else None,
        "best": max(values) if values else None,
        "last10": last10,
        "last10_na": None if last10 is not None or not curve else f"evaluated {cadence}",
        "cadence": cadence,
        "curve": curve,
        "wall_seconds": record.get("wall_seconds"),
        "engine_wall_seconds": summary.get("wall_seconds"),
        "executor": summary.get("executor"),
        "commit": last.get("commit"),
        "dirty": last.get("dirty"),
        # every code version the run was trained with, in order: a run that spans code changes lists them
        "commits": _code_versions(record.get("invocations") or []),
        "command": last.get("command"),
        "run_command": record.get("run_command"),
        "error": summary.get("error"),
    }
    evaluations = _read_json(run_dir / "evaluation.json") or {}  # fednorm evaluate: other test sets
    out["extra_tests"] = {name: {"accuracy": 100.0 * float(e["accuracy"]), "n": int(e["n"]),
                                 "interval95": [100.0 * float(v) for v in e["interval95"]]}
                          for name, e in evaluations.items()
                          if metric == "test_accuracy" and e.get("round") == summary.get("rounds")}
    sync = summary.get("final_sync")
    if isinstance(sync, Mapping) and metric in sync and sync[metric] is not None:
        out["final_sync"] = 100.0 * float(sync[metric])
    return out


def _last_evaluation(run: Mapping[str, Any]) -> str:
    """``", last evaluation 50.25% at round 600"``: where an unfinished run stands (its final,
    best and last-10 stay empty, since they are the finished run's)."""
    if not run.get("curve"):
        return ""
    at, value = run["curve"][-1]
    return f", last evaluation {value:.2f}% at round {at}"


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """Mean and sample standard deviation (n − 1; None for one value)."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else None, "n": len(vals)}


def welch(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict[str, Any] | None:
    """Welch's interval for mean(a) − mean(b) over two sets of seeds (unequal variances,
    Welch–Satterthwaite degrees of freedom); None with fewer than two values on either side.

    ``verdict``: ``"ahead"`` / ``"behind"`` when the interval excludes 0, else
    ``"not distinguishable"`` (at these seeds: more seeds narrow the interval)."""
    from scipy.stats import t as student_t

    a, b = [float(x) for x in a], [float(x) for x in b]
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = statistics.fmean(a) - statistics.fmean(b)
    se = (va + vb) ** 0.5
    if se == 0:
        return {"diff": diff, "low": diff, "high": diff, "df": None, "n": [len(a), len(b)],
                "verdict": "ahead" if diff > 0 else "behind" if diff < 0 else "not distinguishable"}
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = float(student_t.ppf(0.5 + level / 2, df)) * se
    low, high = diff - half, diff + half
    verdict = "ahead" if low > 0 else "behind" if high < 0 else "not distinguishable"
    return {"diff": diff, "low": low, "high": high, "df": df, "n": [len(a), len(b)], "verdict": verdict}


def ordering(cells: Sequence[Mapping[str, Any]], stat: str) -> dict[str, Any]:
    """Whether our ranking of the rows agrees with the paper's, pair by pair, in one column, and
    for each pair Welch's 95% interval of our difference over the seeds (:func:`welch`).

    Rows enter with a numeric paper value and a result; pairs the paper ties are left out.
    """
    rows = [c for c in cells if c.get("paper") is not None and (c.get("stats") or {}).get(stat, {}).get("mean") is not None]
    rows.sort(key=lambda c: -c["paper"])
    pairs, flips, tests = 0, [], []
    for i, hi in enumerate(rows):
        for lo in rows[i + 1:]:
            if hi["paper"] == lo["paper"]:
                continue
            pairs += 1
            ours_hi, ours_lo = hi["stats"][stat]["mean"], lo["stats"][stat]["mean"]
            seeds = [[r[stat] for r in c["runs"] if r.get("status") == "completed" and r.get(stat) is not None] for c in (hi, lo)]
            test = welch(*seeds)
            if test is not None:
                tests.append({"paper_higher": hi["row"], "paper_lower": lo["row"], **test})
            if not ours_hi > ours_lo:
                flips.append({"paper_higher": hi["row"], "paper_lower": lo["row"], "paper": [hi["paper"], lo["paper"]],
                              "ours": [ours_hi, ours_lo]})
    return {"stat": stat, "rows": [c["row"] for c in rows], "pairs": pairs, "agree": pairs - len(flips),
            "holds": (not flips) if pairs else None, "flips": flips, "tests": tests}


def _cell_specs(table: Table, scale: str, out: Path, data_dir: str | None, overrides: Mapping[str, Any] | None) -> dict[tuple[str, str], RunSpec]:
    specs = plan([table], scale=scale, out=out, seeds=1, data_dir=data_dir, overrides=overrides)
    return {cell: spec for spec in specs for cell in spec.cells}


def _seed_dirs(spec: RunSpec) -> list[Path]:
    folder = spec.dir.parent
    if not folder.is_dir():
        return []
    dirs = [p for p in folder.iterdir() if p.is_dir() and p.name.startswith("seed") and p.name[4:].isdigit()]
    return sorted(dirs, key=lambda p: int(p.name[4:]))


def _collect_cell(table: Table, row_id: str, col_id: str, spec: RunSpec | None, out: Path) -> dict[str, Any]:
    row, column, cell = table.row(row_id), table.column(col_id), table.cell(row_id, col_id)
    metric = table.column_metric(column)
    res: dict[str, Any] = {
        "row": row_id, "column": col_id, "row_label": row.label, "column_label": column.label, "metric": metric,
        "paper": cell.paper, "paper_text": cell.paper_text, "approx": cell.approx, "note": cell.note,
        "paper_display": cell.paper_display, "runs": [], "stale": [], "stats": {}, "diff": {},
        "paper_rounds": table.paper_rounds(row_id, col_id),
    }
    if cell.skip:
        res.update(status="skipped", reason=cell.skip)
        return res
    assert spec is not None
    res["run_id"] = spec.run_id
    res["planned_rounds"] = spec.config["rounds"]
    for run_dir in _seed_dirs(spec):
        try:
            saved = load_config(run_dir / "config.yaml").model_dump(mode="json")
        except ConfigError:
            continue
        diff = config_differences(saved, {**spec.config, "seed": saved["seed"]})
        if diff:
            res["stale"].append({"dir": str(run_dir), "differences": diff})
            continue
        try:
            # an unfinished run is measured against the length it was started for, which a
            # report at another --rounds (a stated fraction) does not change
            res["runs"].append({**run_metrics(run_dir, metric), "planned_rounds": saved["rounds"]})
        except ConfigError as exc:
            res["stale"].append({"dir": str(run_dir), "differences": [str(exc)]})
    done = [r for r in res["runs"] if r["status"] == "completed"]
    for stat in STATS:
        res["stats"][stat] = summarize([r[stat] for r in done])
    unevaluated = [r for r in done if r["last10"] is None]
    if unevaluated:  # a mean over some seeds only would not be the cell's
        res["stats"]["last10"] = {"mean": None, "std": None, "n": 0, "na": unevaluated[0]["last10_na"]}
    res["paper_statistic"] = _paper_statistic_cell(table, row_id, col_id, done)
    syncs = [r["final_sync"] for r in done if "final_sync" in r]
    if syncs:
        res["stats"]["final_sync"] = summarize(syncs)
    for name in sorted({n for r in done for n in r.get("extra_tests", {})}):
        res["stats"][f"test:{name}"] = summarize([r["extra_tests"][name]["accuracy"] for r in done if name in r.get("extra_tests", {})])
    for stat in table.compare:
        mean = res["stats"][stat]["mean"]
        res["diff"][stat] = None if mean is None or cell.paper is None else mean - cell.paper
    res["rounds"] = sorted({int(r["rounds"]) for r in done if r["rounds"] is not None})
    # reproduce.json times the invocations it saw end; one killed outright (a session's end) is not
    # in it, while the engine's own clock (summary.json) kept counting across resumes: take the larger.
    res["wall_seconds"] = sum(max(float(r["wall_seconds"] or 0.0), float(r.get("engine_wall_seconds") or 0.0))
                              for r in res["runs"])
    others = [r for r in res["runs"] if r["status"] != "completed"]
    if done:
        res["status"] = "ok"
        res["reason"] = "" if not others else "; ".join(f"seed {r['seed']}: {r['status']} at round {r['rounds']}" for r in others)
    elif others:
        res["status"] = others[0]["status"]
        res["reason"] = "; ".join(
            f"seed {r['seed']}: {r['status']} at round {r['rounds']} of {r['planned_rounds']}"
            + _last_evaluation(r) + (f" ({r['error']})" if r.get("error") else "") for r in others)
    else:
        res["status"] = "not run"
        res["reason"] = ("data missing (see above)" if data_missing_file(out, table.id).is_file()
                         else "no run directory yet (not selected, or the suite has not reached it)")
        if res["stale"]:
            res["reason"] += f"; {len(res['stale'])} run directory(ies) of an older config ignored"
    return res


def _paper_statistic_cell(table: Table, row_id: str, col_id: str, done: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The paper's statistic(s) of a cell computed from each finished run as the paper computes
    it: mean ± std over the seeds, the difference to the paper, and why ours may differ."""
    stat, cell = table.paper_statistic, table.cell(row_id, col_id)
    if stat is None or not done:
        return []
    out = []
    for kind in table.cell_statistics(row_id, col_id):
        values, why = [], []
        for r in done:
            value, note = paper_statistic_value(r["curve"], int(r["final_round"]), kind, stat, r.get("cadence") or "")
            values.append(value)
            if note and note not in why:
                why.append(note)
        summary = summarize(values) if all(v is not None for v in values) else {"mean": None, "std": None, "n": 0}
        out.append({"kind": kind, **summary, "exact": not why, "why": why,
                    "diff": None if summary["mean"] is None or cell.paper is None else summary["mean"] - cell.paper})
    return out


def _table_statistic(table: Table) -> dict[str, Any] | None:
    stat = table.paper_statistic
    if stat is None:
        return None
    return {"kinds": list(stat.kinds), "words": stat.words(), "source": stat.source, "note": stat.note,
            "evaluations": stat.evaluations, "eval_every": stat.eval_every, "runs": stat.runs}


def collect(
    tables: Sequence[Table],
    *,
    scale: str,
    out: str | Path,
    data_dir: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Read every cell of ``tables`` from the run directories under ``out`` (results.json's content)."""
    out = Path(out).resolve()
    result: dict[str, Any] = {"paper": tables[0].paper if tables else None, "scale": scale, "out": str(out),
                              "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "fednorm": git_info(), "tables": []}
    for table in tables:
        specs = _cell_specs(table, scale, out, data_dir, overrides)
        cells = [_collect_cell(table, r.id, c.id, specs.get((r.id, c.id)), out) for r in table.rows for c in table.columns]
        primary = table.compare[0]
        orders = {c.id: ordering([x for x in cells if x["column"] == c.id], primary) for c in table.columns}
        setting = load_config(None, table.fields(table.rows[0].id, table.columns[0].id, scale)).model_dump(mode="json")
        varying = {k for r in table.rows for c in table.columns for k in table.fields(r.id, c.id, scale)
                   if table.fields(r.id, c.id, scale).get(k) != setting.get(k)}
        planned = sorted({s.config["rounds"] for s in specs.values()})
        missing = data_missing_file(out, table.id)
        result["tables"].append({
            "table": table.id, "title": table.title, "source": table.source, "claim": table.claim,
            "metric": table.metric, "compare": table.compare, "notes": table.notes, "config_file": str(table.path),
            "scale_description": "the paper's setting" if scale == "full" else table.reduced.get("description", ""),
            "data_subset": table.data_subset(scale),
            "setting": {k: v for k, v in setting.items() if k not in varying and k not in ("out", "data_dir")},
            "planned_rounds": planned,
            "paper_rounds": sorted({table.paper_rounds(r.id, c.id) for r in table.rows for c in table.columns}),
            "rows": [{"id": r.id, "label": r.label} for r in table.rows],
            "columns": [{"id": c.id, "label": c.label, "metric": table.column_metric(c)} for c in table.columns],
            "cells": cells, "ordering": orders,
            "data_missing": missing.read_text().strip() if missing.is_file() else None,
            "paper_statistic": _table_statistic(table),
            "settings": [dataclasses.asdict(x) for x in table.settings],
        })
    return result


# -- markdown ------------------------------------------------------------------------------


def _pct(v: float | None, digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def _ms(s: Mapping[str, Any] | None) -> str:
    if s and s.get("na"):
        return "n/a"
    if not s or s.get("mean") is None:
        return "—"
    return f"{s['mean']:.2f}" + ("" if s.get("std") is None else f" ± {s['std']:.2f}")


def _signed(v: float | None) -> str:
    return "—" if v is None else f"{v:+.2f}"


def _rounds_text(cell: Mapping[str, Any]) -> str:
    rounds = cell.get("rounds") or []
    if not rounds:
        return "—"
    paper = cell.get("paper_rounds")
    r = "/".join(str(x) for x in rounds)
    return f"{r} of {paper}" if paper and rounds != [paper] else r


def _setting_text(setting: Mapping[str, Any]) -> str:
    from ..config import ExperimentConfig

    defaults = {k: (f.default if f.default_factory is None else f.default_factory()) for k, f in ExperimentConfig.model_fields.items()}
    keep = {k: v for k, v in setting.items() if v != defaults.get(k) or k in ("dataset", "partition", "model", "norm", "method", "rounds", "batch_size", "lr", "num_clients")}
    return ", ".join(f"`{k}={json.dumps(v) if isinstance(v, (dict, list)) else v}`" for k, v in keep.items())


def _table_markdown(t: Mapping[str, Any], out: Path) -> list[str]:
    lines = [f"## {t['title']}", "", f"`{t['config_file']}` — source: {t['source']}", ""]
    if t["claim"]:
        lines += [f"**Paper's claim:** {t['claim']}", ""]
    ran = sorted({r for c in t["cells"] for r in c.get("rounds") or []})
    ours = ran or t["planned_rounds"]
    paper_r = "/".join(map(str, t["paper_rounds"]))
    fraction = ""
    if len(t["paper_rounds"]) == 1 and len(ours) == 1 and t["paper_rounds"][0]:
        fraction = f" ({100 * ours[0] / t['paper_rounds'][0]:.3g}% of the paper's)"
    what = "Rounds run" if ran else "Rounds planned"
    lines += [f"**Scale:** {t['scale_description']} {what}: {'/'.join(map(str, ours))} of the paper's {paper_r}{fraction}.", ""]
    if t.get("data_subset"):
        ds = t["data_subset"]
        lines += [f"**Data subset:** {ds['train_per_class']} training and {ds['test_per_class']} test images per class "
                  f"(seed {ds['seed']}).", ""]
    lines += [f"**Setting shared by every cell:** {_setting_text(t['setting'])}", ""]
    if t.get("data_missing"):
        lines += [f"**Not run, data missing:** {t['data_missing']}", ""]
    metrics = sorted({c["metric"] for c in t["columns"]})
    descs = [METRIC_LABEL.get(m, m) for m in metrics if not m.startswith("client:")]
    if any(m.startswith("client:") for m in metrics):
        descs.insert(0, "per data-source columns: the accuracy of the client holding that source on its own test split")
    mdesc = "; ".join(descs)
    lines += [f"**Metric:** {mdesc}, in %. Ours: mean ± sample std over the completed seeds; last-10: the mean over "
              f"the last {LAST_ROUNDS} rounds (R−{LAST_ROUNDS - 1} to R), n/a where a run did not evaluate each of them. "
              f"The paper's number is compared with our {', '.join(STAT_LABEL[s] for s in t['compare'])} (difference = "
              f"ours − paper); the ordering uses the {STAT_LABEL[t['compare'][0]]}.", ""]
    head = "| method | column | final | best | last-10 | paper | " + " | ".join(f"Δ {STAT_LABEL[s]}" for s in t["compare"]) + " | seeds | rounds | wall (s) | status |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    has_sync = any("final_sync" in c["stats"] for c in t["cells"])
    for c in t["cells"]:
        status = c["status"] if not c.get("reason") else f"{c['status']}: {c['reason']}"
        if c.get("note"):
            status += f" (paper: {c['note']})"
        st = c["stats"]
        diffs = " | ".join(_signed(c["diff"].get(s)) for s in t["compare"])
        lines.append(
            f"| {c['row_label']} | {c['column_label']} | {_ms(st.get('final'))} | {_ms(st.get('best'))} | {_ms(st.get('last10'))} | "
            f"{c['paper_display']} | {diffs} | {(st.get('final') or {}).get('n', 0) or '—'} | {_rounds_text(c)} | "
            f"{_pct(c.get('wall_seconds') or None, 1)} | {status.replace('|', '/')} |"
        )
    if has_sync:
        lines += ["", "HBN's statistics-only round T+1 (`final_sync`), mean ± std: " + "; ".join(
            f"{c['row_label']} | {c['column_label']}: {_ms(c['stats']['final_sync'])}" for c in t["cells"] if "final_sync" in c["stats"])]
    extra = sorted({k for c in t["cells"] for k in c["stats"] if k.startswith("test:")})
    for key in extra:  # the final checkpoints scored on another test set (fednorm evaluate)
        lines += ["", f"Final accuracy on `{key[5:]}` (`fednorm evaluate`; the runs' own test set is in the table above), "
                  "mean ± std over the seeds scored: " + "; ".join(
                      f"{c['row_label']} | {c['column_label']}: {_ms(c['stats'][key])}" for c in t["cells"] if key in c["stats"])]
    na = sorted({c["stats"]["last10"]["na"] for c in t["cells"] if (c["stats"].get("last10") or {}).get("na")})
    if na:
        planned = t["setting"].get("eval_last_rounds") or 0
        lines += ["", f"last-10 is n/a where the runs were {'; '.join(na)} (their config.yaml): they hold no evaluation of "
                  f"some of their last {LAST_ROUNDS} rounds."
                  + (f" Runs started from this table's config evaluate each of their last {planned} rounds too."
                     if planned >= LAST_ROUNDS else "")]
    lines += _paper_statistic_markdown(t)
    lines += ["", f"**Ordering of the methods within each column** (by the {STAT_LABEL[t['compare'][0]]}; pairs of rows with a paper number):", ""]
    labels = {r["id"]: r["label"] for r in t["rows"]}
    for col in t["columns"]:
        o = t["ordering"][col["id"]]
        if o["holds"] is None:
            lines.append(f"- {col['label']}: not enough results to compare ({len(o['rows'])} row(s) with a paper number and a result)")
        elif o["holds"]:
            lines.append(f"- {col['label']}: **holds** ({o['agree']} of {o['pairs']} pairs; paper order {' > '.join(labels[r] for r in o['rows'])})")
        else:
            flips = "; ".join(f"{labels[f['paper_higher']]} {f['ours'][0]:.2f} ≤ {labels[f['paper_lower']]} {f['ours'][1]:.2f} "
                              f"(paper {f['paper'][0]:.2f} > {f['paper'][1]:.2f})" for f in o["flips"][:MAX_FLIPS])
            if len(o["flips"]) > MAX_FLIPS:
                flips += f"; and {len(o['flips']) - MAX_FLIPS} more (results.json)"
            lines.append(f"- {col['label']}: **does not hold** ({o['agree']} of {o['pairs']} pairs agree); reversed: {flips}")
    tests = [(col, x) for col in t["columns"] for x in t["ordering"][col["id"]].get("tests", [])]
    if tests:
        lines += ["", f"**Differences over seeds** (the {STAT_LABEL[t['compare'][0]]}; ours, the row the paper ranks "
                  "higher minus the lower; Welch's 95% interval over the completed seeds; pairs with at least two seeds "
                  "on each side):", "", "| column | paper: higher > lower | ours: difference (95% interval) | seeds | verdict |",
                  "|---|---|---:|---|---|"]
        for col, x in tests:
            verdict = {"ahead": "the paper's order, beyond the seeds' spread",
                       "behind": "the reverse order, beyond the seeds' spread",
                       "not distinguishable": f"not distinguishable at {x['n'][0]} and {x['n'][1]} seeds"}[x["verdict"]]
            lines.append(f"| {col['label']} | {labels[x['paper_higher']]} > {labels[x['paper_lower']]} | "
                         f"{x['diff']:+.2f} ({x['low']:+.2f} to {x['high']:+.2f}) | {x['n'][0]} / {x['n'][1]} | {verdict} |")
    if t["notes"]:
        lines += ["", "**Notes:**", ""] + [f"- {n}" for n in t["notes"]]
    if t.get("settings"):
        lines += ["", f"Settings where these runs differ from the paper or the paper from its code: {len(t['settings'])}, "
                  "in the table at the top of this report."]
    plots = [p for p in (f"plots/{t['table']}_curves.png", f"plots/{t['table']}_bars.png") if (out / p).is_file()]
    if plots:
        lines += [""] + [f"![{Path(p).stem}]({p})" for p in plots]
    runs = [(c, r) for c in t["cells"] for r in c["runs"]]
    seen: set[str] = set()
    if runs:
        lines += ["", "<details><summary>Runs</summary>", "", "| run directory | seed | status | rounds | wall (s) | engine wall (s) | commit | command |",
                  "|---|---|---|---|---|---|---|---|"]
        for c, r in runs:
            if r["dir"] in seen:
                continue
            seen.add(r["dir"])
            rel = Path(r["dir"]).relative_to(out) if Path(r["dir"]).is_relative_to(out) else r["dir"]
            commit = ", ".join(r.get("commits") or []) or "—"
            lines.append(f"| `{rel}` | {r['seed']} | {r['status']} | {r['rounds']} | {_pct(r['wall_seconds'], 1)} | "
                         f"{_pct(r['engine_wall_seconds'], 1)} | {commit} | `{r.get('command') or '—'}` |")
        lines += ["", "</details>"]
    return lines + [""]


def _kind_label(kind: str, stat: Mapping[str, Any]) -> str:
    if kind == "last_mean":
        return f"mean of the last {stat.get('evaluations')} evaluations"
    return PAPER_STAT_LABEL[kind]


def _paper_statistic_markdown(t: Mapping[str, Any]) -> list[str]:
    """The paper's statistic in words, and ours computed the same way beside our final, for
    every cell with a paper number and a finished run."""
    stat = t.get("paper_statistic")
    if not stat:
        return []
    lines = ["", f"**The paper's statistic:** {stat['words']} (source: {stat['source']})."
             + (f" {stat['note']}" if stat.get("note") else "")]
    cells = [c for c in t["cells"] if c.get("paper") is not None and c.get("paper_statistic")]
    if not cells:
        return lines + ["", "Ours computed the same way: no finished run of a cell with a paper number yet."]
    notes = {}
    for c in cells:
        own = [w for p in c["paper_statistic"] for w in p["why"]]
        rounds, paper_rounds = c.get("rounds") or [], c.get("paper_rounds")
        if rounds and paper_rounds and rounds != [paper_rounds]:
            own.append(f"after {'/'.join(map(str, rounds))} of the paper's {paper_rounds} rounds")
        notes[(c["row"], c["column"])] = list(dict.fromkeys(own))
    shared = [w for w in next(iter(notes.values())) if all(w in v for v in notes.values())]
    lines += ["", "Ours computed the same way from each finished run (mean ± std over the seeds; Δ = ours − paper), "
              "beside our final" + (f". For every cell below: {'; '.join(shared)}." if shared else "."), "",
              "| method | column | paper | the paper's statistic | ours, the same way (Δ) | our final (Δ) | seeds "
              f"{'(the paper: runs) ' if stat.get('runs') else ''}| note |",
              "|---|---|---|---|---|---|---|---|"]
    runs = f" ({stat['runs']})" if stat.get("runs") else ""
    for c in cells:
        kinds = " / ".join(_kind_label(p["kind"], stat) for p in c["paper_statistic"])
        ours = " / ".join("n/a" if p["mean"] is None else f"{_ms(p)} ({_signed(p['diff'])})" for p in c["paper_statistic"])
        final = c["stats"].get("final") or {}
        final_diff = None if final.get("mean") is None else final["mean"] - c["paper"]
        note = "; ".join(w for w in notes[(c["row"], c["column"])] if w not in shared) or ""
        lines.append(f"| {c['row_label']} | {c['column_label']} | {c['paper_display']} | {kinds} | {ours} | "
                     f"{_ms(final)} ({_signed(final_diff)}) | {final.get('n') or '—'}{runs} | {note.replace('|', '/')} |")
    return lines


def settings_markdown(results: Mapping[str, Any]) -> list[str]:
    """One table of every setting where the paper's runs differ from the paper or the paper from
    its code, over all of a paper's tables (an entry shared by several tables once): the form
    REPRODUCTION.md's section for the paper takes."""
    tables = [t for t in results["tables"] if t.get("settings")]
    if not tables:
        return []
    entries: dict[str, dict[str, Any]] = {}
    for t in tables:
        for entry in t["settings"]:
            key = json.dumps(entry, sort_keys=True)
            entries.setdefault(key, {**entry, "tables": []})["tables"].append(t["table"])
    several = len(tables) > 1
    options = any(e.get("option") for e in entries.values())
    head = (["setting", "paper", "released code", "ours", "effect"] + (["to run the paper's/code's choice"] if options else [])
            + (["tables"] if several else []) + ["source"])
    lines = ["## Settings where our runs differ from the paper, or the paper from its released code", "",
             "From the `settings:` of each table config (the spec note's section on where the paper and its code "
             "disagree is cited). Effects are measured only where the text says so.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in entries.values():
        row = [e["setting"], e["paper"], e["code"], e["ours"], e["effect"]] + ([e.get("option") or "—"] if options else [])
        row += ([", ".join(e["tables"]) if len(e["tables"]) < len(tables) else "all"] if several else []) + [e["source"]]
        lines.append("| " + " | ".join(str(x).replace("|", "/") for x in row) + " |")
    return lines + [""]


def markdown(results: Mapping[str, Any]) -> str:
    out = Path(results["out"])
    git = results.get("fednorm") or {}
    commit = "unknown" if not git.get("commit") else git["commit"] + (" (with uncommitted changes)" if git.get("dirty") else "")
    lines = [f"# Reproduction of the {results['paper']} paper's tables ({results['scale']} scale)", "",
             f"Generated {results['generated']} from the run directories under `{out}` by fednorm at commit {commit}. "
             f"Each run directory records the commit and command that produced it (see *Runs*).", ""]
    lines += settings_markdown(results)
    for t in results["tables"]:
        lines += _table_markdown(t, out)
    return "\n".join(lines)


# -- plots ---------------------------------------------------------------------------------


def plot_table(t: Mapping[str, Any], out: Path) -> list[Path]:
    """``plots/<table>_curves.png`` (each cell's curves, all seeds, the paper's number dashed) and
    ``plots/<table>_bars.png`` (ours mean ± std beside the paper, per column)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = out / "plots"
    folder.mkdir(parents=True, exist_ok=True)
    rows, cols = t["rows"], t["columns"]
    cells = {(c["row"], c["column"]): c for c in t["cells"]}
    written = []
    height = 1.9 * len(rows) + 1
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(2.4 * len(cols) + 1, height), squeeze=False,
                             sharex=True, sharey=True)
    for i, r in enumerate(rows):
        for j, col in enumerate(cols):
            ax = axes[i][j]
            c = cells[(r["id"], col["id"])]
            for run in c["runs"]:
                if run["curve"]:
                    xs, ys = zip(*run["curve"])
                    ax.plot(xs, ys, lw=1, label=f"seed {run['seed']}")
            if c.get("paper") is not None:
                ax.axhline(c["paper"], color="k", ls="--", lw=0.8)
            if not c["runs"]:
                ax.text(0.5, 0.5, "skipped" if c["status"] == "skipped" else "not run", ha="center", va="center",
                        transform=ax.transAxes, fontsize=8, color="gray")
            if i == 0:
                ax.set_title(col["label"], fontsize=9)
            if j == 0:
                ax.set_ylabel(f"{r['label']}\nacc (%)", fontsize=8)
            if i == len(rows) - 1:
                ax.set_xlabel("round", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
    fig.suptitle(f"{t['table']}: accuracy (%) per evaluation, every seed; dashed: the paper", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / height))  # half an inch for the title above the column titles
    path = folder / f"{t['table']}_curves.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    written.append(path)

    stat = t["compare"][0]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(cols) * max(1, len(rows)) / 3 + 2), 3.6))
    width = 0.8 / max(1, len(rows))
    for i, r in enumerate(rows):
        xs, ys, es, ps = [], [], [], []
        for j, col in enumerate(cols):
            c = cells[(r["id"], col["id"])]
            s = c["stats"].get(stat) or {}
            x = j - 0.4 + width * (i + 0.5)
            if s.get("mean") is not None:
                xs.append(x)
                ys.append(s["mean"])
                es.append(s.get("std") or 0.0)
            if c.get("paper") is not None:
                ps.append((x, c["paper"]))
        bars = ax.bar(xs, ys, width, yerr=es, capsize=2, label=r["label"])
        if ps:
            px, py = zip(*ps)
            ax.scatter(px, py, marker="_", s=160, color="k", linewidths=2, zorder=3)
    ax.set_xticks(range(len(cols)))
    ax.set_xticklabels([c["label"] for c in cols], fontsize=8)
    ax.set_ylabel(f"{STAT_LABEL[stat]} accuracy (%)")
    ax.set_title(f"{t['table']}: ours (bars, mean ± std over seeds) and the paper (black —)", fontsize=9)
    ax.legend(fontsize=7, ncol=min(4, len(rows)))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = folder / f"{t['table']}_bars.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    written.append(path)
    return written


def write_report(results: Mapping[str, Any], *, plots: bool = True) -> dict[str, Path]:
    """Write ``report.md``, ``results.json`` and (optionally) the plots into ``results['out']``."""
    out = Path(results["out"])
    out.mkdir(parents=True, exist_ok=True)
    if plots:
        for t in results["tables"]:
            if any(c["runs"] for c in t["cells"]):
                plot_table(t, out)
    paths = {"report": out / "report.md", "results": out / "results.json"}
    paths["report"].write_text(markdown(results))
    paths["results"].write_text(json.dumps(results, indent=2, default=str) + "\n")
    return paths
