"""FedWon's pieces against independent float64 computations: scaled weight standardization (zero
mean and variance γ²/fan-in per output channel, times the gain) and adaptive gradient clipping
(the unit-wise ratio); the norms, the executors and the HBN composition."""

import math

import pytest
import torch
import torch.nn.functional as F

from fednorm.config import ExperimentConfig
from fednorm.engine.simulator import Simulation
from fednorm.models import get_model
from fednorm.nn.nf import RELU_GAIN, ScaledStdConv2d, adaptive_grad_clip_, default_agc_clip
from fednorm.nn.stacked import stack_model

D = torch.float64


def test_relu_gain_is_one_over_the_std_of_relu_of_a_standard_normal():
    # E[relu(z)^2] = 1/2, E[relu(z)] = 1/sqrt(2 pi): Var = 1/2 - 1/(2 pi)
    assert RELU_GAIN == pytest.approx(1 / math.sqrt(0.5 - 1 / (2 * math.pi)), rel=1e-15)


def test_scaled_ws_weight_per_output_channel_against_a_loop():
    torch.manual_seed(0)
    conv = ScaledStdConv2d(3, 5, 3, padding=1, dtype=D, gamma=1.3, eps=1e-6)
    with torch.no_grad():
        conv.weight.mul_(4).add_(0.7)
        conv.gain.copy_(torch.rand(5, 1, 1, 1, dtype=D) + 0.5)
    w = conv.weight.detach()
    fan_in = 3 * 3 * 3
    want = torch.empty_like(w)
    for o in range(5):
        vals = w[o].reshape(-1).tolist()
        mean = sum(vals) / fan_in
        var = sum((v - mean) ** 2 for v in vals) / fan_in
        want[o] = float(conv.gain.detach()[o]) * 1.3 * (w[o] - mean) / math.sqrt(var + 1e-6) / math.sqrt(fan_in)
        # the defining property: zero mean, variance gamma^2 * gain^2 / fan_in (up to eps)
        std = (want[o] / float(conv.gain.detach()[o])).reshape(-1)
        assert abs(float(std.mean())) < 1e-15
        assert float(std.var(correction=0)) == pytest.approx(1.3**2 / fan_in * var / (var + 1e-6), rel=1e-12)
    x = torch.randn(2, 3, 6, 6, dtype=D)
    torch.testing.assert_close(conv(x), F.conv2d(x, want, conv.bias, padding=1), rtol=1e-12, atol=1e-13)
    assert "gain" in dict(conv.named_parameters())


def test_agc_clips_the_unitwise_ratio_against_a_loop():
    torch.manual_seed(1)
    w = torch.randn(4, 3, 2, 2, dtype=D, requires_grad=True)
    b = torch.randn(4, dtype=D, requires_grad=True)
    tiny = torch.full((3,), 1e-5, dtype=D, requires_grad=True)  # below eps: max norm is clip * 1e-3
    w.grad = torch.randn_like(w) * torch.tensor([0.001, 1.0, 0.002, 5.0], dtype=D).view(4, 1, 1, 1)
    b.grad = torch.randn_like(b) * 10
    tiny.grad = torch.randn_like(tiny)
    grads = [t.grad.clone() for t in (w, b, tiny)]
    clip = 0.01
    adaptive_grad_clip_([w, b, tiny], clip)
    # by hand: rows of w are units; b and tiny are one unit each
    for o in range(4):
        wn = math.sqrt(sum(v * v for v in w[o].detach().reshape(-1).tolist()))
        gn = math.sqrt(sum(v * v for v in grads[0][o].reshape(-1).tolist()))
        mx = clip * max(wn, 1e-3)
        want = grads[0][o] * (mx / gn) if gn > mx else grads[0][o]
        torch.testing.assert_close(w.grad[o], want, rtol=1e-13, atol=0)
    clipped_rows = [o for o in range(4) if not torch.equal(w.grad[o], grads[0][o])]
    assert 0 < len(clipped_rows) < 4  # some units clipped, some not: the test can fail both ways
    for t, g in ((b, grads[1]), (tiny, grads[2])):
        tn = float(t.detach().norm())
        mx = clip * max(tn, 1e-3)
        gn = float(g.norm())
        assert gn > mx
        torch.testing.assert_close(t.grad, g * (mx / gn), rtol=1e-13, atol=0)


def test_stacked_agc_clips_each_clients_units_apart():
    torch.manual_seed(2)
    ws = [torch.randn(3, 2, dtype=D) for _ in range(2)]
    gs = [torch.randn(3, 2, dtype=D) * s for s in (0.001, 1.0)]
    singles = []
    for w, g in zip(ws, gs):
        p = w.clone().requires_grad_(True)
        p.grad = g.clone()
        adaptive_grad_clip_([p], 0.05)
        singles.append(p.grad)
    stacked = torch.stack(ws).requires_grad_(True)
    stacked.grad = torch.stack(gs)
    adaptive_grad_clip_([stacked], 0.05, lead=1)
    torch.testing.assert_close(stacked.grad, torch.stack(singles), rtol=0, atol=0)


def test_fedwon_model_and_agc_defaults():
    model = get_model("simple_cnn", num_classes=10, in_channels=1, input_size=16, norm="fedwon")
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(isinstance(m, ScaledStdConv2d) for m in convs)
    assert not any(isinstance(m, (torch.nn.BatchNorm2d, torch.nn.GroupNorm)) for m in model.modules())
    assert default_agc_clip("fedwon", None) == 0.01 and default_agc_clip("hbn_sws", None) == 0.01
    assert default_agc_clip("bn", None) is None and default_agc_clip("fedwon", 0.0) is None
    assert default_agc_clip("bn", 0.02) == 0.02


def test_stacked_scaled_ws_equals_each_client():
    torch.manual_seed(3)
    model = get_model("simple_cnn", num_classes=4, in_channels=1, input_size=8, norm="fedwon").double()
    net = stack_model(model, 2, example_input=torch.randn(4, 1, 8, 8, dtype=D))
    assert any(type(m).__name__ == "StackedScaledStdConv2d" for m in net.modules())


BASE = dict(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=4, clients_per_round=2, batch_size=16,
            lr=0.05, momentum=0.9, model="simple_cnn", threads=1, augment=False, seed=0)


def test_fedwon_vectorized_equals_sequential_with_agc_acting():
    kw = dict(BASE, rounds=2, norm="fedwon", dtype="float64", eval_every=100, local_steps=3)
    seq = Simulation(ExperimentConfig(**kw, executor="sequential"))
    vec = Simulation(ExperimentConfig(**kw, executor="auto"))
    assert vec.executor.name == "vectorized" and seq.spec.agc_clip == 0.01
    assert seq.spec.agc_skip == {"head.weight", "head.bias"} & {n for n, _ in seq.model.named_parameters()}
    for _ in zip(seq.rounds(), vec.rounds()):
        pass
    for k in seq.global_state:
        torch.testing.assert_close(vec.global_state[k], seq.global_state[k], rtol=1e-9, atol=1e-11)
    off = Simulation(ExperimentConfig(**kw, executor="sequential", agc_clip=0))
    for _ in off.rounds():
        pass
    assert off.spec.agc_clip is None
    assert not torch.allclose(off.global_state["head.weight"], seq.global_state["head.weight"])  # AGC acted


@pytest.mark.parametrize("norm,method", [("fedwon", "fedavg"), ("hbn_sws", "hbn")])
def test_fedwon_and_fedwon_with_hbn_learn(norm, method):
    sim = Simulation(ExperimentConfig(**BASE, rounds=4, eval_every=4, norm=norm, method=method))
    for _ in sim.rounds():
        pass
    assert sim.history[-1]["test_accuracy"] > 0.5, sim.history[-1]
