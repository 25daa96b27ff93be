"""End to end: FBN/FixBN runs, robust aggregation and attacks through the simulator and the CLI config."""

from __future__ import annotations

import pytest
import torch

from fednorm.config import ExperimentConfig, load_config
from fednorm.engine.simulator import Simulation
from fednorm.errors import ConfigError
from fednorm.nn.fbn import FederatedBatchNorm

BASE = dict(dataset="digits", model="fedbn_cnn", partition="gamma", gamma=0.0, num_clients=5, dsgd=True, batch_size=16,
            lr=0.1, momentum=0.9, threads=1, checkpoint_every=0, eval_every=1000)


@pytest.mark.slow
def test_fbn_dsgd_learns_at_one_class_per_client_and_shared_stats_match_the_layers(tmp_path):
    sim = Simulation(ExperimentConfig(**BASE, method="fbn", norm="fbn", rounds=80, out=str(tmp_path)))
    list(sim.rounds())
    assert sim.summary()["final_test_accuracy"] > 0.7
    layers = [n for n, m in sim.model.named_modules() if isinstance(m, FederatedBatchNorm)]
    assert layers and all(float(sim.global_state[f"{n}.running_var"].min()) > 0 for n in layers)
    # the statistics moved away from their (0, 1) initialisation
    assert any(float(sim.global_state[f"{n}.running_mean"].abs().max()) > 0.05 for n in layers)
    # ... to those of the layers' inputs: the final model's per-channel mean and variance over the
    # union of the clients' training data, measured independently by hooks, follow the shared
    # statistics channel for channel (an EMA over the last steps lags the final weights, so the
    # check is the channels' correlation: measured 0.93-0.9996 at every layer)
    model = sim.model
    model.load_state_dict(sim.global_state)
    model.eval()
    modules = dict(model.named_modules())
    seen: dict[str, list[torch.Tensor]] = {n: [] for n in layers}
    hooks = [modules[n].register_forward_pre_hook(lambda mod, args, n=n: seen[n].append(args[0].detach().double()))
             for n in layers]
    try:
        with torch.no_grad():
            model(sim.data.train_x[torch.cat(list(sim.data.client_train))])
    finally:
        for h in hooks:
            h.remove()
    for n in layers:
        x = seen[n][0]
        dims = [0, *range(2, x.dim())]
        for stat, true in (("running_mean", x.mean(dims)), ("running_var", x.var(dims, unbiased=False))):
            shared = sim.global_state[f"{n}.{stat}"].double()
            assert float(torch.corrcoef(torch.stack([shared, true]))[0, 1]) > 0.9, (n, stat)


def test_median_of_two_clients_is_fedavg_uniform(tmp_path):
    """Neutral setting: the median of two values is their mean, so with two clients
    aggregator=median equals FedAvg with uniform weights (float64, to rounding)."""
    common = dict(BASE, num_clients=2, rounds=3, dtype="float64", executor="sequential", method_args={"weighting": "uniform"})
    a = Simulation(ExperimentConfig(**common, out=str(tmp_path / "a")))
    b = Simulation(ExperimentConfig(**common, aggregator="median", out=str(tmp_path / "b")))
    list(a.rounds())
    list(b.rounds())
    for k, v in a.global_state.items():
        torch.testing.assert_close(b.global_state[k], v, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_sign_flip_on_statistics_through_the_simulator(tmp_path):
    """Naive BN, one round, f = 2 sign-flipping clients besides 5 honest ones: the averaged running
    mean is (5 − 2)/7 of the honest mean (the documented perturbation); with the median it is the
    coordinate-wise median of the 5 honest rows and the 2 flipped ones; the weights are untouched
    (robust_targets: stats)."""
    common = dict(BASE, num_clients=5, rounds=1, gamma=1.0, dtype="float64", executor="sequential",
                  method_args={"weighting": "uniform"})
    honest = Simulation(ExperimentConfig(**common, out=str(tmp_path / "h")))
    rows: dict[str, list[torch.Tensor]] = {}
    orig = honest.method.aggregate

    def spy(server_round, global_state, updates):
        rows.update({k: v.clone() for k, v in updates.states.items()})
        return orig(server_round, global_state, updates)

    honest.method.aggregate = spy
    list(honest.rounds())
    attacked = Simulation(ExperimentConfig(**common, attack="sign_flip", num_byzantine=2, out=str(tmp_path / "a")))
    list(attacked.rounds())
    defended = Simulation(ExperimentConfig(**common, attack="sign_flip", num_byzantine=2, aggregator="median",
                                           robust_targets="stats", out=str(tmp_path / "d")))
    list(defended.rounds())
    key = next(k for k in rows if k.endswith("running_mean"))
    h = rows[key]
    torch.testing.assert_close(attacked.global_state[key], (5 - 2) / 7 * h.mean(0), rtol=0, atol=1e-12)
    expected = torch.cat([h, -h.mean(0).expand(2, -1)]).double().numpy()
    import numpy as np

    torch.testing.assert_close(defended.global_state[key], torch.from_numpy(np.median(expected, axis=0)), rtol=0, atol=1e-12)
    weight = next(k for k in rows if k.endswith("weight"))
    torch.testing.assert_close(defended.global_state[weight], honest.global_state[weight], rtol=0, atol=1e-12)


def test_byzantine_settings_are_validated():
    with pytest.raises(ConfigError, match="num_byzantine"):
        load_config(overrides={"attack": "sign_flip"})
    with pytest.raises(ConfigError, match="below the honest clients"):
        load_config(overrides={"attack": "alie", "num_byzantine": 10, "num_clients": 10})
    with pytest.raises(ConfigError, match="Did you mean 'median'"):
        load_config(overrides={"aggregator": "medain"})
    with pytest.raises(ConfigError, match="attack"):
        load_config(overrides={"attack": "signflip2", "num_byzantine": 1})
    with pytest.raises(ConfigError, match="attack_targets"):
        load_config(overrides={"attack_targets": "weights"})
    cfg = load_config(overrides={"attack": "FOE", "num_byzantine": 3, "aggregator": "trimmed-mean", "nnm": True})
    assert (cfg.attack, cfg.aggregator) == ("foe", "trimmed_mean")


PARTITIONS = {  # every partition of `fednorm list`, each with the options it needs; clients end up unequal
    "iid": {},
    "dirichlet": {"alpha": 0.3},
    "dirichlet_client": {"alpha": 0.3},
    "classes": {"classes_per_client": 2},
    "gamma": {"gamma": 0.5},
    "quantity": {},
    "domains": {"dataset": "digits_domains"},  # needs ../shared/data (generated from MNIST, USPS, CIFAR-10)
    "domain_labels": {"dataset": "digits_domains", "alpha": 0.3},  # 2 clients per domain, Dirichlet within each
}
VARIANTS = {
    "fbn": dict(method="fbn", norm="fbn"),
    "fixbn": dict(method="fixbn", norm="bn", method_args={"switch_round": 1}),
    "robust_fbn": dict(method="fbn", norm="fbn", aggregator="median", attack="sign_flip", num_byzantine=1),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("partition", sorted(PARTITIONS))
def test_every_partition_runs_with_fbn_fixbn_and_robust_fbn(partition, variant, tmp_path, request):
    """Issue 17.1: clients with different numbers of local steps (one local epoch over unequal
    shards, drop_last remainders) used to stop FBN with 'clients uploaded tensors of different
    shapes'. Every partition runs two rounds of local epochs, and the statistics stay finite."""
    from fednorm.data.partition import list_partitions

    assert set(PARTITIONS) == set(list_partitions()), "a new partition needs a row here"
    opts = dict(dataset="digits", partition=partition, num_clients=6, rounds=2, local_epochs=1, batch_size=16,
                drop_last=partition == "quantity", threads=1, checkpoint_every=0, eval_every=1, out=str(tmp_path))
    opts.update(PARTITIONS[partition])
    opts.update(VARIANTS[variant])
    if partition in ("domains", "domain_labels"):
        opts.update(data_dir=str(request.getfixturevalue("shared_data")), num_clients=5 if partition == "domains" else 10,
                    local_steps=3)  # equal domains; domain_labels: unequal clients, 3 steps each
        if opts["method"] == "fbn":  # the initial pass over 37k images costs a minute; other rows cover it
            opts["method_args"] = {"initial_pass": False}
    sim = Simulation(ExperimentConfig(**opts))
    sizes = [len(ix) for ix in sim.data.client_train]
    if partition not in ("iid", "domains"):
        assert len({n // 16 for n in sizes}) > 1, "the setting must give clients different numbers of steps"
    assert len(list(sim.rounds())) == 2
    acc = sim.summary()["final_test_accuracy"]
    assert acc == acc and 0.0 <= acc <= 1.0
    stats = [v for k, v in sim.global_state.items() if k.endswith(("running_mean", "running_var"))]
    assert stats and all(bool(torch.isfinite(v).all()) for v in stats)
