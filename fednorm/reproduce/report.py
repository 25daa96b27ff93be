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
"best-val" is the accuracy at the round of the best mean validation accuracy (``val_accuracy``,
the first of equal ones: FedBN's model selection), n/a for a run without a validation split.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import yaml_io
from ..config import load_config
from ..errors import ConfigError
from .runner import RECORD_NAME, RunSpec, config_differences, data_missing_file, git_info, plan
from ..engine.last_rounds import last_rounds_mean  # one meaning of last-10 everywhere (issue 50)
from ..engine.validation import best_index, client_selection  # the selection summary.json records
from ..evaluation.unseen import read_unseen  # unseen:<name> columns: clients that never trained (FedBN App. G)
from .report_markdown import markdown
from .report_plots import plot_table
from .suite import STATS, PaperStatistic, Table

__all__ = ["run_metrics", "series", "unseen_series", "summarize", "welch", "paired", "stuck_curve", "STUCK_SHARE", "last_rounds_mean", "best_validation_value", "paper_statistic_value", "ordering", "collect",
           "write_report"]

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
    per-domain accuracy), found through the run's ``client_sources``; in a run whose clients do
    not hold one source each (FedBN's centralized run, one client pooling every source), the
    model's accuracy on that source's test samples (the evaluations' ``domain_accuracies``).
    """
    out = []
    index = None
    pooled = None
    if metric.startswith("client:"):
        name = metric.split(":", 1)[1]
        if not sources and any(name in (rec.get("domain_accuracies") or {}) for rec in history):
            pooled = name
        elif not sources or name not in sources:
            raise ConfigError(f"metric {metric}: the run has no client with source '{name}' (sources: {sources})")
        else:
            index = list(sources).index(name)
    for rec in history:
        if pooled is not None:
            value = (rec.get("domain_accuracies") or {}).get(pooled)
        else:
            value = rec.get(metric) if index is None else (rec.get("client_accuracies") or [None] * (index + 1))[index]
        if value is not None and isinstance(value, (int, float)) and math.isfinite(value):
            out.append((int(rec.get("round", len(out) + 1)), 100.0 * float(value)))
    return out


def unseen_series(run_dir: Path, metric: str) -> list[tuple[int, float]]:
    """``unseen:<name>``: ``[(round, accuracy in %)]`` of the run's ``unseen.json`` entry (the
    accuracy of a client that never trained, scored once the run finished), or ``[]``."""
    entry = read_unseen(run_dir).get(metric.split(":", 1)[1]) or {}
    value = entry.get("accuracy")
    if not isinstance(value, (int, float)) or not math.isfinite(value) or entry.get("round") is None:
        return []
    return [(int(entry["round"]), 100.0 * float(value))]


STUCK_SHARE = 0.99
"""A run is *stuck* at an evaluation when at least this share of its test predictions fall in one
class (``top_class_share``): FedAvg+BN's start at HBN Table 1's setting (REPRODUCTION.md §1)."""

# Test sets with exactly equal class counts: a model that predicts one class scores exactly 1/C
# there. Used only for evaluations recorded before ``top_class_share`` was (64ca95c).
_BALANCED_TEST_CLASSES = {"cifar10": 10}


def stuck_curve(history: Sequence[Mapping[str, Any]], dataset: str | None) -> list[tuple[int, bool]]:
    """``(round, stuck)`` at each evaluation of the global model whose state is known.

    Stuck: ``top_class_share >= STUCK_SHARE``. An older record without that field counts as stuck
    when its test accuracy is exactly 1/C on a test set of C equally frequent classes (CIFAR-10's:
    one class predicted gives 10.00%), and is left out elsewhere."""
    classes = _BALANCED_TEST_CLASSES.get(str(dataset))
    out = []
    for rec in history:
        share, acc = rec.get("top_class_share"), rec.get("test_accuracy")
        if isinstance(share, (int, float)) and math.isfinite(share):
            out.append((int(rec["round"]), share >= STUCK_SHARE))
        elif classes and isinstance(acc, (int, float)) and math.isfinite(acc):
            out.append((int(rec["round"]), abs(acc * classes - 1.0) < 1e-9))
    return out


def _saved_config(run_dir: Path) -> dict[str, Any]:
    """A run directory's ``config.yaml`` (written before its first round) as a mapping, or {}."""
    import yaml

    try:
        saved = yaml_io.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return saved if isinstance(saved, dict) else {}


def _cadence(eval_every: Any, eval_last: Any) -> str:
    if not eval_every:
        return "at the rounds in metrics.jsonl"
    text = "every round" if int(eval_every) == 1 else f"every {int(eval_every)} rounds"
    return text + (f" and each of the last {int(eval_last)}" if eval_last and int(eval_every) > 1 else "")


def best_validation_value(curve: Sequence[tuple[int, float]], selection: Sequence[tuple[int, float]] | None
                          ) -> tuple[float | None, int | None]:
    """The value of ``curve`` at the round ``selection`` (the run's ``(round, val_accuracy)``) is
    largest at, the first of equal ones, and that round; ``(None, round)`` when ``curve`` has no
    value there, ``(None, None)`` without a selection curve."""
    if not selection:
        return None, None
    chosen = selection[best_index([v for _, v in selection])][0]  # type: ignore[index]
    return dict(curve).get(chosen), chosen


def paper_statistic_value(curve: Sequence[tuple[int, float]], final_round: int, kind: str, stat: PaperStatistic,
                          cadence: str = "at its own cadence", selection: Sequence[tuple[int, float]] | None = None,
                          ) -> tuple[float | None, str | None]:
    """One run's figure computed as the paper's statistic ``kind``: ``(value, None)`` when the run
    recorded what that needs, else ``(value or None, why ours differs)``.

    ``final``: the accuracy at ``final_round``. ``best``: the maximum over the evaluations; the
    paper's is over every ``eval_every``-th round, so a run evaluated more sparsely gives a lower
    bound of it. ``last_mean``: the mean over the evaluations at rounds ``R − i·eval_every``,
    i < ``evaluations`` (the paper's last evaluations); None unless every one of them was evaluated.
    ``best_val``: the accuracy at the round of the best validation accuracy (``selection``, the
    run's ``(round, val_accuracy)``); None without a validation split; selected among fewer rounds
    than the paper's when the run validated more sparsely (neither bound of the paper's).
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
    if kind == "best_val":
        value, chosen = best_validation_value(curve, selection)
        if chosen is None:
            return None, "n/a: the run held out no validation split (validation_fraction: 0)"
        if value is None:
            return None, f"n/a: no evaluation of this metric at round {chosen}, the best validation round"
        needed = range(every, final_round + 1, every)
        validated = {r for r, _ in selection or ()}
        if all(r in validated for r in needed):
            return value, None
        paper = "every round" if every == 1 else f"every {every} rounds"
        return value, (f"selected over our {len(validated)} validations ({cadence}) where the paper's run validates "
                       f"{paper}")
    if kind == "last_mean":
        n = int(stat.evaluations or 1)
        needed = [final_round - i * every for i in range(n) if final_round - i * every >= 1]
        if all(r in at for r in needed):
            return statistics.fmean(at[r] for r in needed), None
        return None, (f"n/a: the paper's last {n} evaluations are rounds {needed[-1]}–{final_round}"
                      f"{'' if every == 1 else f' every {every}'}; ours evaluated {cadence}")
    raise ConfigError(f"unknown paper statistic '{kind}'")


def _client_selected(history: Sequence[Mapping[str, Any]], metric: str, sources: Sequence[str] | None
                     ) -> tuple[float | None, str | None]:
    """``metric`` (in %) with each client selected at its own best validation round
    (:func:`fednorm.engine.validation.client_selection`): a ``client:<source>`` column that client's
    test accuracy there, ``mean_client_accuracy`` the unweighted mean over the clients; with why not."""
    chosen = client_selection(history)
    if not chosen:
        return None, "n/a: the run held out no validation split (validation_fraction: 0)"
    if metric.startswith("client:"):
        name = metric.split(":", 1)[1]
        if not sources or name not in sources:
            return None, f"n/a: no client holds source '{name}'"
        picked = [chosen[list(sources).index(name)][1]]
    elif metric == "mean_client_accuracy":
        picked = [t for _, t in chosen]
    else:
        return None, f"n/a: {metric} is not a per-client accuracy"
    if any(t is None for t in picked):
        return None, "n/a: a client without a validation split or a test evaluation at its selected round"
    return 100.0 * statistics.fmean(picked), None


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
    curve = (unseen_series(run_dir, metric) if metric.startswith("unseen:")
             else series(history, metric, summary.get("client_sources")))
    values = [v for _, v in curve]
    last = (record.get("invocations") or [{}])[-1]
    final_round = int(summary["rounds"]) if summary.get("rounds") else (curve[-1][0] if curve else 0)
    cadence = _cadence(saved.get("eval_every"), saved.get("eval_last_rounds"))
    last10 = last_rounds_mean(curve, final_round) if curve else None
    val_curve = series(history, "val_accuracy", None)  # empty without a validation split
    best_val, best_val_round = best_validation_value(curve, val_curve)
    best_val_client, best_val_client_na = _client_selected(history, metric, summary.get("client_sources"))
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
        "best_val": best_val,
        "best_val_round": best_val_round,
        "best_val_na": None if best_val is not None or not curve else (
            "without a validation split (validation_fraction: 0)" if not val_curve
            else f"not evaluated at round {best_val_round}, the best validation round"),
        "val_curve": val_curve,
        "best_val_client": best_val_client,
        "best_val_client_na": best_val_client_na,
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
        # rounds at which the run resumed from an exported DSGD checkpoint holding the clients' mean
        # momentum (export.py); an entry at the run's current round is the checkpoint now exported
        "mean_momentum_resumes": sorted(int(e["round"]) for e in record.get("compacted_checkpoints") or []
                                        if int(e.get("round", 0)) < int(summary.get("rounds") or 0)),
        "error": summary.get("error"),
    }
    evaluations = _read_json(run_dir / "evaluation.json") or {}  # fednorm evaluate: other test sets
    out["extra_tests"] = {name: {"accuracy": 100.0 * float(e["accuracy"]), "n": int(e["n"]),
                                 "interval95": [100.0 * float(v) for v in e["interval95"]]}
                          for name, e in evaluations.items()
                          if metric == "test_accuracy" and e.get("round") == summary.get("rounds")}
    stuck = stuck_curve(history, saved.get("dataset") or summary.get("dataset"))
    out["stuck_rounds"] = [r for r, s in stuck if s]
    out["stuck_final"] = dict(stuck).get(final_round) if stuck else None
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


def paired(a: Mapping[Any, float], b: Mapping[Any, float], level: float = 0.95) -> dict[str, Any] | None:
    """The paired-t interval for mean(a − b) over the seeds both rows ran (``{seed: value}``).

    The rows of one seed share its partition and client sampling, so pairing by seed removes
    that part of the spread; None with fewer than two common seeds. ``verdict`` as :func:`welch`."""
    from scipy.stats import t as student_t

    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return None
    d = [float(a[s]) - float(b[s]) for s in seeds]
    diff, se = statistics.fmean(d), statistics.stdev(d) / len(d) ** 0.5
    half = float(student_t.ppf(0.5 + level / 2, len(d) - 1)) * se
    low, high = diff - half, diff + half
    verdict = "ahead" if low > 0 else "behind" if high < 0 else "not distinguishable"
    return {"diff": diff, "low": low, "high": high, "df": len(d) - 1, "n": [len(d), len(d)], "seeds": seeds,
            "test": "paired", "verdict": verdict}


def ordering(cells: Sequence[Mapping[str, Any]], stat: str) -> dict[str, Any]:
    """Whether our ranking of the rows agrees with the paper's, pair by pair, in one column, and
    for each pair the 95% interval of our difference over the seeds: paired by seed
    (:func:`paired`) where the two rows share at least two seeds, else Welch's (:func:`welch`).

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
            by_seed = [{r["seed"]: r[stat] for r in c["runs"] if r.get("status") == "completed" and r.get(stat) is not None}
                       for c in (hi, lo)]
            # paired by seed where both rows ran at least two common seeds; Welch's otherwise
            test = paired(*by_seed) or welch(*(list(x.values()) for x in by_seed))
            if test is not None:
                test.setdefault("test", "welch")
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
    known = [r for r in done if r.get("stuck_final") is not None]
    if any(r["stuck_final"] for r in known):
        # a two-way outcome: the share of seeds still at one class, and the runs that trained apart
        trained = [r for r in known if not r["stuck_final"]]
        res["stuck"] = {"final": len(known) - len(trained), "n": len(known),
                        "seeds": [r["seed"] for r in known if r["stuck_final"]],
                        "trained": {stat: summarize([r[stat] for r in trained]) for stat in STATS}}
    unevaluated = [r for r in done if r["last10"] is None]
    if unevaluated:  # a mean over some seeds only would not be the cell's
        res["stats"]["last10"] = {"mean": None, "std": None, "n": 0, "na": unevaluated[0]["last10_na"]}
    unvalidated = [r for r in done if r.get("best_val") is None]
    if unvalidated:  # likewise: best-val over some seeds only would not be the cell's
        res["stats"]["best_val"] = {"mean": None, "std": None, "n": 0, "na": unvalidated[0].get("best_val_na")}
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
    # reproduce.json times the invocations it saw end and those the next one closed; a record from before
    # killed entries were closed lacks them, while the engine's clock (summary.json) kept counting: take the larger.
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
            if kind == "best_val_client":  # per-client selection: read from the whole record (run_metrics)
                value, note = r.get("best_val_client"), r.get("best_val_client_na")
                values.append(value)
                if note and note not in why:
                    why.append(note)
                continue
            value, note = paper_statistic_value(r["curve"], int(r["final_round"]), kind, stat, r.get("cadence") or "",
                                                selection=r.get("val_curve"))
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
