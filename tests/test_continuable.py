"""Results that are never lost and work that can always be continued (issue 35.2-35.5): data given
from Python is recorded as the user's, a failed write names its file and resumes, an interrupted
``compare`` continues to the uninterrupted table, and a diverged run restarts from its last good
checkpoint with a smaller learning rate, recorded so that its config reproduces it."""

from __future__ import annotations

import csv
import json
import resource
import subprocess
import sys

import pytest
import torch

import fednorm
from fednorm import api
from fednorm.cli import progress as progress_mod
from fednorm.cli.main import main
from fednorm.data.datasets import DatasetInfo
from fednorm.data.federated import FederatedData
from fednorm.engine.checkpoint import load_latest
from fednorm.engine.outputs import read_metrics
from fednorm.errors import ConfigError

from _signals import sigint_at

LOUD = ["--num-clients", "3", "--model", "mlp", "--batch-size", "64", "--seed", "1", "--threads", "1"]
TINY = [*LOUD, "--quiet"]


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch):
    monkeypatch.setattr("fednorm.plotting.plot_accuracy", lambda *a, **k: None)
    monkeypatch.setattr("fednorm.plotting.plot_comparison", lambda *a, **k: None)


def _no_time(history):
    return [{k: v for k, v in h.items() if k not in ("wall_seconds", "seconds")} for h in history]


# -- 35.2: data given from Python is recorded as the user's ------------------------------------

def _my_data(flip: bool = False) -> FederatedData:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 1, 8, 8, generator=g)
    y = torch.arange(120) % 3
    x += y.view(-1, 1, 1, 1).float()  # learnable: the class shifts the brightness
    if flip:
        y = y.clone()
        y[7] = (y[7] + 1) % 3
    info = DatasetInfo(name="scans", num_classes=3, in_channels=1, image_size=(8, 8), mean=(0.0,), std=(1.0,))
    clients = [torch.arange(i, 120, 4) for i in range(4)]
    test = [torch.arange(i, 60, 4) for i in range(4)]
    return FederatedData(info, x, y, x[:60].clone(), y[:60].clone(), clients, test)


def test_data_given_from_python_is_recorded_and_resumes_only_with_the_same_data(tmp_path, capsys):
    out = tmp_path / "mine"
    result = fednorm.run(data=_my_data(), num_clients=4, model="mlp", rounds=2, batch_size=8, out=str(out), progress=False)
    assert result.summary["dataset"] == "user:scans" and result.summary["partition"] == "user:scans"
    recorded = fednorm.load_config(out / "config.yaml")
    assert recorded.dataset == "user:scans"
    desc = recorded.dataset_args
    assert desc["train_shape"] == [120, 1, 8, 8] and desc["test_shape"] == [60, 1, 8, 8] and desc["num_classes"] == 3
    assert desc["client_sizes"] == [30, 30, 30, 30] and desc["fingerprint"].startswith("blake2b:")
    # the CLI cannot rebuild it: exit 2 and how to resume from Python, and nothing trained on the digits
    assert main(["run", "--resume", str(out), "--rounds", "3", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"fednorm.run(resume='{out}', data=...)" in err and len(err.strip().replace(str(out), "R")) <= 300
    assert json.loads((out / "summary.json").read_text())["rounds"] == 2
    with pytest.raises(ConfigError, match="not the data it trained on"):
        fednorm.run(resume=out, data=_my_data(flip=True), rounds=3, progress=False)
    resumed = fednorm.run(resume=out, data=_my_data(), rounds=3, progress=False)
    full = fednorm.run(data=_my_data(), num_clients=4, model="mlp", rounds=3, batch_size=8, out=str(tmp_path / "full"),
                       progress=False)
    assert _no_time(resumed.history) == _no_time(full.history)


def test_the_configs_own_data_is_recorded_by_its_name():
    from fednorm.data.federated import federated_data_from_config

    cfg = fednorm.load_config(None, {"num_clients": 3, "model": "mlp", "rounds": 1})
    data = federated_data_from_config(cfg)
    assert api.record_data(cfg, data) == cfg
    other = api.record_data(cfg.model_copy(update={"seed": cfg.seed + 1}), data)  # another seed's partition
    assert other.dataset.startswith("user:")


def test_data_that_is_not_federated_data_is_one_line():
    with pytest.raises(ConfigError, match="data must be a fednorm.FederatedData, got tuple"):
        fednorm.run(data=(torch.zeros(2), torch.zeros(2)), rounds=1, write=False)


# -- 35.3: a write failure names the file, writes the status and resumes -----------------------

def test_a_file_size_limit_names_the_file_and_the_run_resumes_bit_for_bit(tmp_path):
    out = tmp_path / "fs"
    args = ["--method", "fedbn", "--clients-per-round", "2", "--rounds", "6", "--checkpoint-every", "1", "--eval-every", "1",
            "--model", "mlp", "--seed", "3", "--threads", "1", "--quiet"]
    limit = 23_000  # the FedBN checkpoint (18 kB at round 1, 27 kB at round 6) grows as more clients' BN tensors are kept: it passes this in a few rounds
    proc = subprocess.run([sys.executable, "-m", "fednorm", "run", *args, "--out", str(out)], capture_output=True, text=True,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)), timeout=300)
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr
    assert f"could not write {out / 'checkpoint.pt'}: File too large" in err
    summary = json.loads((out / "summary.json").read_text())
    saved = load_latest(out)["server_round"]
    assert summary["status"] == "failed" and summary["last_checkpoint_round"] == saved and 0 < saved < 6
    assert f"the last good checkpoint is round {saved}" in err and f"fednorm run --resume {out}" in err
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    assert main(["run", *args, "--out", str(tmp_path / "full")]) == 0
    assert _no_time(read_metrics(out)) == _no_time(read_metrics(tmp_path / "full"))


# -- 35.4: an interrupted comparison continues --------------------------------------------------

def test_compare_resume_gives_the_uninterrupted_table(tmp_path, monkeypatch, capsys):
    argv = ["compare", "--rounds", "3", *LOUD, "--methods", "fedavg,fedbn,silobn", "--eval-every", "1"]
    assert main([*argv, "--quiet", "--out", str(tmp_path / "whole")]) == 0
    out = tmp_path / "c"
    original = sigint_at(monkeypatch, variant=2, server_round=2)  # Ctrl-C in the second variant's second round
    monkeypatch.setattr("fednorm.cli.progress.wants_lines", lambda *a: True)
    assert main([*argv, "--out", str(out)]) == 130  # not quiet: the progress lines carry the interruption
    assert "fednorm compare --resume" in capsys.readouterr().err
    assert main(["compare", "--rounds", "3", *TINY, "--out", str(out)]) == 2
    assert f"fednorm compare --resume {out}" in capsys.readouterr().err
    monkeypatch.setattr(progress_mod.ProgressLines, "__call__", original)
    assert main(["compare", "--resume", str(out), "--quiet"]) == 0

    def table(d):
        return [{k: v for k, v in row.items() if k != "wall_s"} for row in csv.DictReader((d / "results.csv").open())]

    assert table(out) == table(tmp_path / "whole")
    assert main(["compare", "--resume", str(out), "--lr", "0.5"]) == 2
    assert "drop --lr" in capsys.readouterr().err


# -- 35.5: divergence is one line, and its advice works ----------------------------------------

DIVERGE = ["--lr", "0.05", "--lr-milestones", "3", "--lr-gamma", "1e7", "--rounds", "5", "--checkpoint-every", "1",
           "--eval-every", "1", *TINY]


def test_a_diverged_run_restarts_from_its_last_good_checkpoint_with_a_smaller_lr(tmp_path, capsys):
    out = tmp_path / "d"
    assert main(["run", *DIVERGE, "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and len(err) <= 300, err
    assert "round 3" in err and "client" in err
    assert f"restart from the last good checkpoint (round 2) with a smaller learning rate: fednorm run --resume {out} --lr 0.005" in err
    assert json.loads((out / "summary.json").read_text())["status"] == "diverged"
    assert main(["run", "--resume", str(out), "--quiet"]) == 2  # the same lr would diverge again
    assert "--lr 0.005" in capsys.readouterr().err
    assert main(["run", "--resume", str(out), "--lr", "1e-9", "--quiet"]) == 0  # round 3 on: 1e-9 * 1e7 = 0.01
    recorded = fednorm.load_config(out / "config.yaml")
    assert recorded.lr == 0.05 and recorded.lr_restarts == [{"round": 2, "lr": 1e-9}]
    assert [h["lr"] for h in read_metrics(out)][1:3] == [0.05, pytest.approx(0.01)]
    # the recorded config describes the whole run: repeating it gives the same results from scratch
    again = fednorm.run(recorded.model_copy(update={"out": str(tmp_path / "again")}), progress=False)
    assert _no_time(again.history) == _no_time(read_metrics(out))


def test_changing_lr_on_resume_is_refused_unless_the_run_diverged(tmp_path, capsys):
    out = tmp_path / "ok"
    assert main(["run", "--rounds", "2", *TINY, "--out", str(out)]) == 0
    assert main(["run", "--resume", str(out), "--rounds", "3", "--lr", "0.01", "--quiet"]) == 2
    assert "only a diverged run restarts with another lr" in capsys.readouterr().err
