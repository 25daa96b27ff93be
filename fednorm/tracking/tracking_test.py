"""The round-loop callbacks and the loggers, read back from what they wrote: TensorBoard's
event files (tensorboard's EventAccumulator), an MLflow store queried with MlflowClient, W&B's
offline run folder."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import torch

from fednorm.api import run
from fednorm.cli.main import main
from fednorm.cli.progress import ProgressLines
from fednorm.tracking import Callback, build_loggers
from fednorm.errors import ConfigError

TINY = dict(dataset="digits", num_clients=3, rounds=3, eval_every=2, batch_size=32, threads=1, checkpoint_every=0)


class Recorder(Callback):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_run_start(self, sim, run_dir):
        self.calls.append(("start", sim.server_round, run_dir))

    def on_round_end(self, record, sim):
        self.calls.append(("round", record.server_round, dict(record.metrics)))

    def on_run_end(self, sim, summary, run_dir):
        self.calls.append(("end", summary["status"], run_dir, (run_dir / "summary.json").is_file()))


def test_callbacks_see_the_start_every_round_and_the_end(tmp_path: Path) -> None:
    rec, seen, lines = Recorder(), [], io.StringIO()
    res = run(TINY, out=str(tmp_path / "r"), progress=False, callbacks=[rec, ProgressLines(stream=lines)],
              on_round=lambda record, sim: seen.append(record.server_round))
    assert rec.calls[0] == ("start", 0, tmp_path / "r")
    rounds = [c for c in rec.calls if c[0] == "round"]
    assert [c[1] for c in rounds] == [1, 2, 3] == seen
    assert [c[2]["test_accuracy"] for c in rounds if c[2]] == [h["test_accuracy"] for h in res.history]
    assert rounds[0][2] == {}  # round 1 is not an evaluation round (eval_every=2)
    assert rec.calls[-1] == ("end", "completed", tmp_path / "r", True)  # after summary.json is written
    assert [line.split(":")[0] for line in lines.getvalue().splitlines()] == ["fedavg+bn round 2/3", "fedavg+bn round 3/3"]


def test_tensorboard_events_hold_the_run_scalars_per_client_and_bn_histograms(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    res = run(TINY, out=str(tmp_path / "r"), progress=False, log=["tensorboard"])
    acc = EventAccumulator(str(tmp_path / "r" / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    tags = acc.Tags()
    test_acc = acc.Scalars("test_accuracy")
    assert [e.step for e in test_acc] == [h["round"] for h in res.history] == [2, 3]
    assert [e.value for e in test_acc] == pytest.approx([h["test_accuracy"] for h in res.history], abs=1e-6)
    assert [e.step for e in acc.Scalars("train_loss")] == [1, 2, 3]  # every round, not only evaluations
    for cid in range(3):
        got = [e.value for e in acc.Scalars(f"client_accuracy/{cid}")]
        assert got == pytest.approx([h["client_accuracies"][cid] for h in res.history], abs=1e-6)
    bn = [t for t in tags["histograms"] if t.startswith("norm/") and t.endswith("running_var")]
    assert bn, tags["histograms"]
    key = bn[0][len("norm/"):]
    last = acc.Histograms(bn[0])[-1]
    expect = res.simulation.global_state[key].double()
    assert last.step == 3 and last.histogram_value.num == expect.numel()
    assert last.histogram_value.sum == pytest.approx(float(expect.sum()), rel=1e-6)
    assert (last.histogram_value.min, last.histogram_value.max) == pytest.approx((float(expect.min()), float(expect.max())))


def test_tensorboard_logs_the_diagnostics_as_scalars(tmp_path: Path) -> None:
    """Every ``diag/`` metric of an evaluated round is a TensorBoard scalar with its value."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    res = run({**TINY, "diagnostics": "every:1"}, out=str(tmp_path / "r"), progress=False, log=["tensorboard"])
    acc = EventAccumulator(str(tmp_path / "r" / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    diag = {k: v for h in res.history for k, v in h.items() if k.startswith("diag/")}
    assert "diag/grad/cosine" in diag and "diag/acc/gap" in diag
    for name in ("diag/grad/cosine", "diag/acc/gap"):
        got = [(e.step, e.value) for e in acc.Scalars(name)]
        assert got == [(h["round"], pytest.approx(h[name], abs=1e-6)) for h in res.history if name in h]


def test_tensorboard_histograms_hbn_mixing_weights_over_all_clients(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fednorm.nn.hbn import HybridBatchNorm

    res = run({**TINY, "rounds": 2, "method": "hbn", "norm": "hbn"}, out=str(tmp_path / "r"), progress=False, log=["tensorboard"])
    acc = EventAccumulator(str(tmp_path / "r" / "tensorboard"), size_guidance={"histograms": 0})
    acc.Reload()
    layers = [n for n, m in res.simulation.model.named_modules() if isinstance(m, HybridBatchNorm)]
    assert layers
    for name in layers:
        h = acc.Histograms(f"hbn_batch_weight/{name}")[-1].histogram_value
        bank = res.simulation.bank.state_dict()
        w = torch.cat([torch.sigmoid(-bank[c][f"{name}.alpha"].double()) for c in sorted(bank)])
        assert h.num == w.numel() == 3 * res.simulation.model.get_submodule(name).num_features
        assert h.sum == pytest.approx(float(w.sum()), rel=1e-9)


def test_mlflow_store_holds_params_metrics_and_the_run_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file:{tmp_path / 'mlruns'}"
    res = run({**TINY, "checkpoint_every": 1}, out=str(tmp_path / "r"), progress=False, log=["mlflow"],
              log_args={"mlflow": {"tracking_uri": uri, "experiment": "t"}})
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    assert len(runs) == 1
    r = runs[0]
    assert r.info.status == "FINISHED" and r.info.run_name == "r"
    assert r.data.params["lr"] == str(res.config.lr) and r.data.params["method"] == "fedavg"
    hist = client.get_metric_history(r.info.run_id, "test_accuracy")
    assert sorted((m.step, m.value) for m in hist) == [(h["round"], pytest.approx(h["test_accuracy"])) for h in res.history]
    assert [m.step for m in sorted(client.get_metric_history(r.info.run_id, "train_loss"), key=lambda m: m.step)] == [1, 2, 3]
    assert r.data.metrics["summary.final_test_accuracy"] == pytest.approx(res.summary["final_test_accuracy"])
    files = {a.path for a in client.list_artifacts(r.info.run_id)}
    assert {"config.yaml", "metrics.jsonl", "summary.json", "accuracy.png"} <= files
    assert "checkpoint.pt" not in files  # checkpoints stay out unless artifacts: all
    local = Path(client.download_artifacts(r.info.run_id, "summary.json", str(tmp_path / "dl")))
    assert local.read_text() == (tmp_path / "r" / "summary.json").read_text()


def test_a_resumed_run_continues_its_mlflow_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file:{tmp_path / 'mlruns'}"
    cfg = {**TINY, "rounds": 2, "eval_every": 1, "checkpoint_every": 1}
    run(cfg, out=str(tmp_path / "r"), progress=False, log=["mlflow"], log_args={"mlflow": {"tracking_uri": uri}})
    res = run(resume=tmp_path / "r", rounds=3, progress=False)  # log and log_args come from the run's config.yaml
    client = MlflowClient(uri)
    (only,) = client.search_runs([client.get_experiment_by_name("fednorm").experiment_id])
    assert only.info.status == "FINISHED"
    steps = sorted(m.step for m in client.get_metric_history(only.info.run_id, "test_accuracy"))
    assert steps == [1, 2, 3] and len(res.history) == 3


def test_wandb_offline_writes_its_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run({**TINY, "rounds": 2}, out=str(tmp_path / "r"), progress=False, log=["wandb"])
    runs = list((tmp_path / "r" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    data = list(runs[0].glob("run-*.wandb"))
    assert data and data[0].stat().st_size > 0


def test_a_missing_logger_package_is_one_clear_message_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow now raises ImportError
    code = main(["run", "--dataset", "digits", "--num-clients", "2", "--rounds", "1", "--out", str(tmp_path / "r"),
                 "--log", "mlflow", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "pip install 'fednorm[mlflow]'" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()  # refused before anything ran
    code = main(["run", "--dataset", "digits", "--rounds", "1", "--log", "tensorbord", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown logger 'tensorbord'" in err


def test_log_args_for_a_logger_not_chosen_is_an_error() -> None:
    with pytest.raises(ConfigError, match="add --log mlflow"):
        build_loggers([], {"mlflow": {"tracking_uri": "x"}})
