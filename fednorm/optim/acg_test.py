"""FedACG: the look-ahead start, two rounds against an independent float64 computation (clients
from θ + λ·m with the proximal term, server momentum), vectorized == sequential, with HBN."""

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fednorm.config import ExperimentConfig
from fednorm.engine.simulator import Simulation
from fednorm.methods import ClientContext, FedAvg
from fednorm.models import get_model
from fednorm.optim import FedACG, compose

D = torch.float64
BASE = dict(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=3, rounds=2, batch_size=100_000,
            local_steps=2, lr=0.1, momentum=0.0, model="mlp", norm="none", dtype="float64", threads=1,
            augment=False, seed=5, eval_every=100)


def test_look_ahead_moves_shared_parameters_only():
    torch.manual_seed(0)
    model = get_model("mlp", num_classes=3, in_channels=1, input_size=4, norm="bn").double()
    method = compose(FedAvg(), FedACG(lam=0.7, beta=0.0), num_clients=2)
    method.setup(model)
    opt = method.client_opt
    g = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.manual_seed(1)
    m = {k: torch.randn_like(v, dtype=D) for k, v in opt.m.items()}
    opt.m = {k: v.clone() for k, v in m.items()}
    ctx = ClientContext(server_round=2, client_id=0, model=model, x=torch.zeros(0), y=torch.zeros(0, dtype=torch.long),
                        global_state=g, local_state={})
    method.client_begin(ctx)
    state = model.state_dict()
    params = {n for n, _ in model.named_parameters()}
    assert set(m) == params  # FedAvg shares every parameter
    for k, v in state.items():
        want = g[k] + 0.7 * m[k] if k in params else g[k]  # BN statistics are sent as they are
        torch.testing.assert_close(v, want, rtol=0, atol=1e-15)


def _client_by_hand(theta, x, y, lr, beta, steps, model):
    """``steps`` full-batch gradient steps on CE + (β/2)‖w − θ̃‖² from θ̃ = ``theta``."""
    w = {k: v.clone() for k, v in theta.items()}
    for _ in range(steps):
        wg = {k: v.clone().requires_grad_(True) for k, v in w.items()}
        loss = F.cross_entropy(functional_call(model, wg, (x,)), y)
        loss = loss + 0.5 * beta * sum(((wg[k] - theta[k]) ** 2).sum() for k in wg)
        grads = torch.autograd.grad(loss, list(wg.values()))
        w = {k: (wg[k] - lr * gk).detach() for k, gk in zip(wg, grads)}
    return w


def test_two_rounds_equal_an_independent_computation():
    lam, beta, lr = 0.85, 0.05, BASE["lr"]
    sim = Simulation(ExperimentConfig(**BASE, executor="sequential", client_opt="fedacg",
                                      client_opt_args={"lam": lam, "beta": beta}))
    data, model = sim.data, sim.model
    theta = {k: v.clone() for k, v in sim.global_state.items()}
    m = {k: torch.zeros_like(v) for k, v in theta.items()}
    sizes = torch.tensor([len(ix) for ix in data.client_train], dtype=D)
    for _ in sim.rounds():
        start = {k: theta[k] + lam * m[k] for k in theta}  # the look-ahead
        clients = [_client_by_hand(start, data.train_x[ix], data.train_y[ix], lr, beta, BASE["local_steps"], model)
                   for ix in data.client_train]
        delta = {k: sum(s * (w[k] - start[k]) for s, w in zip(sizes, clients)) / sizes.sum() for k in theta}
        m = {k: lam * m[k] + delta[k] for k in theta}
        theta = {k: theta[k] + m[k] for k in theta}
        for k in theta:
            torch.testing.assert_close(sim.global_state[k], theta[k], rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(sim.method.client_opt.m[k], m[k], rtol=1e-8, atol=1e-12)
    assert all(float(v.abs().max()) > 0 for v in m.values())


def test_fedacg_vectorized_equals_sequential_and_is_picked_by_auto():
    kw = dict(BASE, batch_size=16, local_steps=3, rounds=3, norm="gn", client_opt="fedacg",
              client_opt_args={"beta": 0.01})
    seq = Simulation(ExperimentConfig(**kw, executor="sequential"))
    vec = Simulation(ExperimentConfig(**kw, executor="auto"))
    assert vec.executor.name == "vectorized"
    for _ in zip(seq.rounds(), vec.rounds()):
        pass
    for k in seq.global_state:
        torch.testing.assert_close(vec.global_state[k], seq.global_state[k], rtol=1e-9, atol=1e-11)


def test_fedacg_with_hbn_learns_and_leaves_alpha_and_statistics_out_of_the_momentum():
    cfg = ExperimentConfig(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=4, clients_per_round=2,
                           rounds=4, eval_every=4, batch_size=16, lr=0.05, momentum=0.0, model="simple_cnn", norm="hbn",
                           method="hbn", threads=1, augment=False, seed=0, client_opt="fedacg")
    sim = Simulation(cfg)
    for _ in sim.rounds():
        pass
    keys = set(sim.method.client_opt.m)
    params = {n for n, _ in sim.model.named_parameters()}
    assert keys and keys <= params and not (keys & sim.method.local_keys)
    assert sim.history[-1]["test_accuracy"] > 0.5, sim.history[-1]


def test_compare_variants_take_client_optimizers_and_the_centralized_reference(tmp_path, monkeypatch):
    from fednorm.cli.main import main

    monkeypatch.setattr("fednorm.plotting.plot_comparison", lambda *a, **k: None)
    argv = ["compare", "--variants", "fedavg:gn,fedavg+fedacg:gn,fedsam:gn,centralized:gn", "--rounds", "1",
            "--num-clients", "3", "--model", "mlp", "--batch-size", "16", "--local-steps", "2", "--quiet", "--threads", "1",
            "--out", str(tmp_path / "c")]
    assert main(argv) == 0
    table = (tmp_path / "c" / "results.md").read_text()
    for label in ("| fedavg+gn |", "| fedavg+gn(client_opt=fedacg) |", "| fedavg+gn(client_opt=fedsam) |", "| centralized+gn |"):
        assert label in table, table
