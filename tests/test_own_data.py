"""Issue 19, done when: a user's own domains (three image folders and one .npz, 20×20) run FedAvg
and FedBN through the CLI and give per-domain results; bad data is one line and exit status 2."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from fednorm.cli.main import main


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDNORM_CACHE", str(tmp_path / "cache"))


def make_domains(root: Path) -> None:
    """Three image-folder domains (24×24 RGB, 16×16 grey, 20×20 RGB) and one .npz domain, three
    classes told apart by brightness, each domain with its own brightness and contrast shift."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for d, (name, size, colour) in enumerate([("scans", 24, True), ("phone", 16, False), ("sketch", 20, True)]):
        for c in range(3):
            folder = root / name / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(12):
                shape = (size, size, 3) if colour else (size, size)
                img = rng.integers(0, 50, shape) + 70 * c + 20 * d
                Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(folder / f"{i}.png")
    y = np.arange(45) % 3
    x = rng.integers(0, 30, (45, 20, 20, 3)) + 80 * y[:, None, None, None] + 10
    np.savez(root / "lab.npz", x=x.astype(np.uint8), y=y)


ARGS = ["--dataset", "domains", "--partition", "domains", "--num-clients", "4", "--model", "simple_cnn",
        "--rounds", "2", "--batch-size", "8", "--lr", "0.05", "--seed", "0", "--threads", "1", "--quiet"]


def dataset_args(root: Path) -> str:
    return json.dumps({"domains": {"scans": str(root / "scans"), "phone": str(root / "phone"),
                                   "sketch": str(root / "sketch"), "lab": str(root / "lab.npz")},
                       "image_size": 20, "channels": 3})


def test_fedavg_and_fedbn_on_own_domains_give_per_domain_results(tmp_path, capsys):
    make_domains(tmp_path / "data")
    out = tmp_path / "cmp"
    code = main(["compare", "--variants", "fedavg:bn,fedbn:bn", "--dataset-args", dataset_args(tmp_path / "data"),
                 "--out", str(out), *ARGS])
    printed = capsys.readouterr().out
    assert code == 0, printed
    header = next(line for line in printed.splitlines() if line.startswith("| variant"))
    for d in ("scans", "phone", "sketch", "lab"):
        assert f" {d} (%) |" in header
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["variant"] for r in rows] == ["fedavg+bn", "fedbn+bn"]
    for r in rows:
        accs = [float(r[f"acc[{d}]"]) for d in ("scans", "phone", "sketch", "lab")]
        assert all(0.0 <= a <= 1.0 for a in accs)
        # one client per domain: each domain's accuracy is its client's, and their mean the mean client accuracy
        assert np.isclose(np.mean(accs), float(r["mean_client_acc"]))
    summary = json.loads((out / "fedbn_bn" / "summary.json").read_text())
    assert list(summary["final_domain_accuracies"]) == ["scans", "phone", "sketch", "lab"]
    assert summary["client_sources"] == ["scans", "phone", "sketch", "lab"]
    last = [json.loads(x) for x in (out / "fedbn_bn" / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["domain_accuracies"] == summary["final_domain_accuracies"]


def test_run_prints_parameters_and_per_domain_accuracy(tmp_path, capsys):
    make_domains(tmp_path / "data")
    code = main(["run", "--method", "fedbn", "--dataset-args", dataset_args(tmp_path / "data"), "--out", str(tmp_path / "r"),
                 *[a for a in ARGS if a != "--quiet"], "--quiet"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "per domain: scans " in printed and ", lab " in printed
    # the model's size at the input's size, printed before training:
    code = main(["run", "--method", "fedavg", "--dataset-args", dataset_args(tmp_path / "data"), "--out", str(tmp_path / "r2"),
                 *[a for a in ARGS if a != "--quiet"]])
    printed = capsys.readouterr().out
    from fednorm.models import get_model

    n = sum(p.numel() for p in get_model("simple_cnn", num_classes=3, in_channels=3, input_size=20).parameters())
    assert code == 0 and f"model simple_cnn+bn: {n:,} parameters, input 3×20×20, 3 classes" in printed


def _bad_data(root: Path) -> dict[str, tuple[str, str]]:
    """name -> (dataset_args, text the one-line error must contain)."""
    x = np.zeros((20, 8, 8), np.uint8)
    np.savez(root / "ok.npz", x=x, y=np.arange(20) % 2)
    raw = (root / "ok.npz").read_bytes()
    (root / "cut.npz").write_bytes(raw[: len(raw) // 2])
    np.savez(root / "wide.npz", x=x, y=np.arange(20) % 2 + 5)
    (root / "folder" / "a").mkdir(parents=True)
    (root / "folder" / "b").mkdir()
    from PIL import Image

    Image.fromarray(np.zeros((8, 8), np.uint8)).save(root / "folder" / "a" / "0.png")
    return {
        "missing": (json.dumps({"domains": [str(root / "gone.npz")]}), "gone.npz' was not found"),
        "corrupt": (json.dumps({"domains": [str(root / "cut.npz")]}), "cut.npz"),
        "labels": (json.dumps({"domains": [str(root / "ok.npz"), str(root / "wide.npz")], "num_classes": 2}), "wide.npz"),
        "empty class": (json.dumps({"domains": [str(root / "folder")]}), "holds no images"),
    }


@pytest.mark.parametrize("case", ["missing", "corrupt", "labels", "empty class"])
def test_bad_data_is_one_line_and_exit_2(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args, needle = _bad_data(tmp_path)[case]
    code = main(["run", "--dataset", "domains", "--dataset-args", args, "--partition", "domains", "--num-clients", "1",
                 "--rounds", "1", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fednorm run: error: ") and needle in lines[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "summary.json").exists()


def test_digits5_with_a_subset_of_its_domains_runs_from_the_cli(tmp_path, capsys):
    """The issue's first wall: only MNIST and USPS present, sources [mnist, usps]."""
    rng = np.random.default_rng(0)
    for name, size in (("mnist", 28), ("usps", 16)):
        for split, n in (("train", 40), ("test", 20)):
            np.savez(tmp_path / f"{name}_{split}.npz", x=rng.integers(0, 255, (n, size, size), dtype=np.uint8), y=np.arange(n) % 10)
    code = main(["run", "--dataset", "digits5", "--data-dir", str(tmp_path), "--partition", "domains",
                 "--partition-args", "{sources: [mnist, usps]}", "--num-clients", "2", "--rounds", "1", "--model", "simple_cnn",
                 "--method", "fedbn", "--threads", "1", "--quiet", "--out", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "input 3×28×28, 10 classes" in out and "per domain: mnist " in out and ", usps " in out
    code = main(["run", "--dataset", "digits5", "--data-dir", str(tmp_path), "--partition", "domains",
                 "--partition-args", "{sources: [mnist, usps, svhn]}", "--num-clients", "3", "--rounds", "1",
                 "--out", str(tmp_path / "run2")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no files for domain 'svhn'" in err and "train_32x32.mat" in err
