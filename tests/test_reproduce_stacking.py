"""fednorm reproduce stacks a cell's seeds (issue 36.2): the stacked suite writes the runs the
one-by-one suite writes (float64), resumes and extends stacked, and says what it stacked."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from fednorm.cli.main import main

TABLE = textwrap.dedent(
    """\
    paper: hbn
    table: tiny
    title: "seeds of a tiny table on the embedded digits"
    source: "tests/test_reproduce_stacking.py"
    claim: "a beats b"
    metric: test_accuracy
    compare: [final]
    seeds: 3
    base:
      dataset: digits
      partition: dirichlet
      alpha: 0.5
      num_clients: 4
      model: simple_cnn
      rounds: 40
      local_steps: 3  # a few steps a round: what is tested is stacking, not learning
      batch_size: 32
      lr: 0.05
      eval_every: 1
      checkpoint_every: 2
      dtype: float64
      seed: 3
    reduced:
      description: "4 rounds"
      set: {rounds: 4}
    rows:
      - {id: a, label: "A", set: {norm: bn}}
      - {id: h, label: "H", set: {norm: hbn, method: hbn, method_args: {preset: paper}}}
      - {id: p, label: "P", set: {norm: bn, executor: sequential}}
    columns:
      - {id: x, label: "alpha 0.5", set: {alpha: 0.5}}
    cells:
      a: {x: 80.0}
      h: {x: 80.0}
      p: {x: 80.0}
    """
)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def configs(tmp_path: Path) -> Path:
    root = tmp_path / "configs"
    (root / "hbn").mkdir(parents=True)
    (root / "hbn" / "tiny.yaml").write_text(TABLE)
    return root


def _suite(configs: Path, out: Path, *extra: str) -> int:
    return main(["reproduce", "hbn", "--configs", str(configs), "--table", "tiny", "--scale", "reduced", "--out", str(out),
                 "--no-plots", "--quiet", *extra])


def _runs(out: Path) -> dict[str, dict]:
    return {f"{p.parent.parent.name}/{p.parent.name}": json.loads(p.read_text()) for p in out.rglob("summary.json")}


def _history(out: Path, run: str) -> list[dict]:
    path = next(out.rglob(f"{run}/metrics.jsonl"))
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _assert_same_runs(a: Path, b: Path) -> None:
    ra, rb = _runs(a), _runs(b)
    assert sorted(ra) == sorted(rb) and len(ra) == 9
    for run in ra:
        assert ra[run]["status"] == rb[run]["status"] == "completed"
        ha, hb = _history(a, run), _history(b, run)
        assert [h["round"] for h in ha] == [h["round"] for h in hb]
        for x, y in zip(ha, hb):
            if "test_accuracy" in x:
                assert x["test_accuracy"] == y["test_accuracy"], (run, x["round"])
                assert x["test_loss"] == pytest.approx(y["test_loss"], rel=1e-10, abs=1e-12), (run, x["round"])


def test_a_cells_seeds_stack_and_equal_the_suite_run_one_by_one(configs: Path, tmp_path: Path, capsys) -> None:
    assert _suite(configs, tmp_path / "stacked") == 0
    said = capsys.readouterr().out
    assert "tiny A | alpha 0.5: seeds 3, 4, 5 stacked into one computation" in said
    assert "tiny H | alpha 0.5: seeds 3, 4, 5 stacked into one computation" in said
    assert "tiny P | alpha 0.5: seeds 3, 4, 5 run one by one (" in said and "executor sequential" in said  # the reason
    record = json.loads(next((tmp_path / "stacked").rglob("a__x/seed3/reproduce.json")).read_text())
    assert record["invocations"][-1]["stacked_with"] == 3 and record["invocations"][-1]["status"] == "completed"
    assert _suite(configs, tmp_path / "alone", "--stack", "off") == 0
    assert "stacked" not in capsys.readouterr().out
    _assert_same_runs(tmp_path / "stacked", tmp_path / "alone")


def test_a_finished_seed_extends_stacked_with_new_ones(configs: Path, tmp_path: Path) -> None:
    """Seed 3 ran 4 rounds alone; asked for 6 rounds and 3 seeds, it extends from its checkpoint
    in the same stacked computation as seeds 4 and 5, which start afresh."""
    out = tmp_path / "grown"
    assert _suite(configs, out, "--rows", "a,h", "--seeds", "1") == 0
    assert _suite(configs, out, "--rows", "a,h", "--rounds", "6") == 0
    record = json.loads(next(out.rglob("h__x/seed3/reproduce.json")).read_text())
    assert [i["action"] for i in record["invocations"]] == ["new", "extend"]
    assert record["invocations"][-1]["stacked_with"] == 3
    whole = tmp_path / "whole"
    assert _suite(configs, whole, "--rows", "a,h", "--rounds", "6", "--stack", "off") == 0
    for run in ("a__x/seed3", "a__x/seed5", "h__x/seed3", "h__x/seed4"):
        grown, ref = _history(out, run), _history(whole, run)
        assert [h["round"] for h in grown] == list(range(1, 7)) == [h["round"] for h in ref]
        assert [h["test_accuracy"] for h in grown] == [h["test_accuracy"] for h in ref], run


def test_stack_cells_trains_a_rows_columns_as_one_computation(tmp_path: Path, capsys) -> None:
    """``--stack cells``: a row's cells that differ in the partition (alpha) join one stacked
    computation with every seed, and write exactly what the suite run one by one writes."""
    x = '  - {id: x, label: "alpha 0.5", set: {alpha: 0.5}}'
    assert x in TABLE
    table = TABLE.replace(x, x + '\n  - {id: y, label: "alpha 5", set: {alpha: 5.0}}')
    table = table.replace("a: {x: 80.0}", "a: {x: 80.0, y: 80.0}").replace("h: {x: 80.0}", "h: {x: 80.0, y: 80.0}")
    root = tmp_path / "configs"
    (root / "hbn").mkdir(parents=True)
    (root / "hbn" / "tiny.yaml").write_text(table)
    assert _suite(root, tmp_path / "wide", "--rows", "a,h", "--seeds", "2", "--stack", "cells") == 0
    said = capsys.readouterr().out
    assert ("tiny H | alpha 0.5 seed 3; tiny H | alpha 5 seed 3; tiny H | alpha 0.5 seed 4; tiny H | alpha 5 seed 4 "
            "stacked into one computation") in said
    record = json.loads(next((tmp_path / "wide").rglob("a__y/seed4/reproduce.json")).read_text())
    assert record["invocations"][-1]["stacked_with"] == 4
    assert _suite(root, tmp_path / "alone", "--rows", "a,h", "--seeds", "2", "--stack", "off") == 0
    wide, alone = _runs(tmp_path / "wide"), _runs(tmp_path / "alone")
    assert sorted(wide) == sorted(alone) and len(wide) == 8
    for run in wide:
        hw, ha = _history(tmp_path / "wide", run), _history(tmp_path / "alone", run)
        assert [h["round"] for h in hw] == [h["round"] for h in ha] == [1, 2, 3, 4]
        assert [h["test_accuracy"] for h in hw] == [h["test_accuracy"] for h in ha], run
        assert [h["test_loss"] for h in hw] == pytest.approx([h["test_loss"] for h in ha], rel=1e-10, abs=1e-12), run
    # the two columns' partitions differ, so a wrong grouping (one partition for all) could not pass
    assert _history(tmp_path / "wide", "a__x/seed3") != _history(tmp_path / "wide", "a__y/seed3")
