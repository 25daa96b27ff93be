"""docs/performance.md's generated tables equal what benchmarks/tables.py renders from the
committed results: a re-measured JSON committed without ``python benchmarks/tables.py --write``
fails here, and so does a table edited by hand.

The paired ratios the executors and stacked-runs tables print are also recomputed from each JSON
file's raw per-repeat records (samples over wall seconds, repeat by repeat, then the median), so
the page's ratios are the measurements' and not a ratio of medians.
"""

from __future__ import annotations

import importlib
import json
import shutil
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's benchmarks package, not opacus's of the same name
tables = importlib.import_module("benchmarks.tables")
PAGE = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
RESULTS = ROOT / "benchmarks" / "results"


@pytest.mark.parametrize("name", list(tables.TABLES))
def test_page_table_equals_the_rendered_results(name):
    found = tables.blocks(PAGE)
    assert name in found, f"docs/performance.md has no generated table {name!r}: run python benchmarks/tables.py --write"
    assert found[name] == tables.render(name), (
        f"docs/performance.md's table {name!r} differs from benchmarks/results: run python benchmarks/tables.py --write")


def test_every_generated_table_in_the_page_is_known():
    assert set(tables.blocks(PAGE)) == set(tables.TABLES)
    assert tables.rewrite(PAGE) == PAGE


def _cells(table: str) -> list[dict[str, str]]:
    """The rows of a markdown table as header -> cell."""
    lines = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()]
    return [dict(zip(lines[0], row)) for row in lines[2:]]


def _paired(raw: dict[str, list[dict[str, float]]], a: str, b: str) -> float:
    return statistics.median((x["samples"] / x["wall"]) / (y["samples"] / y["wall"]) for x, y in zip(raw[a], raw[b]))


@pytest.mark.parametrize("name", ["executors_1thread", "executors_2threads"])
def test_executors_ratios_are_medians_of_per_repeat_ratios_of_the_raw_records(name):
    result = json.loads((RESULTS / f"{name}.json").read_text())
    rows = _cells(tables.blocks(PAGE)[name])
    assert len(rows) == len(result["rows"])
    for cells, r in zip(rows, result["rows"]):
        assert cells["B"] == str(r["batch_size"])
        for column, baseline in (("vec / seq", "sequential"), ("**vec / plain loop B**", "central B"),
                                 ("vec / bound", "central KB")):
            shown = float(cells[column].strip("*").rstrip("×"))
            assert shown == round(_paired(r["raw"], "vectorized", baseline), 2), (name, r["model"], column)


def test_stacked_runs_ratio_is_the_median_of_per_repeat_ratios_of_the_raw_records():
    rows = _cells(tables.blocks(PAGE)["stacked_runs"])
    files = ["stacked_runs_digits_1thread.json", "stacked_runs_cifar_1thread.json", "stacked_runs_hbn_cifar10.json"]
    for cells, file in zip(rows, files, strict=True):
        raw = json.loads((RESULTS / file).read_text())["raw"]
        shown = float(cells["**stacked / one after another**"].strip("*").rstrip("×"))
        assert shown == round(_paired(raw, "stacked", "one after another"), 2), file


def test_a_remeasured_result_without_regenerated_docs_is_caught(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    path = results / "executors_1thread.json"
    result = json.loads(path.read_text())
    result["rows"][0]["vectorized samples/s"] += 100.0
    path.write_text(json.dumps(result))
    assert tables.render("executors_1thread", results) != tables.blocks(PAGE)["executors_1thread"]
    assert tables.render("executors_2threads", results) == tables.blocks(PAGE)["executors_2threads"]
    rewritten = tables.rewrite(PAGE, results)
    assert rewritten != PAGE and tables.blocks(rewritten)["executors_1thread"] == tables.render("executors_1thread", results)
    block = tables.blocks(PAGE)["executors_1thread"]
    hand_edited = PAGE.replace(block, block.replace("×", "x", 1))
    assert hand_edited != PAGE and tables.blocks(hand_edited)["executors_1thread"] != tables.render("executors_1thread")
    assert tables.rewrite(hand_edited) == PAGE
