"""benchmarks/stuck_rate.py: its Fisher exact test against SciPy's and the issue's own figures,
and its reading of fednorm's records (a run predicting one class is stuck, others are not)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "stuck_rate.py"
_spec = importlib.util.spec_from_file_location("stuck_rate", PATH)
sr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sr)


@pytest.mark.parametrize("table", [(3, 5, 2, 12), (4, 4, 2, 12), (0, 32, 5, 27), (10, 22, 9, 23), (1, 0, 0, 1), (7, 9, 1, 15)])
def test_fisher_exact_equals_scipys(table):
    stats = pytest.importorskip("scipy.stats")
    two, greater = sr.fisher_exact(*table)
    ref = [[table[0], table[1]], [table[2], table[3]]]
    assert two == pytest.approx(stats.fisher_exact(ref, alternative="two-sided").pvalue, rel=1e-9)
    assert greater == pytest.approx(stats.fisher_exact(ref, alternative="greater").pvalue, rel=1e-9)


def test_fisher_exact_gives_the_issues_figures():
    # issue 45: fednorm 3 of 8 stuck at round 40 against the released code's 2 of 14 (one-sided p = 0.23),
    # and 4 of 8 at round 20 (p = 0.10)
    assert round(sr.fisher_exact(3, 5, 2, 12)[1], 2) == 0.23
    assert round(sr.fisher_exact(4, 4, 2, 12)[1], 2) == 0.10


def test_fednorm_records_are_read_as_stuck_when_one_class_takes_the_predictions(tmp_path):
    cell = tmp_path / "bn__phi0.6"
    records = {0: [(20, 0.1, 1.0), (40, 0.1, 1.0)], 1: [(20, 0.1, 1.0), (40, 0.35, 0.2)], 2: [(20, 0.3, 0.25), (40, 0.45, 0.15)]}
    for seed, evals in records.items():
        d = cell / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "test_accuracy": a, "top_class_share": s}) + "\n"
                                                 for r, a, s in evals))
    runs, fallback = sr.fednorm_runs(cell)
    assert not fallback
    at20, at40 = sr.rate(runs, 20), sr.rate(runs, 40)
    assert (at20["stuck"], at20["runs"], at20["stuck_seeds"]) == (2, 3, [0, 1])
    assert (at40["stuck"], at40["stuck_seeds"]) == (1, [0])
    assert at40["trained_mean"] == pytest.approx(40.0)


def _cell(root: Path, records: dict[int, list[tuple[int, float, float]]]) -> Path:
    for seed, evals in records.items():
        d = root / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "test_accuracy": a, "top_class_share": s}) + "\n"
                                                 for r, a, s in evals))
    return root


def test_a_longer_horizon_continues_only_the_runs_still_stuck(tmp_path):
    # 40 rounds for every seed; then only the seeds still stuck at 40 (0 and 1) continued to 100
    short = _cell(tmp_path / "r40", {0: [(20, 0.1, 1.0), (40, 0.1, 1.0)], 1: [(20, 0.1, 1.0), (40, 0.1, 1.0)],
                                     2: [(20, 0.3, 0.3), (40, 0.4, 0.2)], 3: [(20, 0.1, 1.0), (40, 0.3, 0.3)]})
    longer = _cell(tmp_path / "r100", {0: [(20, 0.1, 1.0), (40, 0.1, 1.0), (100, 0.1, 1.0)],
                                       1: [(20, 0.1, 1.0), (40, 0.1, 1.0), (100, 0.5, 0.2)]})
    runs = sr.merge([sr.fednorm_runs(short)[0], sr.fednorm_runs(longer)[0]])
    at100 = sr.rate(runs, 100)
    # seed 0 never left one class; 1 left between 40 and 100; 2 and 3 had left by 40 (carried, not rerun)
    assert (at100["stuck"], at100["runs"], at100["stuck_seeds"], at100["carried"]) == (1, 4, [0], 2)
    assert at100["trained_runs"] == 1 and at100["trained_mean"] == pytest.approx(50.0)
    # without the continuation the state at 100 of seeds 0 and 1 is unknown, so they are not counted
    alone = sr.rate(sr.fednorm_runs(short)[0], 100)
    assert (alone["runs"], alone["stuck"], alone["carried"]) == (2, 0, 2)


def test_a_run_that_falls_back_to_one_class_is_not_a_stuck_start(tmp_path):
    runs = sr.fednorm_runs(_cell(tmp_path / "c", {0: [(20, 0.3, 0.3), (40, 0.1, 1.0)]}))[0]
    at40 = sr.rate(runs, 40)
    assert (at40["stuck"], at40["relapsed_seeds"], at40["trained_runs"]) == (0, [0], 0)


def test_rows_are_tested_against_a_fednorm_row_on_the_seeds_both_have(tmp_path, monkeypatch):
    # BN has seeds 0-3 (0, 1 stuck), GN seeds 0-1 (neither stuck): the test uses seeds 0-1 only
    stuck, trained = [(10, 0.1, 1.0), (20, 0.1, 1.0)], [(10, 0.3, 0.3), (20, 0.4, 0.2)]
    bn = _cell(tmp_path / "bn", {0: stuck, 1: stuck, 2: trained, 3: stuck})
    gn = _cell(tmp_path / "gn", {0: trained, 1: trained})
    out = tmp_path / "rates.json"
    monkeypatch.setattr("sys.argv", ["stuck_rate.py", "--fednorm", f"BN={bn}", "--fednorm", f"GN={gn}",
                                     "--rounds", "20", "--versus", "BN", "--out", str(out)])
    sr.main()
    (test,) = json.loads(out.read_text())["fisher"]["fednorm GN"]
    assert test["seeds"] == 2 and test["stuck"] == [0, 2] and test["versus_stuck"] == [2, 2]
    assert test["p_two_sided"] == pytest.approx(sr.fisher_exact(0, 2, 2, 0)[0])
