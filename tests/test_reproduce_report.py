"""fednorm reproduce's report: the paper's own statistic, "last-10" as the last 10 rounds, and the
settings tables (issue 37 items 2 and 7).

Run directories are written by hand with known accuracy histories, so every figure of the report
is checked against an independent computation from those histories; nothing is trained.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fednorm.config import ExperimentConfig
from fednorm.errors import ConfigError
from fednorm.reproduce import PAPERS, collect, load_paper, plan, runner, write_report
from fednorm.reproduce.report import last_rounds_mean, paper_statistic_value
from fednorm.reproduce.report_markdown import markdown, settings_markdown
from fednorm.reproduce.suite import PAPER_STATS, PaperStatistic, load_table

TABLE = textwrap.dedent(
    """\
    paper: hbn
    table: stat
    title: "A table of known histories"
    source: "tests/test_reproduce_report.py"
    metric: test_accuracy
    compare: [final, last10]
    base:
      dataset: digits
      partition: dirichlet
      alpha: 0.5
      num_clients: 4
      model: simple_cnn
      rounds: 100
      eval_every: 10
      eval_last_rounds: 10
      seed: 3
    reduced:
      description: "the same"
    rows:
      - {id: a, label: "A", set: {norm: bn}}
      - {id: b, label: "B", set: {norm: gn, norm_args: {num_groups: 2}}}
    columns:
      - {id: x, label: "X"}
    cells:
      a: {x: 60.0}
      b: {x: {paper: 50.0, statistic: best}}
    paper_statistic:
      kind: [last_mean, final]
      evaluations: 5
      eval_every: 2
      runs: 5
      source: "a test"
    settings:
      - {setting: "Crop padding", paper: "not stated", code: "black", ours: "mean colour", effect: "not measured",
         source: "spec/000_hbn.md §2.1", option: "none"}
      - {setting: "Rounds", paper: "100", code: "101", ours: "100", effect: "one round", source: "spec/000_hbn.md §1.12"}
    """
)


@pytest.fixture
def configs(tmp_path: Path) -> Path:
    root = tmp_path / "configs"
    (root / "hbn").mkdir(parents=True)
    (root / "hbn" / "stat.yaml").write_text(TABLE)
    return root


def _write_run(spec: runner.RunSpec, seed: int, history: dict[int, float], *, rounds: int, eval_every: int,
               eval_last_rounds: int) -> None:
    """A finished run directory as the engine writes it, evaluated at the rounds of ``history``.
    Its config.yaml keeps the evaluation fields it ran with (which may differ from the plan's)."""
    d = spec.dir.parent / f"seed{seed}"
    d.mkdir(parents=True)
    cfg = ExperimentConfig(**{**spec.config, "seed": seed, "out": str(d), "rounds": rounds, "eval_every": eval_every,
                              "eval_last_rounds": eval_last_rounds})
    (d / "config.yaml").write_text(cfg.to_yaml())
    lines = [{"round": r, "train_loss": 1.0} | ({"test_accuracy": history[r]} if r in history else {}) for r in range(1, rounds + 1)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (d / "summary.json").write_text(json.dumps({"status": "completed", "rounds": rounds, "seed": seed, "wall_seconds": 1.0}))


def _history(rng: np.random.Generator, rounds: int, eval_every: int, eval_last_rounds: int) -> dict[int, float]:
    """The engine's cadence: every ``eval_every`` rounds, the last round, and each of the last ``eval_last_rounds``."""
    due = [r for r in range(1, rounds + 1) if r % eval_every == 0 or r == rounds or r > rounds - eval_last_rounds]
    return {r: float(rng.uniform(0.1, 0.9)) for r in due}


# -- "last-10": the last 10 rounds, whatever the cadence ---------------------------------------


def test_last10_is_the_mean_over_rounds_R_minus_9_to_R() -> None:
    rng = np.random.default_rng(0)
    hist = _history(rng, 100, 10, 10)
    curve = [(r, 100 * v) for r, v in sorted(hist.items())]
    expected = np.mean([100 * hist[r] for r in range(91, 101)])
    assert last_rounds_mean(curve, 100) == pytest.approx(expected, rel=1e-12)
    # evaluated every 10th round only: its last 10 *evaluations* span rounds 10..100, not the last 10 rounds
    sparse = [(r, v) for r, v in curve if r % 10 == 0]
    assert last_rounds_mean(sparse, 100) is None
    # a run that ended at round 99: its last 10 rounds are 90..99 (round 90 from the every-10th cadence)
    assert last_rounds_mean(curve[:-1], 99) == pytest.approx(np.mean([100 * hist[r] for r in range(90, 100)]), rel=1e-12)
    short = [(r, float(r)) for r in range(1, 6)]  # a 5-round run: its last 10 rounds are rounds 1..5
    assert last_rounds_mean(short, 5) == pytest.approx(3.0)


def test_report_last10_uses_only_the_last_10_rounds_and_says_when_it_cannot(configs: Path, tmp_path: Path) -> None:
    (table,) = load_paper("hbn", ["stat"], configs)
    out = tmp_path / "out"
    specs = {c: s for s in plan([table], scale="full", out=out) for c in s.cells}
    rng = np.random.default_rng(1)
    full = [_history(rng, 100, 10, 10) for _ in range(2)]
    for seed, hist in zip((3, 4), full):
        _write_run(specs[("a", "x")], seed, hist, rounds=100, eval_every=10, eval_last_rounds=10)
    sparse = _history(rng, 100, 10, 0)  # an older run: no evaluation of rounds 91..99
    _write_run(specs[("b", "x")], 3, sparse, rounds=100, eval_every=10, eval_last_rounds=0)

    results = collect([table], scale="full", out=out)
    cells = {(c["row"], c["column"]): c for c in results["tables"][0]["cells"]}
    # both run directories are read although the table now plans other evaluation fields
    assert not cells[("a", "x")]["stale"] and not cells[("b", "x")]["stale"]
    per_seed = [np.mean([100 * h[r] for r in range(91, 101)]) for h in full]
    last10 = cells[("a", "x")]["stats"]["last10"]
    assert last10["mean"] == pytest.approx(np.mean(per_seed)) and last10["std"] == pytest.approx(np.std(per_seed, ddof=1))
    assert cells[("a", "x")]["diff"]["last10"] == pytest.approx(np.mean(per_seed) - 60.0)
    b = cells[("b", "x")]["stats"]["last10"]
    assert b["mean"] is None and b["na"] == "evaluated every 10 rounds"
    assert cells[("b", "x")]["diff"]["last10"] is None
    text = markdown(results)
    assert "| B | X | " in text and "| n/a |" in text and "evaluated every 10 rounds" in text


# -- the paper's statistic ---------------------------------------------------------------------


def _independent(hist: dict[int, float], kind: str, final_round: int) -> float | None:
    """The paper's statistic straight from the history (evaluations 5, every 2 rounds; in %)."""
    if kind == "final":
        return 100 * hist[final_round]
    if kind == "best":
        return 100 * max(hist.values())
    rounds = [final_round - 2 * i for i in range(5)]
    return 100 * float(np.mean([hist[r] for r in rounds])) if all(r in hist for r in rounds) else None


def test_paper_statistic_from_known_histories_equals_an_independent_computation(configs: Path, tmp_path: Path) -> None:
    (table,) = load_paper("hbn", ["stat"], configs)
    assert table.cell_statistics("a", "x") == ("last_mean", "final") and table.cell_statistics("b", "x") == ("best",)
    out = tmp_path / "out"
    specs = {c: s for s in plan([table], scale="full", out=out) for c in s.cells}
    rng = np.random.default_rng(2)
    # cell a: evaluated every round from 60 on, so rounds 92, 94, ..., 100 exist; cell b: every 10th round and the last 10
    hist_a = [{r: float(rng.uniform(0.2, 0.8)) for r in range(60, 101)} for _ in range(3)]
    hist_b = [_history(rng, 100, 10, 10) for _ in range(2)]
    for seed, h in zip((3, 4, 5), hist_a):
        _write_run(specs[("a", "x")], seed, h, rounds=100, eval_every=1, eval_last_rounds=0)
    for seed, h in zip((3, 4), hist_b):
        _write_run(specs[("b", "x")], seed, h, rounds=100, eval_every=10, eval_last_rounds=10)
    results = collect([table], scale="full", out=out)
    cells = {(c["row"], c["column"]): c for c in results["tables"][0]["cells"]}

    for cell, hists, paper in ((("a", "x"), hist_a, 60.0), (("b", "x"), hist_b, 50.0)):
        for got in cells[cell]["paper_statistic"]:
            values = [_independent(h, got["kind"], 100) for h in hists]
            assert got["mean"] == pytest.approx(np.mean(values), rel=1e-12)
            assert got["std"] == pytest.approx(np.std(values, ddof=1), rel=1e-12)
            assert got["n"] == len(hists) and got["diff"] == pytest.approx(np.mean(values) - paper)
    a_stats = {p["kind"]: p for p in cells[("a", "x")]["paper_statistic"]}
    assert a_stats["last_mean"]["exact"] and a_stats["final"]["exact"]
    # the paper's best is over every 2nd round; b evaluated every 10th round before its last 10: a lower bound, said so
    (b_best,) = cells[("b", "x")]["paper_statistic"]
    assert not b_best["exact"] and "lower bound" in b_best["why"][0]
    assert results["tables"][0]["paper_statistic"]["kinds"] == ["last_mean", "final"]

    text = markdown(results)
    assert "**The paper's statistic:** not stated; one of the mean of the last 5 evaluations" in text
    assert "mean over 5 runs" in text and "| 3 (5) |" in text and "| 2 (5) |" in text
    a_final = cells[("a", "x")]["stats"]["final"]
    assert f"{a_final['mean']:.2f} ± {a_final['std']:.2f} ({a_final['mean'] - 60:+.2f})" in text


def test_a_statistic_the_recorded_evaluations_cannot_give_is_na_with_the_reason() -> None:
    stat = PaperStatistic(kinds=("last_mean",), source="s", evaluations=10, eval_every=1)
    curve = [(r, float(r)) for r in range(10, 501, 10)]  # every 10th round
    value, why = paper_statistic_value(curve, 500, "last_mean", stat, "every 10 rounds")
    assert value is None and "rounds 491–500" in why and "every 10 rounds" in why
    curve += [(r, float(r)) for r in range(491, 500)]
    value, why = paper_statistic_value(sorted(curve), 500, "last_mean", stat)
    assert value == pytest.approx(np.mean(np.arange(491, 501))) and why is None
    value, why = paper_statistic_value(curve[:3], 500, "final", stat)
    assert value is None and "round 500" in why


# -- the settings table -------------------------------------------------------------------------


def test_settings_shared_by_two_tables_appear_once(configs: Path, tmp_path: Path) -> None:
    other = TABLE.replace("table: stat", "table: other").replace(
        '  - {setting: "Rounds", paper: "100", code: "101", ours: "100", effect: "one round", source: "spec/000_hbn.md §1.12"}\n', "")
    (configs / "hbn" / "other.yaml").write_text(other)
    results = collect(load_paper("hbn", None, configs), scale="full", out=tmp_path / "out")
    lines = settings_markdown(results)
    rows = [line for line in lines if line.startswith(("| Crop padding", "| Rounds"))]
    assert len(rows) == 2
    crop, rounds = sorted(rows)
    assert crop.endswith("| none | all | spec/000_hbn.md §2.1 |")
    assert rounds.endswith("| — | stat | spec/000_hbn.md §1.12 |")
    paths = write_report(results, plots=False)
    assert "## Settings where our runs differ from the paper" in paths["report"].read_text()
    assert json.loads(paths["results"].read_text())["tables"][1]["settings"][1]["code"] == "101"


# -- invalid entries: one line naming the file ---------------------------------------------------


BAD = {
    "unknown kind": ("paper_statistic:\n  kind: median\n  source: s\n", "paper_statistic.kind"),
    "best without cadence": ("paper_statistic:\n  kind: best\n  source: s\n", "eval_every"),
    "last_mean without evaluations": ("paper_statistic:\n  kind: last_mean\n  eval_every: 1\n  source: s\n", "evaluations"),
    "evaluations without last_mean": ("paper_statistic:\n  kind: final\n  evaluations: 3\n  source: s\n", "evaluations"),
    "no source": ("paper_statistic:\n  kind: final\n", "paper_statistic.source"),
    "runs not positive": ("paper_statistic:\n  kind: final\n  runs: 0\n  source: s\n", "paper_statistic.runs"),
    "unknown key": ("paper_statistic:\n  kind: final\n  source: s\n  over: clients\n", "unknown keys ['over']"),
    "settings not a list": ("settings: {setting: a}\n", "settings must be a list"),
    "setting misses a field": ("settings:\n  - {setting: a, paper: b, code: c, ours: d, effect: e}\n", "misses ['source']"),
    "setting unknown field": ("settings:\n  - {setting: a, paper: b, code: c, ours: d, effect: e, source: f, why: g}\n",
                              "unknown keys ['why']"),
    "setting empty text": ("settings:\n  - {setting: a, paper: '', code: c, ours: d, effect: e, source: f}\n", "settings[0].paper"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_invalid_paper_statistic_or_settings_is_one_line_naming_the_file(case: str, tmp_path: Path) -> None:
    snippet, expected = BAD[case]
    body = TABLE[: TABLE.index("paper_statistic:")].replace(", statistic: best", "") + snippet
    path = tmp_path / "hbn" / "stat.yaml"
    path.parent.mkdir()
    path.write_text(body)
    with pytest.raises(ConfigError) as info:
        load_table(path)
    message = str(info.value)
    assert str(path) in message and expected in message and "\n" not in message


@pytest.mark.parametrize("cell, expected", [
    ("{paper: 50.0, statistic: median}", "cells.b.x.statistic must be one of"),
    ("{paper: 50.0, statistic: best}", "cells.b.x.statistic needs the table's paper_statistic"),
])
def test_an_invalid_cell_statistic_is_one_line_naming_the_file(cell: str, expected: str, tmp_path: Path) -> None:
    body = TABLE[: TABLE.index("paper_statistic:")].replace("{paper: 50.0, statistic: best}", cell)
    path = tmp_path / "hbn" / "stat.yaml"
    path.parent.mkdir()
    path.write_text(body)
    with pytest.raises(ConfigError) as info:
        load_table(path)
    assert str(path) in str(info.value) and expected in str(info.value) and "\n" not in str(info.value)


# -- the shipped tables ---------------------------------------------------------------------------


@pytest.mark.parametrize("paper", PAPERS)
def test_every_shipped_table_states_its_statistic_and_its_setting_differences(paper: str) -> None:
    for table in load_paper(paper):
        stat = table.paper_statistic
        assert stat is not None and stat.source and set(stat.kinds) <= set(PAPER_STATS), table.path
        for row in table.rows:
            for column in table.columns:
                assert table.cell_statistics(row.id, column.id), (table.path, row.id, column.id)
        assert table.settings, table.path
        for entry in table.settings:
            assert "spec/" in entry.source or "shared/data" in entry.source, (table.path, entry.setting)
        # the CIFAR-10 tables say their test set is the JPEG copy
        if table.base.get("dataset") == "cifar10":
            assert any("cifar10_test_jpeg" in e.ours for e in table.settings), table.path


REPRODUCTION = Path(__file__).resolve().parents[1] / "reproduction"


@pytest.mark.parametrize("paper", PAPERS)
def test_committed_run_directories_are_read_with_the_current_configs(paper: str, tmp_path: Path) -> None:
    """The committed runs were planned before the tables asked for more evaluations: they must still
    be read (evaluation fields are not part of a run's identity), never reported as an older config."""
    folder = REPRODUCTION / paper
    if not folder.is_dir():
        pytest.skip(f"no committed runs at {folder}")
    results = collect(load_paper(paper), scale="full", out=folder)
    stale = [s for t in results["tables"] for c in t["cells"] for s in c["stale"]]
    assert not stale, stale[:2]
    assert any(c["runs"] for t in results["tables"] for c in t["cells"])


def test_welch_interval_against_an_independent_computation() -> None:
    """Welch's interval of the report equals the textbook formula computed here with numpy and
    scipy's t quantile; the verdict follows the interval."""
    import numpy as np
    from scipy import stats as st

    from fednorm.reproduce.report import welch

    a, b = [74.77, 74.45, 73.99], [74.13, 45.02, 73.84]
    x, y = np.array(a), np.array(b)
    va, vb = x.var(ddof=1) / 3, y.var(ddof=1) / 3
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 2)
    half = st.t.ppf(0.975, df) * np.sqrt(va + vb)
    got = welch(a, b)
    assert got["diff"] == pytest.approx(x.mean() - y.mean(), abs=1e-12)
    assert got["low"] == pytest.approx(x.mean() - y.mean() - half, abs=1e-9)
    assert got["high"] == pytest.approx(x.mean() - y.mean() + half, abs=1e-9)
    assert got["verdict"] == "not distinguishable" and got["n"] == [3, 3]
    # scipy's own Welch test agrees: the interval excludes 0 exactly when p < 0.05
    assert (got["low"] > 0 or got["high"] < 0) == (st.ttest_ind(x, y, equal_var=False).pvalue < 0.05)
    far = welch([80.0, 81.0, 80.5], [70.0, 70.4, 69.8])
    assert far["verdict"] == "ahead" and far["low"] > 0
    assert welch([80.0, 81.0], [70.0]) is None  # one seed: no interval


def test_paired_interval_against_scipy_and_used_where_rows_share_seeds(configs: Path, tmp_path: Path) -> None:
    """The ordering's interval is paired by seed where both rows ran two or more common seeds (a seed's
    rows share its partition and client sampling): equal to scipy's paired t interval; Welch's where not."""
    from scipy import stats as st

    from fednorm.reproduce.report import paired

    a, b = {1: 74.77, 2: 74.45, 3: 73.99, 4: 70.0}, {1: 74.13, 2: 73.02, 3: 73.84, 5: 10.0}
    got = paired(a, b)
    d = np.array([a[s] - b[s] for s in (1, 2, 3)])
    ci = st.ttest_rel([a[s] for s in (1, 2, 3)], [b[s] for s in (1, 2, 3)]).confidence_interval(0.95)
    assert got["seeds"] == [1, 2, 3] and got["diff"] == pytest.approx(d.mean(), abs=1e-12)
    assert (got["low"], got["high"]) == pytest.approx((ci.low, ci.high), abs=1e-9)
    assert got["verdict"] == ("ahead" if ci.low > 0 else "behind" if ci.high < 0 else "not distinguishable")
    assert paired({1: 1.0, 2: 2.0}, {2: 1.0, 3: 0.0}) is None  # one common seed

    # in a report: rows a and b both ran seeds 3 and 4 -> paired; a shift shared by a seed's rows cancels
    (table,) = load_paper("hbn", ["stat"], configs)
    out = tmp_path / "out"
    specs = {c: s for s in plan([table], scale="full", out=out) for c in s.cells}
    for seed, level in ((3, 0.2), (4, 0.6)):  # the seed moves both rows by the same amount
        for cell, gap in ((("a", "x"), 0.05), (("b", "x"), 0.0)):
            hist = {r: level + gap + 0.001 * seed for r in range(1, 101)}
            _write_run(specs[cell], seed, hist, rounds=100, eval_every=1, eval_last_rounds=10)
    (test,) = collect([table], scale="full", out=out)["tables"][0]["ordering"]["x"]["tests"]
    assert test["test"] == "paired" and test["diff"] == pytest.approx(5.0) and test["verdict"] == "ahead"
    # Welch's interval over the same values cannot exclude 0: the seeds spread the rows by 40 points
    from fednorm.reproduce.report import welch

    assert welch([25.3, 65.4], [20.3, 60.4])["verdict"] == "not distinguishable"


def test_a_stuck_run_is_counted_apart_and_the_trained_runs_summarised_alone(configs: Path, tmp_path: Path) -> None:
    """A run whose final evaluation puts >= 99% of its predictions in one class is counted as stuck;
    the cell reports k of n seeds and the statistics of the other runs, from independent arithmetic."""
    from fednorm.reproduce.report import stuck_curve

    (table,) = load_paper("hbn", ["stat"], configs)
    out = tmp_path / "out"
    specs = {c: s for s in plan([table], scale="full", out=out) for c in s.cells}
    spec = specs[("a", "x")]
    finals = {3: 0.1, 4: 0.70, 5: 0.74}
    for seed, final in finals.items():
        hist = {r: (0.1 if seed == 3 else 0.5 + 0.002 * r) for r in range(1, 101)}
        hist[100] = final
        _write_run(spec, seed, hist, rounds=100, eval_every=1, eval_last_rounds=10)
        path = spec.dir.parent / f"seed{seed}" / "metrics.jsonl"
        recs = [json.loads(x) for x in path.read_text().splitlines()]
        for rec in recs:  # the engine's record of how concentrated the predictions were
            rec["top_class_share"] = 1.0 if seed == 3 else (0.995 if rec["round"] == 50 else 0.3)
        path.write_text("".join(json.dumps(x) + "\n" for x in recs))
    cell = {(c["row"], c["column"]): c for c in collect([table], scale="full", out=out)["tables"][0]["cells"]}[("a", "x")]
    assert cell["stuck"]["final"] == 1 and cell["stuck"]["n"] == 3 and cell["stuck"]["seeds"] == [3]
    trained = cell["stuck"]["trained"]["final"]
    assert trained["mean"] == pytest.approx(72.0) and trained["std"] == pytest.approx(np.std([70, 74], ddof=1))
    runs = {r["seed"]: r for r in cell["runs"]}
    assert runs[4]["stuck_rounds"] == [50] and runs[4]["stuck_final"] is False and len(runs[3]["stuck_rounds"]) == 100
    text = markdown(collect([table], scale="full", out=out))
    assert "**Runs stuck at one class**" in text and "1 of 3 seeds (3)" in text
    # records older than top_class_share: exactly 1/10 on CIFAR-10's balanced test set is one class predicted
    old = [{"round": 10, "test_accuracy": 0.1}, {"round": 20, "test_accuracy": 0.1001}, {"round": 30}]
    assert stuck_curve(old, "cifar10") == [(10, True), (20, False)]
    assert stuck_curve(old, "mnist") == []  # its test classes are not equally frequent: unknown


def test_runs_that_span_commits_or_a_dirty_tree_are_labelled(configs: Path, tmp_path: Path) -> None:
    (table,) = load_paper("hbn", ["stat"], configs)
    out = tmp_path / "out"
    specs = {c: s for s in plan([table], scale="full", out=out) for c in s.cells}
    for seed, commits in ((3, [("a" * 40, False)]), (4, [("b" * 40, False), ("c" * 40, True)])):
        _write_run(specs[("a", "x")], seed, {100: 0.5}, rounds=100, eval_every=100, eval_last_rounds=0)
        record = {"invocations": [{"commit": c, "dirty": dirty, "diff_sha256": "f" * 64 if dirty else None}
                                  for c, dirty in commits]}
        (specs[("a", "x")].dir.parent / f"seed{seed}" / runner.RECORD_NAME).write_text(json.dumps(record))
    text = markdown(collect([table], scale="full", out=out))
    line = next(x for x in text.splitlines() if x.startswith("**Runs not from one clean commit**"))
    assert "seed 4 (bbbbbbbbbb, cccccccccc+dirty:ffffffff)" in line and "seed 3" not in line


def test_a_client_source_column_reads_a_pooled_runs_domain_accuracies() -> None:
    """``client:<source>`` is the client holding that source, or, in a run whose one client pools
    every source (FedBN Table 12's centralized run: no client_sources), the model's accuracy on
    that source's test samples (its evaluations' domain_accuracies)."""
    from fednorm.reproduce.report import series

    per_client = [{"round": 1, "client_accuracies": [0.5, 0.75], "domain_accuracies": {"mnist": 0.5, "usps": 0.75}}]
    assert series(per_client, "client:usps", ["mnist", "usps"]) == [(1, 75.0)]
    pooled = [{"round": 1, "client_accuracies": [0.6], "domain_accuracies": {"mnist": 0.5, "usps": 0.7}},
              {"round": 2, "client_accuracies": [0.7], "domain_accuracies": {"mnist": 0.625, "usps": 0.75}}]
    assert series(pooled, "client:mnist", None) == [(1, 50.0), (2, 62.5)]
    with pytest.raises(ConfigError, match="no client with source 'svhn'"):
        series(pooled, "client:svhn", None)
