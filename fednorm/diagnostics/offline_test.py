"""``fednorm diagnose``: the run's own evaluations reproduced from its checkpoint, the exact-statistics
accuracy against an independent BatchNorm recalibration, the resampling protocol's invariants and
the command's errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from fednorm.api import run
from fednorm.cli.main import main
from fednorm.config import load_config
from fednorm.diagnostics.offline import DIAGNOSIS_FILE, diagnose_run, format_diagnosis
from fednorm.engine.checkpoint import load_latest
from fednorm.engine.simulator import Simulation

TINY = dict(num_clients=4, rounds=2, local_steps=2, threads=1, dtype="float64")


def _recalibrated_accuracy(run_dir: Path) -> float:
    """Independent of the diagnostics' pooling: plain BatchNorm layers with a cumulative average,
    fed the clients' union as one batch in training mode (every later layer then sees inputs
    normalised with the union's statistics), then evaluated."""
    sim = Simulation(load_config(run_dir / "config.yaml"))
    sim.load_state_dict(load_latest(run_dir))
    model = copy.deepcopy(sim.global_model(sim.global_state)).eval()
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert bns
    for m in bns:
        m.momentum = None
        m.reset_running_stats()
        m.train()
    data = sim.data
    union = torch.cat([data.train_x[ix] for ix in data.client_train])
    with torch.no_grad():
        model(union)
        model.eval()
        pred = model(data.test_x).argmax(1)
    return float((pred == data.test_y).double().mean())


def test_fedavg_bn_diagnosis_matches_its_evaluation_and_an_independent_recalibration(tmp_path: Path) -> None:
    out = tmp_path / "bn"
    res = run(dict(TINY, method="fedavg", norm="bn", out=str(out)), progress=False)
    got = diagnose_run(out, resample=3)
    acc = got["accuracy"]
    assert acc["as_evaluated"] == pytest.approx(res.history[-1]["test_accuracy"], abs=1e-12)
    assert acc["global_buffers"] == pytest.approx(acc["as_evaluated"], abs=1e-12)  # FedAvg evaluates its buffers
    assert acc["exact"] == pytest.approx(_recalibrated_accuracy(out), abs=1e-12)
    assert "deployed" not in acc and got["resampled"] is None  # FedAvg has neither
    assert set(got["layers"]) == {"features.1", "features.5", "features.9"}
    assert all(f["agg_var_logratio"] > 0 for f in got["layers"].values())
    assert json.loads((out / DIAGNOSIS_FILE).read_text())["accuracy"] == acc
    assert "exact statistics of the clients' union" in format_diagnosis(got)


def test_hbn_diagnosis_reproduces_the_protocols_evaluation_and_round_t_plus_1(tmp_path: Path) -> None:
    out = tmp_path / "hbn"
    res = run(dict(TINY, method="hbn", norm="hbn", method_args={"preset": "paper"}, clients_per_round=2, out=str(out)),
              progress=False)
    summary = json.loads((out / "summary.json").read_text())
    got = diagnose_run(out, resample=4)
    acc = got["accuracy"]
    # the last round's two clients re-synced under the final weights: the run's last evaluation
    assert acc["as_evaluated"] == pytest.approx(res.history[-1]["test_accuracy"], abs=1e-12)
    assert acc["deployed"] == pytest.approx(summary["final_sync"]["test_accuracy"], abs=1e-12)  # round T+1
    r = got["resampled"]
    assert r["samples"] == 4 and r["clients_per_sample"] == 2 and len(r["accuracies"]) == 4
    assert r["min"] <= r["mean"] <= r["max"] and all(0 <= a <= 1 for a in r["accuracies"])
    assert set(got["hbn_batch_weight"]) == {"features.1", "features.5", "features.9"}
    assert all(0 < w["p10"] <= w["p50"] <= w["p90"] < 1 for w in got["hbn_batch_weight"].values())


def test_resampling_every_client_repeats_the_evaluation(tmp_path: Path) -> None:
    """With every client sampled each round, every resample is the same pool as the run's evaluation."""
    out = tmp_path / "hbn_all"
    run(dict(TINY, num_clients=3, method="hbn", norm="hbn", method_args={"preset": "paper"}, out=str(out)), progress=False)
    got = diagnose_run(out, resample=2, write=False)
    r = got["resampled"]
    assert r["std"] == 0.0 and r["mean"] == pytest.approx(got["accuracy"]["as_evaluated"], abs=1e-12)
    assert not (out / DIAGNOSIS_FILE).exists()


def test_personalized_methods_report_accuracy_and_local_spread_only(tmp_path: Path) -> None:
    out = tmp_path / "fedbn"
    res = run(dict(TINY, method="fedbn", norm="bn", out=str(out)), progress=False)
    got = diagnose_run(out)
    assert got["personalized"] and set(got["accuracy"]) == {"as_evaluated"}
    assert got["accuracy"]["as_evaluated"] == pytest.approx(res.history[-1]["test_accuracy"], abs=1e-12)
    assert got["local_spread"] and all(f["mean_spread"] > 0 for f in got["local_spread"].values())


def test_diagnose_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bn"
    run(dict(TINY, rounds=1, method="fedavg", norm="bn", out=str(out)), progress=False)
    assert main(["diagnose", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "as the run evaluated" in printed and "exact - as evaluated" in printed and (out / DIAGNOSIS_FILE).is_file()
    assert main(["diagnose", str(out)]) == 0  # a second diagnosis says that it replaced the first
    assert "replacing the previous diagnosis" in capsys.readouterr().out
    assert main(["diagnose", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["round"] == 1
    assert main(["diagnose", str(tmp_path / "missing")]) == 2
    assert "no config.yaml there" in capsys.readouterr().err
    assert main(["diagnose", str(out), "--resample", "-1"]) == 2
    assert "--resample must be >= 0" in capsys.readouterr().err
    assert main(["diagnose", str(out), "--max-samples", "0"]) == 2
    assert "--max-samples must be >= 1" in capsys.readouterr().err
    assert main(["diagnose", str(out), "--max-samples", "20"]) == 0
    captured = capsys.readouterr()
    assert "fednorm diagnose: exact statistics of" in captured.err and "layer 3/3" in captured.err


def test_max_samples_takes_a_seeded_share_of_every_client_and_reports_progress(tmp_path: Path) -> None:
    out = tmp_path / "bn"
    run(dict(TINY, method="fedavg", norm="bn", out=str(out)), progress=False)
    full = diagnose_run(out, write=False)
    assert full["exact_samples"] == full["train_samples"] > 40
    same = diagnose_run(out, max_samples=10**6, write=False)  # above the union: every sample, same figures
    assert same["accuracy"] == full["accuracy"] and same["layers"] == full["layers"]
    lines: list[str] = []
    part = diagnose_run(out, max_samples=40, write=False, progress=lines.append)
    assert 36 <= part["exact_samples"] <= 44 and part["train_samples"] == full["train_samples"]  # rounding per client
    assert part["accuracy"]["as_evaluated"] == full["accuracy"]["as_evaluated"]  # only the exact pass is subsampled
    assert part["layers"] != full["layers"]
    again = diagnose_run(out, max_samples=40, write=False)
    assert again["accuracy"] == part["accuracy"] and again["layers"] == part["layers"]  # seeded
    assert [line for line in lines if line.startswith("  layer")] == ["  layer 1/3 (features.1)", "  layer 2/3 (features.5)", "  layer 3/3 (features.9)"]
    assert f"exact statistics of {part['exact_samples']} of {part['train_samples']}" in format_diagnosis(part)
