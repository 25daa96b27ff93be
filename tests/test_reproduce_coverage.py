"""Issue 48: every experiment of the five papers is in one inventory, docs/reproduce.md's coverage
table is generated from it (and fails here when stale), and every table config whose data is here
runs at its reduced scale: each row and each column trained at least once (one seed, the reduced
scale's few rounds), so a config that builds but does not train fails here."""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import pytest
import torch

from _fake_image_folders import fake_domainnet, fake_office_caltech10
from fednorm.reproduce import load_paper, plan, run_all, run_state
from fednorm.reproduce import runner
from fednorm.reproduce.coverage import BEGIN, END, Experiment, coverage_markdown, load_inventory, records, update_section
from fednorm.reproduce.suite import PAPERS, configs_root, list_tables, load_table

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_every_table_config_is_in_the_inventory_and_every_paper_is_listed() -> None:
    inv = load_inventory()
    named = {e.config for e in inv.experiments if e.config}
    shipped = {f"{p}/{t}" for p in PAPERS for t in list_tables(p)}
    assert shipped <= named, f"table configs no inventory entry names: {sorted(shipped - named)}"
    per_paper = {p: sum(e.paper == p for e in inv.experiments) for p in PAPERS}
    # the papers' quantitative tables and figures (issue 48 counts about 74: HBN 14, FedTAN 17, FBN 12, LN 17, FedBN 14)
    assert all(n >= 12 for n in per_paper.values()), per_paper
    assert sum(per_paper.values()) >= 74
    for e in inv.experiments:  # a reason that says which kind of obstacle it is
        if e.blocked:
            assert e.blocked.startswith(("data not here", "needs", "no numbers")), (e.paper, e.id, e.blocked)


def test_docs_coverage_section_is_generated_from_the_inventory_and_records() -> None:
    text = (REPO / "docs" / "reproduce.md").read_text(encoding="utf-8")
    section = text[text.index(BEGIN) + len(BEGIN):text.index(END)].lstrip("\n")
    assert section == coverage_markdown(), "docs/reproduce.md's coverage table is stale: run `fednorm reproduce --coverage`"
    # one line per experiment
    inv = load_inventory()
    assert sum(1 for line in section.splitlines() if line.startswith("| ") and not line.startswith("| paper")) == len(inv.experiments)


def test_update_section_replaces_only_the_marked_part() -> None:
    text = f"a\n{BEGIN}\nold\n{END}\nb\n"
    assert update_section(text, "new\n") == f"a\n{BEGIN}\nnew\n{END}\nb\n"
    with pytest.raises(Exception, match="markers"):
        update_section("no markers", "x")


def test_inventory_errors_name_the_entry(tmp_path: Path) -> None:
    bad = tmp_path / "inventory.yaml"
    bad.write_text("data_here: []\nexperiments:\n  - {paper: hbn, id: t, title: x, config: hbn/nope}\n")
    with pytest.raises(Exception, match="hbn/t.*no table file"):
        load_inventory(bad, root=configs_root())
    bad.write_text("data_here: []\nexperiments:\n  - {paper: hbn, id: t, title: x, config: hbn/table1, blocked: why}\n")
    with pytest.raises(Exception, match="exactly one of"):
        load_inventory(bad, root=configs_root())
    bad.write_text("data_here: []\nexperiments:\n  - {paper: hbn, id: t, title: x, config: hbn/table1, rows: [nope]}\n")
    with pytest.raises(Exception, match="nope"):
        load_inventory(bad, root=configs_root())


def test_records_count_seed_directories_and_the_fraction_of_the_papers_rounds(tmp_path: Path) -> None:
    """Records are read from run directories laid out as the suite writes them: seeds are the
    seed folders holding a summary, the fraction is the rounds run over the paper's."""
    (table,) = load_paper("fedtan", ["mnist"])
    exp = Experiment(paper="fedtan", id="fig6", title="t", data=("mnist",), config="fedtan/mnist", rows=("fedtan", "fedavg_bn"))
    specs = plan([table], scale="full", out=tmp_path / "fedtan", seeds=1, rows=["fedtan", "fedavg_bn"])
    by_cell = {c: s for s in specs for c in s.cells}
    paper_rounds = table.paper_rounds("fedtan", "noniid")
    for seed, rounds in ((0, paper_rounds), (1, paper_rounds // 2)):
        d = by_cell[("fedtan", "noniid")].dir.parent / f"seed{seed}"
        d.mkdir(parents=True)
        status = "completed" if rounds == paper_rounds else "interrupted"
        (d / "summary.json").write_text(json.dumps({"rounds": rounds, "status": status}))
    got = records(table, exp, tmp_path)
    assert got["cells"] == 4 and got["with_runs"] == 1
    assert got["seeds"] == [2] and got["completed"] == 1 and got["runs"] == 2
    assert sorted(got["fractions"]) == [pytest.approx((paper_rounds // 2) / paper_rounds), 1.0]


# -- every table whose data is here, at its reduced scale ------------------------------------------


def _runnable_tables() -> list[str]:
    inv = load_inventory()
    here = {e.config for e in inv.experiments if e.config and inv.runs_here(e)}
    return sorted(here)


def _diagonal(table) -> list[tuple[str, str]]:
    """Few cells covering every row and every column that has a runnable (not skipped) cell."""
    rows, cols = [r.id for r in table.rows], [c.id for c in table.columns]
    runnable = [(r, c) for r in rows for c in cols if not table.cell(r, c).skip]
    out: list[tuple[str, str]] = []
    for i, r in enumerate(rows):  # each row, preferring a column not covered yet
        mine = [c for rr, c in runnable if rr == r]
        if mine:
            fresh = [c for c in mine[i % len(mine):] + mine[:i % len(mine)] if c not in {cc for _, cc in out}]
            out.append((r, (fresh or mine)[0]))
    for c in cols:  # then any column still missing
        if c not in {cc for _, cc in out}:
            out += [(r, cc) for r, cc in runnable if cc == c][:1]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", _runnable_tables())
def test_table_trains_at_its_reduced_scale(name: str, shared_data: Path, tmp_path: Path) -> None:
    table = load_table(configs_root() / f"{name}.yaml")
    cells = _diagonal(table)
    # every row and column with a runnable cell is trained (a row or column skipped throughout has none)
    rows = {r.id for r in table.rows if not all(table.cell(r.id, c.id).skip for c in table.columns)}
    cols = {c.id for c in table.columns if not all(table.cell(r.id, c.id).skip for r in table.rows)}
    assert {r for r, _ in cells} == rows and {c for _, c in cells} == cols
    # one evaluation (the last round's, always made) and one checkpoint (at the end) per run: the
    # pipeline is what this exercises, and a per-round cadence doubled the suite's time for nothing
    quick = {"device": "cpu", "eval_every": 10_000, "eval_last_rounds": 0, "checkpoint_every": 0}
    specs = [s for s in plan([table], scale="reduced", out=tmp_path, seeds=1, data_dir=str(shared_data),
                             overrides=quick)
             if any(c in cells for c in s.cells)]
    runner.prepare_data(table, specs, source_dir=str(shared_data), out=tmp_path)
    run_all([(s, run_state(s)) for s in specs], progress=False)
    for spec in specs:
        summary = json.loads((spec.dir / "summary.json").read_text())
        assert summary["status"] == "completed", (spec.describe(), summary.get("status"))
        assert summary["rounds"] == spec.config["rounds"] < spec.paper_rounds
        metrics = [json.loads(line) for line in (spec.dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        accs = [m["test_accuracy"] for m in metrics if m.get("test_accuracy") is not None]
        assert accs and all(0.0 <= a <= 1.0 for a in accs), spec.describe()
        assert all(math.isfinite(m["train_loss"]) for m in metrics if m.get("train_loss") is not None), spec.describe()


# -- configs for data that is not here: the files they name, on a small fake tree ------------------


def _fake_npz(path: Path, n_classes: int, per_class: int, size: int, seed: int) -> None:
    import numpy as np

    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(n_classes, dtype=np.int64), per_class)
    x = rng.integers(0, 256, size=(len(y), size, size, 3), dtype=np.uint8)
    np.savez(path, x=x, y=y)


def _fake_cifar100(root: Path) -> None:
    """docs/data.md's CIFAR-100 npz layout: cifar100_train.npz and cifar100_test.npz (x uint8 N×32×32×3, y)."""
    _fake_npz(root / "cifar100_train.npz", 100, 20, 32, 0)
    _fake_npz(root / "cifar100_test.npz", 100, 3, 32, 1)


def _fake_digits5(root: Path) -> None:
    """docs/data.md's Digits-5 npz layout: <domain>_{train,test}.npz for mnist, svhn, usps, synth, mnistm."""
    for i, domain in enumerate(["mnist", "svhn", "usps", "synth", "mnistm"]):
        _fake_npz(root / f"{domain}_train.npz", 10, 4, 28, 2 * i)
        _fake_npz(root / f"{domain}_test.npz", 10, 2, 28, 2 * i + 1)


def _fake_tiny_imagenet(root: Path) -> None:
    """docs/data.md's Tiny-ImageNet npz layout: tiny_imagenet_{train,test}.npz (x uint8 N×64×64×3, y 0-199);
    tests/test_reproduce_data_not_here.py trains on the release's JPEG folders too."""
    _fake_npz(root / "tiny_imagenet_train.npz", 200, 2, 64, 12)
    _fake_npz(root / "tiny_imagenet_test.npz", 200, 1, 64, 13)


def _fake_abide(root: Path) -> None:
    """docs/data.md's ABIDE I layout: abide/<site>.npz (x float N×5,995, y, subject) for nyu, usm, um, ucla."""
    from fednorm.data.abide_test import write_fake_abide

    write_fake_abide(root, {"nyu": 10, "usm": 6, "um": 8, "ucla": 7}, windows=5, features=5995)


def _fake_pacs(root: Path) -> None:
    """docs/data.md's PACS layout: PACS/kfold/<domain>/<class>/*.jpg, 4 domains x 7 classes x 5 small images."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(14)
    for domain in ("photo", "art_painting", "cartoon", "sketch"):
        for cls in ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person"):
            folder = root / "PACS" / "kfold" / domain / cls
            folder.mkdir(parents=True)
            for i in range(5):
                Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(folder / f"{i}.jpg")


def _fake_morpho_mnist(root: Path) -> None:
    """docs/data.md's Morpho-MNIST layout: <variant>/{train,t10k}-{images-idx3,labels-idx1,pert-idx1}-ubyte.gz (gzipped IDX)."""
    from fednorm.data.morpho_mnist_test import write_fake_morpho_mnist

    write_fake_morpho_mnist(root, ("global", "local"), n_train=20, n_test=10)


FAKE_TREES = {"cifar100": _fake_cifar100, "digits5": _fake_digits5, "tiny_imagenet": _fake_tiny_imagenet,
              "abide": _fake_abide, "pacs": _fake_pacs, "morpho_mnist": _fake_morpho_mnist,
              "office_caltech10": fake_office_caltech10, "domainnet": fake_domainnet}  # tests/_fake_image_folders.py


# Configs whose reduced scale tests/test_reproduce_architecture_configs.py trains on the same fake trees
# (two cells each, and FedTAN's AlexNet-BN stack): training them here again costs a minute of CI for nothing.
TRAINED_ELSEWHERE = {"fedtan/fig8", "fedbn/table1_office"}
# Rows trained elsewhere: FedTAN's AlexNet-BN stack (test_fedtan_rows_hold_their_alexnet_bn_clients_in_one_stack trains
# Fig. 8's 4 clients in one stack and checks Fig. 13's 6 fit its budget); here 6 clients in lockstep took 2-3 minutes.
ROWS_TRAINED_ELSEWHERE = {"fedtan/fig13": {"fedtan"}}


def _configs_for_data_not_here() -> list[str]:
    inv = load_inventory()
    out = sorted({e.config for e in inv.experiments if e.config and not inv.runs_here(e)})
    return out


def _datasets(table) -> list[str]:
    """The datasets a table reads: its runs' and its unseen clients' (scored after each run)."""
    return [table.base["dataset"], *sorted({u.dataset for u in table.unseen.values()})]


def test_every_config_for_data_not_here_has_a_fake_tree() -> None:
    inv = load_inventory()
    for name in _configs_for_data_not_here():
        table = inv.tables[name]
        for dataset in _datasets(table):
            assert dataset in FAKE_TREES, f"{name}: add a fake tree of the files '{dataset}' reads"


def test_the_configs_trained_elsewhere_are_trained_there() -> None:
    import test_reproduce_architecture_configs as arch

    trained = {name for name, _ in arch.FAKE_TREE_CONFIGS}
    assert TRAINED_ELSEWHERE <= trained and TRAINED_ELSEWHERE <= set(_configs_for_data_not_here())
    stack_test = inspect.getsource(arch.test_fedtan_rows_hold_their_alexnet_bn_clients_in_one_stack)
    assert all(f'"{name}"' in stack_test for name in ROWS_TRAINED_ELSEWHERE)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in _configs_for_data_not_here() if n not in TRAINED_ELSEWHERE])
def test_config_for_data_not_here_trains_on_a_fake_tree_of_the_files_it_names(name: str, tmp_path: Path) -> None:
    """A user with the files (here: random images in the documented layout) runs the config's
    reduced scale as it is; without them, the suite says which files to put where."""
    table = load_table(configs_root() / f"{name}.yaml")
    empty = tmp_path / "empty"
    empty.mkdir()
    specs = plan([table], scale="reduced", out=tmp_path / "none", seeds=1, data_dir=str(empty))
    with pytest.raises(Exception, match="--data-dir"):
        runner.prepare_data(table, specs, source_dir=str(empty), out=tmp_path / "none")
    data = tmp_path / "data"
    data.mkdir()
    for dataset in _datasets(table):
        FAKE_TREES[dataset](data)
    # two rows, one round: the loader, partition and models build and train
    cells = [c for c in _diagonal(table) if c[0] not in ROWS_TRAINED_ELSEWHERE.get(name, set())][:2]
    specs = [s for s in plan([table], scale="reduced", out=tmp_path / "out", seeds=1, data_dir=str(data),
                             overrides={"device": "cpu", "rounds": 1, "checkpoint_every": 0}) if any(c in cells for c in s.cells)]
    runner.prepare_data(table, specs, source_dir=str(data), out=tmp_path / "out")
    run_all([(s, run_state(s)) for s in specs], progress=False)
    for spec in specs:
        summary = json.loads((spec.dir / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["rounds"] == 1, spec.describe()
