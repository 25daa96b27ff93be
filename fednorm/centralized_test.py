"""The centralized reference: one client holding the union of the data, trained on as many
samples per round as the federation (steps and epochs modes), and runnable from compare."""

import pytest

from fednorm.centralized import centralized_config, centralized_overrides
from fednorm.config import ExperimentConfig
from fednorm.engine.simulator import Simulation

BASE = dict(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=4, rounds=1, batch_size=8, model="mlp",
            norm="bn", threads=1, checkpoint_every=0, out=None, seed=0, eval_every=1)


def _samples_one_round(cfg):
    sim = Simulation(cfg)
    sim.step()
    return sim, sim.executor.last_samples_seen


@pytest.mark.parametrize("batch", ["union", "same"])
def test_steps_mode_trains_the_federations_samples_per_round_on_the_union(batch):
    fed = ExperimentConfig(**BASE, local_steps=3, client_opt="fedprox", server_opt="fedavgm")
    cen = centralized_config(fed, batch=batch)
    assert (cen.num_clients, cen.partition, cen.method, cen.client_opt, cen.server_opt) == (1, "iid", "fedavg", "none", "none")
    assert (cen.batch_size, cen.local_steps) == ((32, 3) if batch == "union" else (8, 12))
    assert (cen.model, cen.norm, cen.lr, cen.rounds) == (fed.model, fed.norm, fed.lr, fed.rounds)
    fed_sim, fed_seen = _samples_one_round(fed)
    cen_sim, cen_seen = _samples_one_round(cen)
    assert fed_seen == cen_seen == 4 * 3 * 8
    assert len(cen_sim.data.client_train[0]) == sum(len(ix) for ix in fed_sim.data.client_train)  # the union


def test_epochs_mode_matches_the_expected_samples_per_round():
    fed = ExperimentConfig(**BASE, clients_per_round=2)
    sim = Simulation(fed)
    n = sum(len(ix) for ix in sim.data.client_train)
    over = centralized_overrides(fed)
    assert over["batch_size"] == 16 and over["local_steps"] == round(n * 2 / 4 / 16)
    cen_sim, cen_seen = _samples_one_round(centralized_config(fed))
    assert abs(cen_seen - n * 2 / 4) <= 16  # the expected E·n·K/N, to one batch


def test_compare_runs_the_centralized_reference(tmp_path, monkeypatch):
    from fednorm.cli.main import main

    monkeypatch.setattr("fednorm.plotting.plot_comparison", lambda *a, **k: None)
    argv = ["compare", "--rounds", "1", "--num-clients", "3", "--model", "mlp", "--batch-size", "16", "--local-steps", "2",
            "--methods", "fedavg,centralized", "--norms", "bn,gn", "--quiet", "--threads", "1", "--out", str(tmp_path / "c")]
    assert main(argv) == 0
    table = (tmp_path / "c" / "results.md").read_text()
    assert "| centralized+bn |" in table and "| centralized+gn |" in table and "| fedavg+bn |" in table


def test_expand_centralized_reads_the_batch_rule_and_refuses_other_args():
    from fednorm.centralized import expand_centralized
    from fednorm.errors import ConfigError

    fed = ExperimentConfig(**BASE, local_steps=3)
    assert expand_centralized(fed) is fed
    same = expand_centralized(fed.model_copy(update={"method": "centralized", "method_args": {"batch": "same"}}))
    assert (same.method, same.num_clients, same.batch_size, same.local_steps) == ("fedavg", 1, 8, 12)
    union = expand_centralized(fed.model_copy(update={"method": "centralized"}))
    assert (union.batch_size, union.local_steps) == (32, 3)
    with pytest.raises(ConfigError, match="only method_args batch"):
        expand_centralized(fed.model_copy(update={"method": "centralized", "method_args": {"mu": 1}}))


@pytest.mark.parametrize("model", ["mlp", "simple_cnn", "ln_cnn", "fbn_cnn", "fedbn_cnn", "resnet20", "resnet18",
                                   "ln_resnet18", "vgg11", "resnet50", "vgg19", "mobilenet_v2", "alexnet_bn"])
def test_run_method_centralized_for_every_model(tmp_path, model, capsys):
    import json

    from fednorm.cli.main import main
    from fednorm.models import list_models

    assert model in list_models()
    out = tmp_path / model
    argv = ["run", "--method", "centralized", "--model", model, "--norm", "gn", "--rounds", "1", "--num-clients", "3",
            "--batch-size", "4", "--local-steps", "1", "--quiet", "--threads", "1", "--out", str(out)]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_clients"] == 1 and summary["method"] == "fedavg"
    assert summary["final_test_accuracy"] is not None
    assert "batch_size: 12" in (out / "config.yaml").read_text()  # K·B: the federation's samples per step


def test_every_model_is_covered_by_the_centralized_run_test():
    from fednorm.models import list_models

    covered = {"mlp", "simple_cnn", "ln_cnn", "fbn_cnn", "fedbn_cnn", "resnet20", "resnet18", "ln_resnet18", "vgg11",
               "resnet50", "vgg19", "mobilenet_v2", "alexnet_bn"}
    assert set(list_models()) <= covered, sorted(set(list_models()) - covered)
