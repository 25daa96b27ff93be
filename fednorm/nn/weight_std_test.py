"""Weight standardization: standardized filters have zero mean and unit variance per output
channel (float64, against a per-channel loop), the conversion keeps parameters and state keys,
``gn_ws`` builds every model, and the stacked convolution equals each client's own."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fednorm.models import get_model, list_models
from fednorm.nn.stacked import StackedStdConv2d, from_client_layout, stack_model, to_client_layout
from fednorm.nn.weight_std import (
    StdConv2d,
    convert_weight_standardization,
    revert_weight_standardization,
    standardize_weight,
)

D = torch.float64


def test_standardized_weights_have_zero_mean_and_unit_variance_per_output_channel():
    torch.manual_seed(0)
    conv = StdConv2d(3, 5, 3, groups=1, bias=True, eps=0.0, dtype=D)
    with torch.no_grad():
        conv.weight.mul_(torch.linspace(0.1, 3.0, 5, dtype=D).view(5, 1, 1, 1)).add_(0.7)
    w_hat = standardize_weight(conv.weight, conv.eps).detach()
    for o in range(5):  # an independent computation, one output channel at a time
        w = conv.weight[o].flatten()
        mean = w.sum() / w.numel()
        var = ((w - mean) ** 2).sum() / w.numel()
        torch.testing.assert_close(w_hat[o].flatten(), (w - mean) / var.sqrt(), rtol=1e-12, atol=1e-12)
        assert abs(float(w_hat[o].mean())) < 1e-12
        assert float(w_hat[o].var(correction=0)) == pytest.approx(1.0, abs=1e-12)
    x = torch.randn(2, 3, 6, 6, dtype=D)
    torch.testing.assert_close(conv(x).detach(), F.conv2d(x, w_hat, conv.bias.detach()))


def test_eps_is_timms_default_and_bounds_a_constant_filter():
    conv = StdConv2d(2, 1, 1, bias=False)
    assert conv.eps == 1e-6
    with torch.no_grad():
        conv.weight.fill_(0.3)  # zero variance: eps keeps the standardized filter finite (all zero)
    assert torch.equal(standardize_weight(conv.weight, conv.eps), torch.zeros_like(conv.weight))


def test_conversion_keeps_parameters_and_state_keys_and_reverts():
    torch.manual_seed(1)
    model = get_model("simple_cnn", norm="gn", in_channels=1, input_size=8)
    keys = list(model.state_dict())
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    ws = convert_weight_standardization(model, eps=1e-5)
    convs = [m for m in ws.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(isinstance(m, StdConv2d) and m.eps == 1e-5 for m in convs)
    assert list(ws.state_dict()) == keys
    for k, v in ws.state_dict().items():
        assert torch.equal(v, weights[k])
    back = revert_weight_standardization(ws)
    assert not any(isinstance(m, StdConv2d) for m in back.modules())


@pytest.mark.parametrize("name", [m for m in list_models() if m != "mlp"])
def test_gn_ws_builds_every_conv_model(name):
    in_ch, size = (3, 32)
    model = get_model(name, norm="gn_ws", norm_args={"ws_eps": 1e-7}, in_channels=in_ch, input_size=size)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(type(m) is StdConv2d and m.eps == 1e-7 for m in convs)
    assert any(isinstance(m, nn.GroupNorm) for m in model.modules())
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def test_stacked_std_conv_equals_each_clients_own():
    torch.manual_seed(2)
    model = get_model("simple_cnn", norm="gn_ws", in_channels=1, input_size=8).double()
    k = 3
    stacked = stack_model(model, k, example_input=torch.randn(4, 1, 8, 8, dtype=D))  # verifies client by client
    assert any(isinstance(m, StackedStdConv2d) for m in stacked.modules())
    states = []
    for i in range(k):
        states.append({n: t + 0.1 * (i + 1) * torch.randn_like(t) for n, t in model.state_dict().items()})
    stacked.load_state_dict({n: torch.stack([s[n] for s in states]) for n in states[0]})
    xs = torch.randn(k, 5, 1, 8, 8, dtype=D)
    out = from_client_layout(stacked(to_client_layout(xs)), k)
    for i in range(k):
        model.load_state_dict(states[i])
        torch.testing.assert_close(out[i], model(xs[i]), rtol=1e-10, atol=1e-12)
