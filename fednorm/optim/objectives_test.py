"""FedLC, FedRS, FedDecorr: calibrated logits and their cross-entropy gradients against hand
computations, the decorrelation loss against its closed form (float64), and the hooks' scope."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from fednorm.config import ExperimentConfig
from fednorm.engine.simulator import Simulation
from fednorm.errors import ConfigError
from fednorm.methods import ClientContext, FedAvg
from fednorm.models import get_model
from fednorm.optim import FedDecorr, FedLC, FedRS, get_client_optimizer
from fednorm.optim.objectives import decorrelation_loss

D = torch.float64


def _model():
    torch.manual_seed(0)
    return get_model("mlp", num_classes=4, in_channels=1, input_size=4, norm="none").double()


def _ctx(model, y):
    return ClientContext(server_round=1, client_id=0, model=model, x=torch.zeros(len(y), 1, 4, 4, dtype=torch.float64),
                         y=y, global_state={}, local_state={})


def _setup(opt, model):
    method = FedAvg()
    method.setup(model)
    opt.setup(model, method, num_clients=1)
    return opt


def _head_grad_by_hand(model, x, yb, calibrated):
    """d CE(calibrated logits)/d head.weight = (softmax(c) − onehot)ᵀ(∂c/∂z) h / B, written out."""
    h = model.forward_features(x).detach()
    z = model.head(h).detach()
    c, dc_dz = calibrated(z)
    p = torch.exp(c - torch.logsumexp(c, dim=1, keepdim=True))
    onehot = F.one_hot(yb, z.shape[1]).double()
    loss = -(onehot * torch.log(p)).nan_to_num(0.0).sum(1).mean()
    dz = (p - onehot) * dc_dz / len(yb)
    return loss, dz.t() @ h


@pytest.mark.parametrize("absent", ["inf", "clamp"])
def test_fedlc_calibrated_logits_and_gradient_match_hand_computation(absent):
    model = _model()
    y_client = torch.tensor([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 2])  # class 3 absent
    counts = torch.tensor([16.0, 1.0, 2.0, 0.0], dtype=D)
    tau = 0.7
    n = counts.clamp(min=1) if absent == "clamp" else counts
    margins = tau * n ** -0.25
    assert torch.isinf(margins[3]) == (absent == "inf")
    opt = _setup(FedLC(tau=tau, absent=absent), model)
    ctx = _ctx(model, y_client)
    opt.begin(ctx)
    torch.manual_seed(1)
    x = torch.randn(6, 1, 4, 4, dtype=D)
    yb = torch.tensor([0, 1, 2, 0, 2, 0])
    model.train()
    out = model(x)
    z = model.head(model.forward_features(x))
    torch.testing.assert_close(out, z - margins, rtol=0, atol=1e-15)
    loss = F.cross_entropy(out, yb)
    model.zero_grad()
    loss.backward()
    want_loss, want_grad = _head_grad_by_hand(model, x, yb, lambda z: (z - margins, torch.ones_like(z)))
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(model.head.weight.grad, want_grad, rtol=1e-10, atol=1e-14)
    assert torch.isfinite(model.head.weight.grad).all()
    opt.end(ctx)
    torch.testing.assert_close(model(x), z)  # hook removed


def test_fedlc_one_class_client_has_zero_loss_in_reproduce_mode():
    """The released code's infinite margins: a one-class client's other logits are −∞, its loss
    and gradients 0 (the paper's 10% / 9.72% one-class cells); with clamped counts it learns."""
    model = _model()
    x = torch.randn(5, 1, 4, 4, dtype=D)
    for absent, zero in (("inf", True), ("clamp", False)):
        opt = _setup(FedLC(absent=absent), model)
        ctx = _ctx(model, torch.full((20,), 2))
        opt.begin(ctx)
        model.train()
        loss = F.cross_entropy(model(x), torch.full((5,), 2))
        model.zero_grad()
        loss.backward()
        opt.end(ctx)
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        assert torch.isfinite(grads).all()
        assert (float(loss.detach()) == 0.0 and not grads.any()) == zero


def test_fedrs_restricted_logits_and_gradient_match_hand_computation():
    model = _model()
    alpha = 0.3
    opt = _setup(FedRS(alpha=alpha), model)
    ctx = _ctx(model, torch.tensor([1, 1, 3, 3, 3]))  # classes 0 and 2 absent
    scales = torch.tensor([alpha, 1.0, alpha, 1.0], dtype=D)
    opt.begin(ctx)
    x = torch.randn(4, 1, 4, 4, dtype=D)
    yb = torch.tensor([1, 3, 3, 1])
    model.train()
    out = model(x)
    z = model.head(model.forward_features(x))
    torch.testing.assert_close(out, z * scales, rtol=0, atol=1e-15)
    loss = F.cross_entropy(out, yb)
    model.zero_grad()
    loss.backward()
    want_loss, want_grad = _head_grad_by_hand(model, x, yb, lambda z: (z * scales, scales.expand_as(z)))
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(model.head.weight.grad, want_grad, rtol=1e-10, atol=1e-14)
    model.eval()
    torch.testing.assert_close(model(x), z)  # evaluation sees the plain logits
    opt.end(ctx)


def _decorr_closed_form(z, eps=1e-8):
    """Σ_{i≠j} ρ_ij² / (d(d−1)) / N with ρ = XᵀX of the batch-standardised features, one loop per entry."""
    n, d = z.shape
    mean = z.sum(0) / n
    var = ((z - mean) ** 2).sum(0) / (n - 1)
    x = (z - mean) / torch.sqrt(var + eps)
    total = 0.0
    for i, j in itertools.product(range(d), range(d)):
        if i != j:
            total += float((x[:, i] * x[:, j]).sum()) ** 2
    return total / (d * (d - 1)) / n


def test_feddecorr_loss_equals_the_closed_form():
    torch.manual_seed(2)
    z = torch.randn(7, 5, dtype=D) @ torch.randn(5, 5, dtype=D)  # correlated features
    assert float(decorrelation_loss(z)) == pytest.approx(_decorr_closed_form(z), rel=1e-12)
    stack = torch.randn(3, 7, 5, dtype=D)
    torch.testing.assert_close(decorrelation_loss(stack), torch.stack([decorrelation_loss(s) for s in stack]))
    assert float(decorrelation_loss(z[:1])) == 0.0  # one sample: the code's guard


def test_feddecorr_adds_beta_times_the_loss_of_the_head_input():
    model = _model()
    opt = _setup(FedDecorr(beta=0.25), model)
    ctx = _ctx(model, torch.tensor([0, 1, 2]))
    opt.begin(ctx)
    x = torch.randn(6, 1, 4, 4, dtype=D)
    model.train()
    data = F.cross_entropy(model(x), torch.tensor([0, 1, 2, 3, 0, 1]))
    total = opt.loss(ctx, model, data)
    h = model.forward_features(x)
    assert float((total - data).detach()) == pytest.approx(0.25 * _decorr_closed_form(h.detach()), rel=1e-10)
    opt.end(ctx)
    assert opt._hook is None and not opt._features


def test_defaults_and_validation():
    assert FedLC().tau == 1.0 and FedLC().absent == "inf"
    assert FedRS().alpha == 0.5
    assert FedDecorr().beta == 0.1 and FedDecorr.PAPER_BETA == 0.5
    with pytest.raises(ConfigError, match="absent"):
        get_client_optimizer("fedlc", absent="zero")
    with pytest.raises(ConfigError, match="alpha"):
        get_client_optimizer("fedrs", alpha=1.5)
    with pytest.raises(ConfigError, match="beta"):
        get_client_optimizer("feddecorr", beta=-1)


@pytest.mark.parametrize("client_opt", ["fedlc", "fedrs", "feddecorr"])
def test_objectives_run_vectorized_and_change_training(client_opt):
    cfg = dict(dataset="digits", partition="classes", num_clients=5, rounds=1, batch_size=16, model="mlp", norm="ln",
               checkpoint_every=0, out=None, threads=1, dtype="float64", seed=0)
    plain = Simulation(ExperimentConfig(**cfg))
    sim = Simulation(ExperimentConfig(**cfg, client_opt=client_opt))
    assert sim.executor.name == "vectorized", sim.executor_note
    a, b = plain.step(), sim.step()
    assert a.train_loss != b.train_loss


def test_compare_runs_client_objectives_named_in_methods(tmp_path, monkeypatch):
    """``fednorm compare --methods fedavg,fedlc`` runs FedLC as FedAvg with its objective, and
    ``--client-opts`` crosses client optimizers with the methods and norms."""
    from fednorm.cli.main import main

    monkeypatch.setattr("fednorm.plotting.plot_comparison", lambda *a, **k: None)
    tiny = ["--rounds", "1", "--num-clients", "3", "--model", "mlp", "--batch-size", "64", "--quiet", "--threads", "1"]
    assert main(["compare", *tiny, "--methods", "fedavg,fedlc", "--norms", "ln", "--out", str(tmp_path / "a")]) == 0
    table = (tmp_path / "a" / "results.md").read_text()
    assert "fedavg+ln |" in table and "fedavg+ln(client_opt=fedlc)" in table
    assert main(["compare", *tiny, "--methods", "fedavg", "--client-opts", "none,fedrs,feddecorr",
                 "--out", str(tmp_path / "b")]) == 0
    table = (tmp_path / "b" / "results.md").read_text()
    assert "client_opt=fedrs" in table and "client_opt=feddecorr" in table
