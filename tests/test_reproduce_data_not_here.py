"""Issue 48: the table configs for data that is not here (CIFAR-100, Tiny-ImageNet, ABIDE I, PACS) train every
row and every column of their reduced scale for one round on a small fake tree in the layout docs/data.md
documents, so a config that names a wrong field, model option or file layout fails here, not on the
machine that has the data. tests/test_reproduce_coverage.py trains two cells of every such config; this
file trains them all, and Tiny-ImageNet on its release layout (JPEG folders) as well as on its npz."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fednorm.reproduce import plan, run_all, run_state
from fednorm.reproduce import runner
from fednorm.reproduce.suite import configs_root, load_table
from test_reproduce_coverage import FAKE_TREES, _diagonal

CONFIGS = ["hbn/table2", "hbn/table9", "hbn/fig1", "hbn/fig6", "ln/table11", "hbn/table1_tiny", "hbn/table10",
           "fedbn/table1_abide", "ln/table5", "fedbn/table15"]


@pytest.fixture(autouse=True)
def one_thread_own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDNORM_CACHE", str(tmp_path / "cache"))  # decoded JPEGs go here, not to ~/.cache
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _train(table, cells, data: Path, out: Path) -> list[dict]:
    specs = [s for s in plan([table], scale="reduced", out=out, seeds=1, data_dir=str(data),
                             overrides={"device": "cpu", "rounds": 1, "eval_every": 1, "checkpoint_every": 0})
             if any(c in cells for c in s.cells)]
    runner.prepare_data(table, specs, source_dir=str(data), out=out)
    run_all([(s, run_state(s)) for s in specs], progress=False)
    summaries = []
    for spec in specs:
        summary = json.loads((spec.dir / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["rounds"] == 1, spec.describe()
        summaries.append(summary)
    return summaries


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_every_row_and_column_trains_on_a_fake_tree(name: str, tmp_path: Path) -> None:
    table = load_table(configs_root() / f"{name}.yaml")
    cells = _diagonal(table)
    runnable = {(r.id, c.id) for r in table.rows for c in table.columns if not table.cell(r.id, c.id).skip}
    assert {r for r, _ in cells} == {r for r, _ in runnable} and {c for _, c in cells} == {c for _, c in runnable}
    data = tmp_path / "data"
    data.mkdir()
    FAKE_TREES[table.base["dataset"]](data)
    summaries = _train(table, cells, data, tmp_path / "out")
    if table.base["dataset"] == "abide":  # one client per site, each scored on its own site's test split
        for summary in summaries:
            names = json.dumps(summary)
            assert all(site in names for site in ("nyu", "usm", "um", "ucla")), summary


@pytest.mark.slow
def test_tiny_imagenet_tables_train_on_the_release_layout(tmp_path: Path) -> None:
    """The JPEG folders as the release unpacks (200 wnids, 2 training and 1 val image each)."""
    from fednorm.data.tiny_imagenet_test import write_fake_tiny_imagenet

    data = tmp_path / "data"
    write_fake_tiny_imagenet(data, [f"n{k:08d}" for k in range(200)], train_per_class=2, val_per_class=1, encode=False)
    table = load_table(configs_root() / "hbn/table1_tiny.yaml")
    _train(table, [("hbn", "phi0.05"), ("fedfn", "phi0.1")], data, tmp_path / "out")
