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
                momentum=0.9, model="simple_cnn", norm="hbn", method="hbn", dtype="float64", local_steps=3,
                eval_every=1000)
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
    res = _sim(dtype="float32", rounds=8, clients_per_round=4, local_steps=None, eval_every=8)
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


def test_first_samples_statistics_equal_a_direct_computation_on_those_samples():
    """stats_samples='first' (the code's one unshuffled batch): the uploaded statistics are exactly
    those of the first m samples of the client's data under the downloaded weights."""
    sim = _sim(num_clients=1, partition="iid", method_args={"stats_momentum": 1.0, "stats_mode": "eval",
                                                             "stats_samples": "first", "stats_max_samples": 40})
    downloaded = copy.deepcopy(sim.model)
    downloaded.load_state_dict(sim.global_state)
    x = sim.data.train_x[sim.data.client_train[0][:40]]
    sim.step()
    for name, f in _layer_inputs(downloaded, x).items():
        torch.testing.assert_close(sim.global_state[f"{name}.running_mean"], f.mean(0), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(sim.global_state[f"{name}.running_var"], f.var(0, unbiased=True), rtol=1e-10, atol=1e-12)


def test_random_subset_statistics_are_seeded_and_differ_from_all_data():
    kw = {"stats_momentum": 1.0, "stats_samples": "random", "stats_max_samples": 32}
    a, b, full = _sim(method_args=kw), _sim(method_args=kw), _sim(method_args={"stats_momentum": 1.0})
    a.step(), b.step(), full.step()
    name = a.method.layers[0]
    assert torch.equal(a.global_state[f"{name}.running_mean"], b.global_state[f"{name}.running_mean"])
    assert not torch.allclose(a.global_state[f"{name}.running_mean"], full.global_state[f"{name}.running_mean"])


def test_hybrid_upload_mixes_local_and_global_statistics_with_the_client_alpha():
    """upload='hybrid' (the code): at alpha = 0 the uploaded mean is (local + global) / 2."""
    local = _sim(num_clients=1, partition="iid", method_args={"stats_momentum": 1.0, "stats_mode": "eval"})
    hybrid = _sim(num_clients=1, partition="iid",
                  method_args={"stats_momentum": 1.0, "stats_mode": "eval", "upload": "hybrid"})
    before = {k: v.clone() for k, v in hybrid.global_state.items()}
    local.step(), hybrid.step()
    name = hybrid.method.layers[0]  # the first layer's input does not depend on earlier statistics
    torch.testing.assert_close(
        hybrid.global_state[f"{name}.running_mean"],
        0.5 * local.global_state[f"{name}.running_mean"] + 0.5 * before[f"{name}.running_mean"],
        rtol=1e-10, atol=1e-12,
    )


def test_reference_code_preset_averages_alpha_and_clients_keep_their_own():
    sim = _sim(clients_per_round=2, rounds=2, method_args={"preset": "reference-code"})
    m = sim.method
    assert (m.stats_momentum, m.stats_samples, m.stats_max_samples, m.upload, m.alpha_mode) == (
        0.002, "first", 64, "hybrid", "global_init")
    alpha_keys = {k for k in sim.global_state if k.endswith("alpha")}
    assert alpha_keys <= set(m.shared_keys) and not m.local_keys
    record = sim.step()
    # the global alpha is the sample-weighted average of the clients' trained alphas
    own = {c: sim.bank.get(c) for c in record.client_ids}
    w = torch.tensor([len(sim.data.client_train[c]) for c in record.client_ids], dtype=torch.float64)
    key = sorted(alpha_keys)[0]
    expected = sum(wi * own[c]["hbn.own." + key] for wi, c in zip(w / w.sum(), record.client_ids))
    torch.testing.assert_close(sim.global_state[key], expected, rtol=1e-10, atol=1e-12)
    assert not torch.equal(own[record.client_ids[0]]["hbn.own." + key], own[record.client_ids[1]]["hbn.own." + key])


def test_first_round_init_replaces_the_zero_one_statistics():
    a = _sim(method_args={"stats_momentum": 1.0})
    b = _sim(method_args={"stats_momentum": 0.01, "stats_init": "first_round"})
    a.step(), b.step()
    for name in a.method.layers:
        for key in ("running_mean", "running_var"):
            torch.testing.assert_close(b.global_state[f"{name}.{key}"], a.global_state[f"{name}.{key}"], rtol=1e-12, atol=1e-12)


def test_final_statistics_round_describes_the_final_weights(tmp_path):
    """Round T+1: statistics only, under the final weights, weights unchanged; written to final_model.pt."""
    import fednorm

    res = fednorm.run(dict(dataset="digits", partition="iid", num_clients=3, rounds=2, local_steps=3, batch_size=16, lr=0.05,
                           model="simple_cnn", norm="hbn", method="hbn", dtype="float64",
                           method_args={"stats_mode": "eval"}), out=str(tmp_path / "run"), progress=False)
    final = torch.load(tmp_path / "run" / "final_model.pt")
    sim = res.simulation
    for k, v in sim.global_state.items():
        if "running" not in k:
            assert torch.equal(final[k], v), k
    model = copy.deepcopy(sim.model)
    model.load_state_dict(sim.global_state)
    for name, f in _layer_inputs(model, sim.data.train_x).items():  # all 3 clients: the whole training set
        torch.testing.assert_close(final[f"{name}.running_mean"], f.mean(0), rtol=1e-10, atol=1e-12)
    assert 0 <= res.summary["final_sync"]["test_accuracy"] <= 1
