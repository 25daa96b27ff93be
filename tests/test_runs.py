"""End-to-end runs: learning, determinism, the run directory contract."""

import json
import math

import pytest

from fednorm import api
from fednorm.config import ExperimentConfig
from fednorm.engine.outputs import read_metrics, read_summary


def _strip_times(history):
    return [{k: v for k, v in h.items() if k != "wall_seconds"} for h in history]


def test_iid_fedavg_learns_digits_above_90_percent_in_a_few_rounds():
    result = api.run(
        dataset="digits", partition="iid", num_clients=5, rounds=4, batch_size=16, lr=0.05, momentum=0.9,
        model="simple_cnn", norm="bn", write=False, progress=False,
    )
    assert result.summary["final_test_accuracy"] > 0.90


def test_same_config_gives_identical_metrics_twice():
    cfg = ExperimentConfig(
        dataset="digits", partition="dirichlet", alpha=0.3, num_clients=6, clients_per_round=2, rounds=2,
        batch_size=16, lr=0.05, momentum=0.9, model="fbn_cnn", norm="bn", seed=3,
    )
    a = api.run(cfg, write=False, progress=False)
    b = api.run(cfg, write=False, progress=False)
    assert _strip_times(a.history) == _strip_times(b.history)
    for key, value in a.simulation.global_state.items():
        assert value.equal(b.simulation.global_state[key]), key


def test_different_seed_gives_different_run():
    base = dict(dataset="digits", num_clients=4, rounds=1, batch_size=32, write=False, progress=False)
    a = api.run(seed=0, **base)
    b = api.run(seed=1, **base)
    assert a.history[0]["test_loss"] != b.history[0]["test_loss"]


def test_run_directory_contract(tmp_path):
    out = tmp_path / "run"
    result = api.run(
        dataset="digits", partition="classes", classes_per_client=2, num_clients=5, rounds=3, eval_every=2,
        batch_size=32, out=str(out), progress=False,
    )
    cfg = ExperimentConfig.model_validate(__import__("yaml").safe_load((out / "config.yaml").read_text()))
    assert cfg == result.config and cfg.out == str(out)
    metrics = read_metrics(out)
    assert [m["round"] for m in metrics] == [2, 3]  # every 2 rounds, and always the last
    for m in metrics:
        for key in ("round", "test_accuracy", "test_loss", "train_loss", "wall_seconds", "uplink_bytes",
                    "downlink_bytes", "comm_rounds", "client_accuracies", "mean_client_accuracy"):
            assert key in m, key
        assert len(m["client_accuracies"]) == 5
    assert metrics[1]["uplink_bytes"] > metrics[0]["uplink_bytes"] > 0
    assert metrics[1]["comm_rounds"] == 3
    summary = read_summary(out)
    for key in ("final_test_accuracy", "best_test_accuracy", "rounds", "wall_seconds", "method", "norm", "seed"):
        assert key in summary, key
    assert summary["rounds"] == 3 and summary["final_test_accuracy"] == metrics[-1]["test_accuracy"]
    assert 0 < summary["eval_seconds"] < summary["wall_seconds"]
    assert summary["eval_fraction"] == pytest.approx(summary["eval_seconds"] / summary["wall_seconds"])
    assert (out / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the resolved config repeats the run exactly
    again = api.run(out / "config.yaml", out=str(tmp_path / "again"), progress=False)
    assert _strip_times(again.history) == _strip_times(json.loads(json.dumps(result.history)))


def test_communication_accounting_counts_shared_bytes_per_sampled_client():
    result = api.run(dataset="digits", num_clients=6, clients_per_round=2, rounds=2, write=False, progress=False)
    sim = result.simulation
    model_bytes = sum(v.numel() * v.element_size() for v in sim.global_state.values())
    assert result.history[-1]["downlink_bytes"] == 2 * 2 * model_bytes
    assert result.history[-1]["uplink_bytes"] == 2 * 2 * model_bytes
    assert result.history[-1]["downlink_bytes_broadcast"] == 2 * model_bytes  # one broadcast per round


def test_compare_writes_table_and_plot(tmp_path):
    res = api.compare(
        dataset="digits", num_clients=4, rounds=2, batch_size=32,
        variants=[{"norm": "bn"}, {"norm": "gn"}], out=tmp_path / "cmp", progress=False,
    )
    assert list(res.results) == ["fedavg+bn", "fedavg+gn"]
    table = (tmp_path / "cmp" / "results.md").read_text()
    assert "fedavg+bn" in table and "fedavg+gn" in table
    assert (tmp_path / "cmp" / "accuracy.png").exists()
    assert (tmp_path / "cmp" / "results.csv").read_text().startswith("variant,")
    # both variants saw exactly the same client data
    a, b = (r.simulation.data for r in res.results.values())
    assert a is b
    for r in res.results.values():
        assert not math.isnan(r.summary["final_test_accuracy"])


@pytest.mark.slow
def test_the_first_command_shows_batchnorm_failing(tmp_path):
    """Issue 17.8: `fednorm compare` with no arguments must show the failure the library fixes.
    Its setting (label skew at batch 4) puts FedAvg with averaged BatchNorm statistics below a
    batch-free norm (here FN, the LN paper's fix), and the headline says so."""
    from fednorm.cli.main import QUICKSTART

    res = api.compare(QUICKSTART, variants=[{"method": "fedavg", "norm": "bn"}, {"method": "fedavg", "norm": "fn"}],
                      threads=1, checkpoint_every=0, out=tmp_path / "cmp", progress=False)
    bn, fn = (res.results[k].summary["final_test_accuracy"] for k in ("fedavg+bn", "fedavg+fn"))
    assert fn > bn + 0.03
    assert res.headline().startswith(f"FedAvg with averaged BatchNorm statistics reaches {100 * bn:.1f}%; 1 of 1")
    assert "| fedavg+fn | global |" in (tmp_path / "cmp" / "results.md").read_text()
    defaults = {(v["method"], v["norm"]) for v in api.DEFAULT_VARIANTS}
    assert {("fedbn", "bn"), ("hbn", "hbn"), ("fbn", "fbn"), ("fedtan", "bn"), ("fedavg", "fn"), ("fedavg", "gn")} <= defaults
