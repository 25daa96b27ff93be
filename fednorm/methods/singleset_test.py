"""SingleSet: local training only, equal to training the client alone."""

import torch

from fednorm.config import ExperimentConfig
from fednorm.data.federated import FederatedData
from fednorm.engine.simulator import Simulation


def _cfg(**kw):
    base = dict(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=3, rounds=2, batch_size=16, lr=0.05,
                model="simple_cnn", norm="bn", method="singleset", dtype="float64")
    base.update(kw)
    return ExperimentConfig(**base)


def test_singleset_client_equals_that_client_trained_alone():
    multi = Simulation(_cfg())
    d = multi.data
    alone_data = FederatedData(info=d.info, train_x=d.train_x.clone(), train_y=d.train_y.clone(), test_x=d.test_x.clone(),
                               test_y=d.test_y.clone(), client_train=[d.client_train[0].clone()], client_test=[d.client_test[0].clone()])
    alone = Simulation(_cfg(num_clients=1, method="fedavg"), data=alone_data)
    for _ in range(2):
        multi.step(), alone.step()
    mine = multi.client_model(0).state_dict()
    for k, v in alone.global_state.items():
        torch.testing.assert_close(mine[k], v, rtol=1e-10, atol=1e-12)  # vectorized: 3 vs 1 stacked clients round differently
    assert multi.uplink_bytes == 0 and multi.downlink_bytes == 0 and multi.comm_rounds == 0
    # every tensor stays local and clients end with different models
    assert multi.method.shared_keys == []
    w = next(k for k in mine if k.endswith("weight"))
    assert not torch.equal(multi.bank.get(0)[w], multi.bank.get(1)[w])


def test_singleset_is_evaluated_per_client():
    sim = Simulation(_cfg(rounds=1))
    m = sim.step().metrics
    assert len(m["client_accuracies"]) == 3 and 0 <= m["mean_client_accuracy"] <= 1
