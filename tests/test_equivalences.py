"""Exact identities of the engine, in float64 against independent computations."""

import copy

import pytest
import torch
import torch.nn.functional as F

from fednorm.config import ExperimentConfig
from fednorm.engine.simulator import Simulation


def _full_batch_grad(model, x, y):
    loss = F.cross_entropy(model(x), y)
    params = [p for p in model.parameters()]
    return torch.autograd.grad(loss, params)


def test_fedavg_one_client_one_step_equals_plain_sgd_with_bn():
    """FedAvg, 1 client, 1 full-batch step == one SGD step (weights, BN running stats, counter)."""
    cfg = ExperimentConfig(
        dataset="digits", partition="iid", num_clients=1, rounds=1, local_steps=1, batch_size=100_000,
        lr=0.3, momentum=0.9, weight_decay=1e-3, model="mlp", norm="bn", dtype="float64", augment=False,
    )
    sim = Simulation(cfg)
    ref = copy.deepcopy(sim.model)
    ref.load_state_dict(sim.global_state)
    ref.train()
    x, y = sim.data.train_x, sim.data.train_y
    grads = _full_batch_grad(ref, x, y)  # also updates ref's BN running statistics once
    with torch.no_grad():
        for p, g in zip(ref.parameters(), grads):
            p -= cfg.lr * (g + cfg.weight_decay * p)
    sim.step()
    expected = ref.state_dict()
    for key, value in sim.global_state.items():
        torch.testing.assert_close(value, expected[key], rtol=1e-10, atol=1e-12, msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize("dsgd", [False, True])
def test_fedavg_full_batch_steps_equal_centralized_gradient_descent(dsgd):
    """K iid clients, one full-batch step each, weighted by size == GD on the union (no norm)."""
    cfg = ExperimentConfig(
        dataset="digits", partition="iid", num_clients=4, rounds=3, local_steps=1, batch_size=100_000,
        lr=0.5, model="mlp", norm="none", dtype="float64", augment=False, dsgd=dsgd,
    )
    sim = Simulation(cfg)
    ref = copy.deepcopy(sim.model)
    ref.load_state_dict(sim.global_state)
    x, y = sim.data.train_x, sim.data.train_y
    for _ in range(cfg.rounds):
        grads = _full_batch_grad(ref, x, y)
        with torch.no_grad():
            for p, g in zip(ref.parameters(), grads):
                p -= cfg.lr * g
        sim.step()
    for key, value in ref.state_dict().items():
        torch.testing.assert_close(sim.global_state[key], value, rtol=1e-9, atol=1e-11)


def test_dsgd_client_momentum_is_dampened_and_persistent():
    """DSGD with equal iid clients and momentum beta == GD with m <- beta*m + (1-beta)*g."""
    beta = 0.9
    cfg = ExperimentConfig(
        dataset="digits", partition="iid", num_clients=3, rounds=4, batch_size=100_000, lr=0.5,
        momentum=beta, model="mlp", norm="none", dtype="float64", augment=False, dsgd=True,
        method_args={"weighting": "uniform"},
    )
    sim = Simulation(cfg)
    sizes = sim.data.client_sizes()
    ref = copy.deepcopy(sim.model)
    ref.load_state_dict(sim.global_state)
    momenta = [None] * 3
    for _ in range(cfg.rounds):
        new_params = []
        state = {k: v.clone() for k, v in ref.state_dict().items()}
        for c in range(3):
            ref.load_state_dict(state)
            ix = sim.data.client_train[c]
            g = _full_batch_grad(ref, sim.data.train_x[ix], sim.data.train_y[ix])
            m = [(1 - beta) * gi if momenta[c] is None else beta * mi + (1 - beta) * gi for gi, mi in zip(g, momenta[c] or g)]
            momenta[c] = m
            new_params.append([p.detach() - cfg.lr * mi for p, mi in zip(ref.parameters(), m)])
        with torch.no_grad():
            for j, p in enumerate(ref.parameters()):
                p.copy_(sum(new_params[c][j] for c in range(3)) / 3)
        sim.step()
    assert len(set(sizes.tolist())) <= 2
    for key, value in ref.state_dict().items():
        torch.testing.assert_close(sim.global_state[key], value, rtol=1e-9, atol=1e-11)
