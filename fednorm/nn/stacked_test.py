"""Stacked models: layout, per-client equivalence with the base model, refusal of unsupported code."""

import pytest
import torch
from torch import nn

from fednorm.models import get_model, list_models
from fednorm.nn.stacked import NotStackableError, from_client_layout, stack_model, to_client_layout


def _clients_states(model, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    states = []
    for i in range(k):
        s = {}
        for name, t in model.state_dict().items():
            s[name] = t + 0.1 * (i + 1) * torch.randn(t.shape, generator=g, dtype=t.dtype) if t.is_floating_point() else t.clone()
        states.append(s)
    return states


@pytest.mark.parametrize("name", ["simple_cnn", "mlp", "fedbn_cnn", "ln_cnn", "resnet20"])
@pytest.mark.parametrize("norm", ["bn", "gn", "ln", "none"])
def test_stacked_forward_backward_equal_each_clients_own_model(name, norm):
    torch.manual_seed(0)
    model = get_model(name, num_classes=10, in_channels=1, input_size=8, norm=norm).double()
    k = 3
    x = torch.randn(4, 1, 8, 8, dtype=torch.float64)
    stacked = stack_model(model, k, example_input=x.float() if False else x)
    states = _clients_states(model, k)
    stacked.load_state_dict({n: torch.stack([s[n] for s in states]) for n in states[0]})
    xs = torch.stack([x * (i + 1) for i in range(k)])
    stacked.train()
    out = from_client_layout(stacked(to_client_layout(xs)), k)
    out.pow(2).sum().backward()
    for i in range(k):
        ref = get_model(name, num_classes=10, in_channels=1, input_size=8, norm=norm).double()
        ref.load_state_dict(states[i])
        ref.train()
        y = ref(xs[i])
        torch.testing.assert_close(out[i], y, rtol=1e-12, atol=1e-12)
        y.pow(2).sum().backward()
        stacked_params = dict(stacked.named_parameters())
        for pname, p in ref.named_parameters():
            # float64 rounding only: summation orders differ, so the absolute tolerance follows the gradient's scale
            scale = float(p.grad.abs().max())
            torch.testing.assert_close(stacked_params[pname].grad[i], p.grad, rtol=1e-10, atol=1e-12 * max(scale, 1.0),
                                       msg=lambda m: f"{pname}: {m}")
        # BN running statistics are updated per client
        stacked_buffers = dict(stacked.named_buffers())
        for bname, b in ref.named_buffers():
            torch.testing.assert_close(stacked_buffers[bname][i], b, rtol=1e-12, atol=1e-12)


def test_stacked_state_has_base_keys_with_a_client_axis():
    model = get_model("simple_cnn", in_channels=1, input_size=8)
    stacked = stack_model(model, 5, example_input=torch.randn(2, 1, 8, 8))
    base = model.state_dict()
    for key, value in stacked.state_dict().items():
        assert value.shape == (5, *base[key].shape), key


def test_every_registered_model_stacks_without_error():
    for name in list_models():
        model = get_model(name, num_classes=4, in_channels=1, input_size=8, norm="bn")
        stack_model(model, 2, example_input=torch.randn(2, 1, 8, 8))


class ChannelConcat(nn.Module):
    """Concatenates two branches on channels: wrong in the client layout, must be refused."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(1, 2, 3, padding=1)
        self.b = nn.Conv2d(1, 2, 3, padding=1)
        self.head = nn.Linear(4 * 8 * 8, 3)

    def forward(self, x):
        return self.head(torch.flatten(torch.cat([self.a(x), self.b(x)], dim=1), 1))


def test_forward_code_that_mixes_clients_is_refused():
    with pytest.raises(NotStackableError, match="mixes channels"):
        stack_model(ChannelConcat(), 2, example_input=torch.randn(2, 1, 8, 8))


class WithOwnParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return x * self.scale


def test_modules_with_unknown_tensors_are_refused():
    with pytest.raises(NotStackableError, match="WithOwnParameter"):
        stack_model(nn.Sequential(nn.Flatten(), WithOwnParameter()), 2, example_input=torch.randn(2, 3))


def test_synced_stacked_bn_gives_centralized_forward_and_gradient_on_the_union_batch():
    """FedTAN's synchronised step in the client layout: per-client outputs equal centralized BN on the
    union batch, and the clients' gradients summed (p-weighted losses) equal the centralized gradient."""
    from fednorm.nn.comm import LocalClientComm
    from fednorm.nn.stacked import set_client_comm

    torch.manual_seed(0)
    model = get_model("simple_cnn", num_classes=10, in_channels=1, input_size=8, norm="bn").double()
    k, b = 3, 5
    x = torch.randn(k, b, 1, 8, 8, dtype=torch.float64) * torch.tensor([1.0, 2.0, 3.0]).view(k, 1, 1, 1, 1).double()
    y = torch.randint(0, 10, (k, b))
    stacked = stack_model(model, k, example_input=x[0])
    comm = LocalClientComm()
    set_client_comm(stacked, comm)
    stacked.train()
    out = from_client_layout(stacked(to_client_layout(x)), k)  # [K, B, classes]
    p = 1.0 / k  # equal batch sizes
    loss = sum(p * torch.nn.functional.cross_entropy(out[i], y[i]) for i in range(k))
    loss.backward()

    central = get_model("simple_cnn", num_classes=10, in_channels=1, input_size=8, norm="bn").double()
    central.load_state_dict(model.state_dict())
    central.train()
    out_c = central(x.reshape(k * b, 1, 8, 8))
    torch.testing.assert_close(out.reshape(k * b, -1), out_c, rtol=1e-11, atol=1e-12)
    torch.nn.functional.cross_entropy(out_c, y.reshape(-1)).backward()
    sp = dict(stacked.named_parameters())
    for name, param in central.named_parameters():
        torch.testing.assert_close(sp[name].grad.sum(0), param.grad, rtol=1e-9, atol=1e-12, msg=lambda m: f"{name}: {m}")
    # per BN layer: the mean, the variance around it, then both gradients together (3L, the paper's)
    bn = [m for m in central.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert comm.traffic.exchanges == 3 * len(bn) == 9
    # each client uploads 2C statistics and 2C gradients per layer (float64); one broadcast each
    assert comm.traffic.uplink_bytes == k * sum(4 * m.num_features for m in bn) * 8
    assert comm.traffic.broadcast_bytes == sum(4 * m.num_features for m in bn) * 8
    # every client's running statistics followed the pooled (union) statistics
    buffers = dict(stacked.named_buffers())
    for name, buf in central.named_buffers():
        if buf.is_floating_point():
            for i in range(k):
                torch.testing.assert_close(buffers[name][i], buf, rtol=1e-10, atol=1e-12)


class ChannelSum(nn.Module):
    """Two branches summed: per channel, so it stacks."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(1, 2, 3, padding=1)
        self.b = nn.Conv2d(1, 2, 3, padding=1)
        self.head = nn.Linear(2 * 8 * 8, 3)

    def forward(self, x):
        return self.head(torch.flatten(self.a(x) + self.b(x), 1))


def test_a_structure_is_verified_once_per_process_and_a_new_forward_again(monkeypatch):
    import fednorm.nn.stacked.convert as convert

    calls = []
    verify = convert._verify
    monkeypatch.setattr(convert, "_verify", lambda *a: calls.append(a[1:2]) or verify(*a))
    monkeypatch.setattr(convert, "_VERIFIED", set())
    x = torch.randn(2, 1, 8, 8)
    stack_model(ChannelSum(), 2, example_input=x)
    stack_model(ChannelSum(), 2, example_input=x)  # other values, the same structure: not again
    assert len(calls) == 1
    stack_model(ChannelSum(), 3, example_input=x)  # another client count
    stack_model(ChannelSum(), 2, example_input=torch.randn(3, 1, 8, 8))  # another input shape
    assert len(calls) == 3
    # a structure that fails is verified, and refused, every time
    for _ in range(2):
        with pytest.raises(NotStackableError, match="mixes channels"):
            stack_model(ChannelConcat(), 2, example_input=x)
    assert len(calls) == 5
    # a layer setting a forward reads (here the convolution's dilation) makes another structure
    other = ChannelSum()
    other.a.padding, other.a.dilation = (2, 2), (2, 2)
    stack_model(other, 2, example_input=x)
    assert len(calls) == 6
