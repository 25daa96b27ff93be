"""The new-client recipe (FedBN App. G): exact statistics, averaged local tensors, end to end."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fednorm
from fednorm.engine.adapt import averaged_state, batch_norm_statistics
from fednorm.errors import ConfigError
from fednorm.models import get_model


def _randomised_fedbn_cnn():
    torch.manual_seed(0)
    model = get_model("fedbn_cnn", num_classes=10, in_channels=3, input_size=8).double()
    for m in model.modules():  # non-trivial affine and stale statistics that must be replaced
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.normal_()
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.0)
    return model


@torch.no_grad()
def _direct_statistics(model, x):
    """Reference: one pass over all of x, each BN normalising with torch.mean/torch.var of its whole input."""
    model.eval()
    stats = {}
    h = x
    for prefix, seq in (("features", model.features), ("fc", model.fc)):
        for i, m in enumerate(seq):
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                dims = [d for d in range(h.dim()) if d != 1]
                mean, var = h.mean(dim=dims), h.var(dim=dims, unbiased=True)
                stats[f"{prefix}.{i}"] = (mean, var)
                h = F.batch_norm(h, mean, var, m.weight, m.bias, training=False, eps=m.eps)
            else:
                h = m(h)
    return stats


def test_new_client_statistics_equal_a_direct_computation_float64():
    model = _randomised_fedbn_cnn()
    x = torch.randn(37, 3, 8, 8, dtype=torch.float64) * 2 + 0.5
    expected = _direct_statistics(model, x)
    got = batch_norm_statistics(model, x, batch_size=10)  # batches that do not divide N
    assert set(got) == set(expected) and len(got) == 5
    for name, (mean, var) in expected.items():
        torch.testing.assert_close(got[name][0], mean, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got[name][1], var, rtol=1e-10, atol=1e-12)
        bn = model.get_submodule(name)
        torch.testing.assert_close(bn.running_mean, mean, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(bn.running_var, var, rtol=1e-10, atol=1e-12)
    # the adapted eval-mode model normalises each layer's input over x to zero mean, unit variance
    model.eval()
    inputs = []
    hook = model.fc[1].register_forward_hook(lambda m, i, o: inputs.append(o.clone()))  # ReLU is in place
    with torch.no_grad():
        model(x)
    hook.remove()
    out = (inputs[0] - model.fc[1].bias) / model.fc[1].weight
    torch.testing.assert_close(out.mean(0), torch.zeros_like(out[0]), atol=1e-6, rtol=0)


def test_statistics_need_batch_norm_and_two_samples():
    with pytest.raises(ConfigError, match="no BatchNorm"):
        batch_norm_statistics(nn.Sequential(nn.Linear(2, 2)), torch.randn(4, 2))
    with pytest.raises(ConfigError, match="at least 2"):
        batch_norm_statistics(_randomised_fedbn_cnn(), torch.randn(1, 3, 8, 8, dtype=torch.float64))


def test_averaged_state_averages_local_tensors_over_clients_that_hold_them():
    g = {"w": torch.zeros(3, dtype=torch.float64), "bn.weight": torch.ones(2, dtype=torch.float64),
         "bn.num_batches_tracked": torch.tensor(0)}
    bank = {0: {"bn.weight": torch.tensor([1.0, 3.0], dtype=torch.float64), "bn.num_batches_tracked": torch.tensor(4)},
            1: {"bn.weight": torch.tensor([2.0, 5.0], dtype=torch.float64), "bn.num_batches_tracked": torch.tensor(7)}}
    out = averaged_state(g, bank, {"bn.weight", "bn.num_batches_tracked"})
    assert torch.equal(out["bn.weight"], torch.tensor([1.5, 4.0], dtype=torch.float64))
    assert int(out["bn.num_batches_tracked"]) == 7 and out["w"] is g["w"]
    assert averaged_state(g, {}, {"bn.weight"})["bn.weight"] is g["bn.weight"]  # nobody trained: the initial value


def _write_folder(root):
    from PIL import Image

    rng = np.random.default_rng(0)
    for d, name in enumerate(("a", "b", "c")):
        for c in range(2):
            (root / "data" / name / f"k{c}").mkdir(parents=True)
            for i in range(10):
                img = np.clip(rng.normal(60 + 50 * d + 60 * c, 20, size=(8, 8, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(img).save(root / "data" / name / f"k{c}" / f"{i}.png")


def test_adapt_a_held_out_source_end_to_end_api_and_cli(tmp_path, capsys):
    from fednorm.cli.main import main

    _write_folder(tmp_path)
    res = fednorm.run(dataset="image_folder", data_dir=str(tmp_path / "data"), partition="domains", num_clients=2,
                      partition_args={"sources": ["a", "b"]}, model="simple_cnn", method="fedbn", rounds=2, lr=0.05,
                      batch_size=8, dtype="float64", out=str(tmp_path / "run"), progress=False)
    sim = res.simulation
    assert sim.data.client_domain == [0, 1] and res.summary["client_sources"] == ["a", "b"]
    assert res.summary["final_client_accuracies"] == res.history[-1]["client_accuracies"]
    out = fednorm.adapt(tmp_path / "run", domain="c")
    assert out.num_stat_samples == 16 and out.num_test == 4 and 0 <= out.accuracy <= 1
    # the statistics are those of domain c's training images under the averaged model
    from fednorm.data import load_dataset
    from fednorm.data.datasets import dataset_to_tensors

    train = load_dataset("image_folder", tmp_path / "data", train=True)
    keep = train.domains == 2
    train.data, train.targets = train.data[keep], train.targets[keep]
    x = dataset_to_tensors(train)[0].double()
    model = sim.global_model(averaged_state(sim.global_state, sim.bank.state_dict(), sim.method.local_keys))
    bn_weight_keys = [k for k in sim.method.local_keys if k.endswith(".weight")]
    for k in bn_weight_keys:  # averaged affine of the two trained clients
        torch.testing.assert_close(out.state[k], (sim.bank.get(0)[k] + sim.bank.get(1)[k]) / 2)
    expected = batch_norm_statistics(model, x, batch_size=len(x))
    for name, (mean, var) in expected.items():
        torch.testing.assert_close(out.statistics[name][0], mean, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(out.statistics[name][1], var, rtol=1e-10, atol=1e-12)
    assert json.loads((tmp_path / "run" / "adapt-domain-c.json").read_text())["accuracy"] == out.accuracy
    assert out.new_client and "note" not in out.summary()  # c was left out of training

    # a trained source is not a new client, and the output says so (whose data it was)
    assert main(["adapt", str(tmp_path / "run"), "--domain", "b"]) == 0
    printed = json.loads(capsys.readouterr().out)
    owner = sim.data.client_domain.index(1)  # the client that held source b
    assert printed["new_client"] is False
    assert "not a new client" in printed["note"] and f"client {owner})" in printed["note"], printed["note"]

    assert main(["adapt", str(tmp_path / "run"), "--client", "1"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["source"] == "client:1" and printed["num_test"] == 4 and printed["new_client"] is False
    assert main(["adapt", str(tmp_path / "run"), "--domain", "zzz"]) == 2
    assert "Valid values are" in capsys.readouterr().err
