"""HBN method: exact pooled statistics (Eq. 8), smoothing (Eq. 11), alpha stays local."""

import copy

import pytest
import torch

from fednorm.config import ExperimentConfig
from fednorm.engine.simulator import Simulation
from fednorm.errors import ConfigError
from fednorm.nn.hbn import HybridBatchNorm


def _sim(**kw):
    base = dict(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=4, rounds=3, batch_size=16, lr=0.05,
                momentum=0.9, model="simple_cnn", norm="hbn", method="hbn", dtype="float64")
    base.update(kw)
    return Simulation(ExperimentConfig(**base))


def _layer_inputs(model, x):
    """Inputs of every HBN layer of ``model`` (eval mode) on ``x``, flattened to [values, C]."""
    seen = {}
    hooks = [m.register_forward_hook(lambda m, inp, out, n=n: seen.__setitem__(n, inp[0].detach()))
             for n, m in model.named_modules() if isinstance(m, HybridBatchNorm)]
    model.eval()
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return {n: v.transpose(0, 1).reshape(v.shape[1], -1).T for n, v in seen.items()}


def test_pooled_statistics_equal_exact_statistics_of_the_downloaded_model_eq8():
    sim = _sim(method_args={"stats_momentum": 1.0, "stats_mode": "eval"})
    downloaded = copy.deepcopy(sim.model)
    downloaded.load_state_dict(sim.global_state)
    sim.step()
    feats = _layer_inputs(downloaded, sim.data.train_x)  # every client participates: the union is all data
    for name, f in feats.items():
        torch.testing.assert_close(sim.global_state[f"{name}.running_mean"], f.mean(0), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(sim.global_state[f"{name}.running_var"], f.var(0, unbiased=True), rtol=1e-10, atol=1e-12)


def test_lambda_smooths_the_global_statistics_eq11():
    a = _sim(method_args={"stats_momentum": 1.0, "stats_mode": "eval"})
    b = _sim(method_args={"stats_momentum": 0.25, "stats_mode": "eval"})
    before = {k: v.clone() for k, v in b.global_state.items()}
    a.step(), b.step()
    for name in b.method.layers:
        for key in ("running_mean", "running_var"):
            k = f"{name}.{key}"
            torch.testing.assert_close(b.global_state[k], 0.75 * before[k] + 0.25 * a.global_state[k], rtol=1e-12, atol=1e-12)


def test_alpha_never_leaves_a_client():
    sim = _sim(clients_per_round=2)
    alpha_keys = {k for k in sim.global_state if k.endswith("alpha")}
    assert alpha_keys and sim.method.local_keys == alpha_keys
    assert not alpha_keys & set(sim.method.shared_keys)
    for _ in range(3):
        sim.step()
    for k in alpha_keys:
        assert torch.count_nonzero(sim.global_state[k]) == 0  # the server never sees a learned alpha
    learned = [sim.bank.get(c)[k] for c in sim.bank for k in alpha_keys]
    assert any(torch.count_nonzero(a) > 0 for a in learned)


def test_statistics_pass_changes_no_weight():
    sim = _sim()
    model = sim.client_model(0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sim.method.client_statistics(model, sim.data.train_x[:100])
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_hbn_learns_and_needs_hbn_layers():
    res = _sim(dtype="float32", rounds=8, clients_per_round=4)
    for _ in range(8):
        rec = res.step()
    assert rec.metrics["test_accuracy"] > 0.85
    with pytest.raises(ConfigError, match="needs HBN layers"):
        _sim(norm="bn")
    with pytest.raises(ConfigError, match="stats_momentum"):
        _sim(method_args={"stats_momentum": 0})


def test_learned_mixing_is_reported_per_layer():
    sim = _sim(rounds=1)
    sim.step()
    report = sim.summary()["method_report"]["hbn_batch_weight"]
    assert set(report) == set(sim.method.layers)
    for layer in report.values():
        assert 0 < layer["batch_weight_min"] <= layer["batch_weight_mean"] <= layer["batch_weight_max"] < 1
        assert layer["clients"] == 4
