"""FedBN / SiloBN: what stays local, isolation between clients, reduction to FedAvg."""

import pytest
import torch

from fednorm.config import ExperimentConfig
from fednorm.engine.simulator import Simulation
from fednorm.nn.state import batch_norm_keys


def _sim(method, **kw):
    base = dict(dataset="digits", partition="dirichlet", alpha=0.3, num_clients=4, rounds=2, batch_size=32,
                lr=0.05, model="simple_cnn", norm="bn", method=method, dtype="float64")
    base.update(kw)
    return Simulation(ExperimentConfig(**base))


def test_fedbn_keeps_every_bn_tensor_local_and_silobn_only_buffers():
    fedbn, silobn = _sim("fedbn"), _sim("silobn")
    bn_all = batch_norm_keys(fedbn.model)
    assert fedbn.method.local_keys == bn_all
    assert any(k.endswith("running_mean") for k in bn_all) and any(k.endswith(".weight") for k in bn_all)
    assert silobn.method.local_keys == {k for k in bn_all if k.rsplit(".", 1)[1] in ("running_mean", "running_var", "num_batches_tracked")}
    # SiloBN shares exactly the affine BN tensors in addition to the non-BN ones
    shared_bn = set(silobn.method.shared_keys) & bn_all
    assert shared_bn == {k for k in bn_all if k.rsplit(".", 1)[1] in ("weight", "bias")}


def test_fedbn_never_changes_a_clients_bn_from_other_clients_data():
    sim = _sim("fedbn", clients_per_round=2, rounds=4)
    before = {}
    for _ in range(4):
        clients = sim.sample_clients(sim.server_round + 1)
        others = [c for c in range(4) if c not in clients]
        before = {c: (None if sim.bank.get(c) is None else {k: v.clone() for k, v in sim.bank.get(c).items()}) for c in others}
        sim.step()
        for c in others:  # clients that did not train this round kept exactly their BN state
            after = sim.bank.get(c)
            if before[c] is None:
                assert after is None
            else:
                for k, v in before[c].items():
                    assert torch.equal(v, after[k]), (c, k)
    # and the global state never carries BN values learned by clients: they stay at initialisation
    init = Simulation(sim.config).global_state
    for k in sim.method.local_keys:
        assert torch.equal(sim.global_state[k], init[k])


def test_fedbn_with_one_client_equals_fedavg():
    a = _sim("fedbn", num_clients=1, partition="iid", rounds=2)
    b = _sim("fedavg", num_clients=1, partition="iid", rounds=2)
    for _ in range(2):
        a.step(), b.step()
    model_a = a.client_model(0).state_dict()
    for k, v in b.global_state.items():
        torch.testing.assert_close(model_a[k], v, rtol=0, atol=0)


def test_fedbn_clients_differ_after_training_and_are_evaluated_personally():
    sim = _sim("fedbn", rounds=2)
    sim.step()
    metrics = sim.step().metrics
    bn = sorted(sim.method.local_keys)
    key = next(k for k in bn if k.endswith("running_mean"))
    assert not torch.equal(sim.bank.get(0)[key], sim.bank.get(1)[key])
    assert len(metrics["client_accuracies"]) == 4 and 0 <= metrics["test_accuracy"] <= 1


def test_fedbn_without_bn_warns_that_it_is_fedavg():
    with pytest.warns(UserWarning, match="equals FedAvg"):
        _sim("fedbn", norm="gn")


def test_fedbn_client_bn_after_its_first_round_ignores_other_clients_data():
    """Change client 1's training images: client 0's BN tensors after round 1 stay bit-identical."""
    a = _sim("fedbn", rounds=1)
    b = _sim("fedbn", rounds=1)
    ix1 = b.data.client_train[1]
    b.data.train_x[ix1] = torch.randn_like(b.data.train_x[ix1]) * 3 + 1  # only client 1's data differs
    a.step(), b.step()
    for k in a.method.local_keys:
        assert torch.equal(a.bank.get(0)[k], b.bank.get(0)[k]), k
    key = next(k for k in a.method.local_keys if k.endswith("running_mean"))
    assert not torch.equal(a.bank.get(1)[key], b.bank.get(1)[key])  # the change did reach client 1
    # the shared weights did mix client 1's data in: the isolation is specific to BN tensors
    shared = [k for k in a.method.shared_keys if a.global_state[k].is_floating_point()]
    assert any(not torch.equal(a.global_state[k], b.global_state[k]) for k in shared)
