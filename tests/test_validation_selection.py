"""Best-validation model selection end to end (``validation_fraction``; FedBN's Office/DomainNet rule):
the held-out samples never train, every evaluation scores them with the models the test splits are
scored with, summary.json keeps the round of the best mean validation accuracy and the test
accuracies recorded there, and the reproduce report reads the same figure from the run directory."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

import fednorm
from fednorm.config import ExperimentConfig
from fednorm.data.federated import federated_data_from_config
from fednorm.data.validation import hold_out_validation
from fednorm.engine.simulator import Simulation
from fednorm.reproduce.report import paper_statistic_value, run_metrics
from fednorm.reproduce.suite import PaperStatistic

QUICK = dict(dataset="digits", model="mlp", norm="bn", partition="dirichlet", alpha=0.5, num_clients=4, rounds=5,
             local_steps=3, batch_size=16, lr=0.1, threads=1, checkpoint_every=0, eval_every=1, seed=3)
# a run whose validation accuracy peaks before its last round, and FedAvg's test accuracy at another round
# (seed 4, lr 2: validation best at round 6 of 8, test at 7), so selecting by the last or the best test
# accuracy would fail the tests below
SELECTING = {**QUICK, "rounds": 8, "lr": 2.0, "seed": 4}


def _run(**kw) -> Simulation:
    sim = Simulation(ExperimentConfig(**{**QUICK, **kw}))
    for _ in sim.rounds():
        pass
    return sim


def _correct_on(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model.eval()(x).argmax(1) == y).double().mean())


def test_held_out_samples_never_train_and_scoring_them_changes_nothing() -> None:
    """A run with validation equals, number for number, a run without it on the data whose
    clients hold only the training part: the held-out samples never train, and scoring them
    (in eval mode) moves no BN statistic and draws from no random stream."""
    cfg = ExperimentConfig(**QUICK, validation_fraction=0.3)
    data = federated_data_from_config(cfg)
    held = hold_out_validation(data, 0.3, cfg.seed)
    with_val = Simulation(cfg, data)
    without = Simulation(cfg.model_copy(update={"validation_fraction": 0.0}),
                         dataclasses.replace(data, client_train=held.client_train))
    for a, b in zip(with_val.rounds(), without.rounds()):
        assert a.train_loss == b.train_loss
        for key in ("test_accuracy", "test_loss", "client_accuracies"):
            assert a.metrics[key] == b.metrics[key], key
        assert "val_accuracy" in a.metrics and "val_accuracy" not in b.metrics
    assert all(torch.equal(with_val.global_state[k], without.global_state[k]) for k in with_val.global_state)
    assert with_val.samples_trained == without.samples_trained
    assert all(k not in without.summary() for k in ("best_val_round", "best_val_test_accuracy"))


def test_a_global_models_validation_scores_are_its_predictions_on_the_held_out_samples() -> None:
    sim = _run(method="fedavg", validation_fraction=0.3)
    last = sim.history[-1]
    model = sim.global_model()
    direct = [_correct_on(model, sim.data.train_x[ix], sim.data.train_y[ix]) for ix in sim.data.client_val]
    assert last["client_val_accuracies"] == pytest.approx(direct, abs=1e-12)
    assert last["val_accuracy"] == pytest.approx(float(np.mean(direct)), abs=1e-12)  # unweighted over clients


def test_the_selected_round_is_the_first_argmax_of_the_recorded_validation_accuracy(tmp_path) -> None:
    result = fednorm.run(ExperimentConfig(**SELECTING, method="fedavg", validation_fraction=0.3,
                                          out=str(tmp_path / "run")), progress=False)
    history = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    val = [float(np.mean(h["client_val_accuracies"])) for h in history]  # recomputed from the per-client record
    assert val == pytest.approx([h["val_accuracy"] for h in history], abs=1e-15)
    i = int(np.argmax(val))  # numpy's argmax: the first of equal maxima
    assert summary["best_val_round"] == history[i]["round"]
    assert i != len(history) - 1 and i != int(np.argmax([h["test_accuracy"] for h in history]))  # a discriminating run
    assert summary["best_val_accuracy"] == history[i]["val_accuracy"]
    assert summary["best_val_test_accuracy"] == history[i]["test_accuracy"]
    assert summary["best_val_mean_client_accuracy"] == history[i]["mean_client_accuracy"]
    assert summary["best_val_client_accuracies"] == history[i]["client_accuracies"]
    assert "client_best_val_rounds" not in summary  # one global model: one round for every client
    assert result.summary["best_val_round"] == summary["best_val_round"]
    # the reproduce report reads the same round from the run directory
    for metric in ("test_accuracy", "mean_client_accuracy"):
        rec = run_metrics(tmp_path / "run", metric)
        assert rec["best_val_round"] == summary["best_val_round"]
        assert rec["best_val"] == pytest.approx(100 * history[i][metric], abs=1e-9)
        stat = PaperStatistic(kinds=("best_val",), source="test", eval_every=1)
        value, why = paper_statistic_value(rec["curve"], rec["final_round"], "best_val", stat, selection=rec["val_curve"])
        assert value == rec["best_val"] and why is None


def test_fedbn_selects_one_round_for_all_and_records_each_clients_own_selection(tmp_path) -> None:
    """FedBN's clients are scored with their own models (their own BN); the summary keeps the code's
    one round for all clients and, beside it, each client's own best validation round (SingleSet's
    rule, read by the report's best_val_client)."""
    fednorm.run(ExperimentConfig(**SELECTING, method="fedbn", validation_fraction=0.3, out=str(tmp_path / "run")),
                progress=False)
    history = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["personalized"]
    i = int(np.argmax([h["val_accuracy"] for h in history]))
    assert summary["best_val_round"] == history[i]["round"]
    assert summary["best_val_client_accuracies"] == history[i]["client_accuracies"]
    per_client = np.array([h["client_val_accuracies"] for h in history])  # [evaluations, clients]
    own = per_client.argmax(axis=0)
    assert len(set(own.tolist())) > 1  # the clients' own selections differ in this run
    assert summary["client_best_val_rounds"] == [history[j]["round"] for j in own]
    picked = [history[j]["client_accuracies"][k] for k, j in enumerate(own)]
    assert summary["client_best_val_test_accuracies"] == picked
    assert summary["client_best_val_mean_accuracy"] == pytest.approx(float(np.mean(picked)), abs=1e-15)
    rec = run_metrics(tmp_path / "run", "mean_client_accuracy")
    assert rec["best_val_client"] == pytest.approx(100 * float(np.mean(picked)), abs=1e-9)


def test_fedbn_scores_each_clients_validation_split_with_its_own_model() -> None:
    sim = _run(method="fedbn", validation_fraction=0.3, rounds=2)
    direct = [_correct_on(sim.client_model(k), sim.data.train_x[ix], sim.data.train_y[ix])
              for k, ix in enumerate(sim.data.client_val)]
    assert sim.history[-1]["client_val_accuracies"] == pytest.approx(direct, abs=1e-12)


def test_a_run_without_validation_reports_best_val_as_not_available(tmp_path) -> None:
    fednorm.run(ExperimentConfig(**{**QUICK, "rounds": 2}, method="fedavg", out=str(tmp_path / "run")), progress=False)
    rec = run_metrics(tmp_path / "run", "test_accuracy")
    assert rec["best_val"] is None and "validation" in rec["best_val_na"] and rec["val_curve"] == []
    stat = PaperStatistic(kinds=("best_val",), source="test", eval_every=1)
    value, why = paper_statistic_value(rec["curve"], rec["final_round"], "best_val", stat, selection=rec["val_curve"])
    assert value is None and "validation" in why


TABLE = """\
paper: fedbn
table: sel
title: "A table of known validation curves"
source: "tests/test_validation_selection.py"
metric: mean_client_accuracy
compare: [best_val, final]
base: {dataset: digits, partition: dirichlet, num_clients: 2, model: mlp, rounds: 6, eval_every: 1, seed: 3,
       validation_fraction: 0.3}
reduced: {description: "the same"}
rows:
  - {id: a, label: "A", set: {method: fedavg}}
  - {id: b, label: "B", set: {method: fedbn}}
columns:
  - {id: mean, label: "mean"}
cells:
  a: {mean: 60.0}
  b: {mean: {paper: 50.0, statistic: best_val_client}}
paper_statistic: {kind: best_val, eval_every: 1, source: "a test"}
"""


def _write_run(spec, seed: int, val: np.ndarray, test: np.ndarray) -> None:
    """A finished run directory: ``val``/``test`` ``[rounds, clients]`` accuracies at every round."""
    d = spec.dir.parent / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(ExperimentConfig(**{**spec.config, "seed": seed, "out": str(d)}).to_yaml())
    lines = [{"round": r + 1, "mean_client_accuracy": float(test[r].mean()), "client_accuracies": test[r].tolist(),
              "client_val_accuracies": val[r].tolist(), "val_accuracy": float(val[r].mean())} for r in range(len(val))]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (d / "summary.json").write_text(json.dumps({"status": "completed", "rounds": len(val), "seed": seed}))


def test_the_report_compares_the_test_accuracy_at_the_best_validation_round(tmp_path) -> None:
    from fednorm.reproduce import collect, plan
    from fednorm.reproduce.report_markdown import markdown
    from fednorm.reproduce.suite import load_paper

    (tmp_path / "configs" / "fedbn").mkdir(parents=True)
    (tmp_path / "configs" / "fedbn" / "sel.yaml").write_text(TABLE)
    (table,) = load_paper("fedbn", ["sel"], tmp_path / "configs")
    out = tmp_path / "out"
    specs = {c: s for s in plan([table], scale="full", out=out) for c in s.cells}
    rng = np.random.default_rng(0)
    expected: dict[str, list[float]] = {"a": [], "b": []}
    for row in ("a", "b"):
        for seed in (3, 4):
            val, test = rng.uniform(0.2, 0.9, (6, 2)).round(2), rng.uniform(0.2, 0.9, (6, 2))
            _write_run(specs[(row, "mean")], seed, val, test)
            if row == "a":  # one round for both clients: the first best mean validation accuracy
                expected[row].append(100 * test[int(np.argmax(val.mean(axis=1)))].mean())
            else:  # each client at its own first best validation round
                expected[row].append(100 * np.mean([test[int(np.argmax(val[:, k])), k] for k in range(2)]))
    results = collect([table], scale="full", out=out)
    cells = {c["row"]: c for c in results["tables"][0]["cells"]}
    assert cells["a"]["stats"]["best_val"]["mean"] == pytest.approx(np.mean(expected["a"]), abs=1e-9)
    assert cells["a"]["diff"]["best_val"] == pytest.approx(np.mean(expected["a"]) - 60.0, abs=1e-9)
    (a_stat,) = cells["a"]["paper_statistic"]
    assert a_stat["kind"] == "best_val" and a_stat["mean"] == pytest.approx(np.mean(expected["a"]), abs=1e-9)
    (b_stat,) = cells["b"]["paper_statistic"]
    assert b_stat["kind"] == "best_val_client" and b_stat["exact"]
    assert b_stat["mean"] == pytest.approx(np.mean(expected["b"]), abs=1e-9)
    assert results["tables"][0]["ordering"]["mean"]["stat"] == "best_val"
    text = markdown(results)
    assert "| final | best | last-10 | best-val | paper |" in text and "Δ at best validation" in text
