"""FedSAM: one local step against the two-pass formula computed independently in float64, the
second pass leaving BatchNorm statistics alone, and the executor choice."""

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fednorm.config import ExperimentConfig
from fednorm.engine.local import LocalSpec, train_local
from fednorm.engine.simulator import Simulation
from fednorm.errors import ConfigError
from fednorm.methods import ClientContext, FedAvg
from fednorm.models import get_model
from fednorm.optim import FedSAM, compose
from fednorm.optim.sam import sam_perturbation, stacked_sam_perturbation

D = torch.float64


def _model(norm):
    torch.manual_seed(0)
    return get_model("mlp", num_classes=3, in_channels=1, input_size=4, norm=norm).double()


def _two_pass_step(model, x, y, rho, lr):
    """w − lr·∇L(w + ρ·g/‖g‖), g = ∇L(w), from a functional copy of the weights."""
    names = [n for n, p in model.named_parameters()]
    w = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    bufs = {n: b.detach().clone() for n, b in model.named_buffers()}

    def loss(params):
        return F.cross_entropy(functional_call(model, {**params, **{k: v.clone() for k, v in bufs.items()}}, (x,)), y)

    g = torch.autograd.grad(loss(w), [w[n] for n in names])
    norm = torch.sqrt(sum((gi ** 2).sum() for gi in g))
    ascent = {n: (w[n] + rho * gi / norm).detach().requires_grad_(True) for n, gi in zip(names, g)}
    g2 = torch.autograd.grad(loss(ascent), [ascent[n] for n in names])
    return {n: (w[n] - lr * gi).detach() for n, gi in zip(names, g2)}


@pytest.mark.parametrize("norm", ["none", "bn"])
def test_one_fedsam_step_equals_the_two_pass_formula(norm):
    model = _model(norm)
    torch.manual_seed(1)
    x = torch.randn(8, 1, 4, 4, dtype=D)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    rho, lr = 0.3, 0.1
    model.train()
    want = _two_pass_step(model, x, y, rho, lr)
    # The statistics one ordinary forward pass at w leaves.
    ref = _model(norm)
    ref.train()
    ref(x)
    method = compose(FedAvg(), FedSAM(rho=rho), num_clients=1)
    method.setup(model)
    ctx = ClientContext(server_round=1, client_id=0, model=model, x=x, y=y, global_state={}, local_state={}, lr=lr)
    assert method.has_client_gradient
    train_local(model, x, y, [torch.arange(8)], lr=lr, spec=LocalSpec(batch_size=8),
                grad_hook=lambda m, closure: method.client_gradient(ctx, m, closure))
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), want[n], rtol=1e-12, atol=1e-14)
    # The second pass changed no buffer: the running statistics are those of one pass at w.
    for (n, b), (_, rb) in zip(model.named_buffers(), ref.named_buffers()):
        assert torch.equal(b, rb), n
    # And it differs from a plain SGD step (the test can fail).
    plain = _model(norm)
    train_local(plain, x, y, [torch.arange(8)], lr=lr, spec=LocalSpec(batch_size=8))
    assert not torch.allclose(plain.head.weight, model.head.weight)


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_fedsam_rho0_equals_fedavg(executor):
    base = dict(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=4, clients_per_round=2, rounds=2,
                batch_size=32, lr=0.05, model="mlp", norm="bn", dtype="float64", threads=1, augment=False, seed=3,
                executor=executor)
    ref = Simulation(ExperimentConfig(**base))
    for _ in ref.rounds():
        pass
    sam = Simulation(ExperimentConfig(**base, client_opt="fedsam", client_opt_args={"rho": 0.0}))
    assert sam.executor.name == executor
    for _ in sam.rounds():
        pass
    for k in ref.global_state:
        assert torch.equal(ref.global_state[k], sam.global_state[k]), k


def test_fedsam_runs_vectorized_under_auto():
    sim = Simulation(ExperimentConfig(dataset="digits", num_clients=3, rounds=1, client_opt="fedsam",
                                      checkpoint_every=0, out=None))
    assert sim.executor.name == "vectorized", sim.executor_note


def test_stacked_perturbation_is_each_clients_own():
    """Row i of the stacked ascent step is sam_perturbation of client i's gradients alone."""
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(3, 4, 5, generator=gen, dtype=torch.float64), torch.randn(3, 7, generator=gen, dtype=torch.float64)]
    grads[0][1] *= 100.0  # clients with very different norms
    stacked = stacked_sam_perturbation(grads, rho=0.05)
    for i in range(3):
        want = sam_perturbation([g[i] for g in grads], rho=0.05)
        for got, w in zip(stacked, want):
            torch.testing.assert_close(got[i], w, rtol=1e-14, atol=0)
        norm = torch.sqrt(sum(g[i].pow(2).sum() for g in stacked))
        assert float(norm) == pytest.approx(0.05, rel=1e-12)


def test_fedsam_with_hbn_learns():
    cfg = ExperimentConfig(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=4, clients_per_round=2,
                           rounds=4, batch_size=16, lr=0.05, model="simple_cnn", norm="hbn", method="hbn", threads=1,
                           augment=False, seed=0, client_opt="fedsam", executor="auto", eval_every=4)
    sim = Simulation(cfg)
    assert type(sim.method).__name__ == "OptimizedHBN"
    for _ in sim.rounds():
        pass
    assert sim.history[-1]["test_accuracy"] > 0.5, sim.history[-1]  # 10 classes: chance is 0.1
