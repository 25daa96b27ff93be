"""Client objectives and AGC on a user's model without ``.head`` (issue 47, item 5's FedPer fix
carried to the rest): FedDecorr and MOON read the input of the model's classifier, FedLC/FedRS
its class count, and adaptive gradient clipping leaves it unclipped; each finds it with
:func:`fednorm.nn.classifier_head` (``model.head``, else the last ``nn.Linear``), and a model with
no ``nn.Linear`` at all is refused in one line before anything trains. Before, FedDecorr and MOON
refused every such model ("needs a model with a head (every fednorm model has one)"), FedLC/FedRS
too ("needs a classifier with num_classes"), and AGC silently clipped the classifier as well.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import fednorm
from fednorm.errors import ConfigError
from fednorm.nn.nf import head_parameter_names
from fednorm.optim.client import Moon
from fednorm.optim.objectives import FedDecorr

FAST = dict(rounds=1, batch_size=8, threads=1, dtype="float64", progress=False, write=False)


class Net(nn.Module):
    """A user's model: a hidden ``nn.Linear``, then the classifier ``fc`` (no ``head``, no
    ``forward_features``, no ``num_classes``)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2))
        self.hidden = nn.Linear(4 * 4 * 4, 8)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.hidden(self.conv(x).flatten(1))))

    def penultimate(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.hidden(self.conv(x).flatten(1)))


class NoLinear(nn.Module):
    """A fully convolutional classifier: nothing to serve as a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@pytest.fixture(scope="module")
def data() -> fednorm.FederatedData:
    g = torch.Generator().manual_seed(0)
    clients = [(torch.randn(16, 1, 8, 8, generator=g, dtype=torch.float64) + k, torch.arange(16) % (3 - k)) for k in range(2)]  # client 1 lacks class 2 (FedRS acts on it)
    return fednorm.FederatedData.from_tensors(clients, test=(torch.randn(9, 1, 8, 8, generator=g, dtype=torch.float64), torch.arange(9) % 3))


def _grab(opt: FedDecorr | Moon, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    grabbed = []
    handle = model.get_submodule(opt._head).register_forward_pre_hook(lambda _m, args: grabbed.append(args[0]))
    model(x)
    handle.remove()
    return grabbed[0]


@pytest.mark.parametrize("make", [FedDecorr, Moon])
def test_the_objectives_read_the_input_of_the_classifier_of_a_model_without_head(make):
    model = Net().double().train()
    opt = make()
    opt.setup(model, SimpleNamespace(shared_keys=list(model.state_dict())), num_clients=2)  # type: ignore[arg-type]
    x = torch.randn(5, 1, 8, 8, dtype=torch.float64)
    assert opt._head == "fc"  # the classifier, not the hidden nn.Linear
    assert torch.equal(_grab(opt, model, x), model.penultimate(x))
    if isinstance(opt, Moon):  # the frozen models' representation is that same vector
        assert torch.equal(opt._representation(model, x), model.penultimate(x))


@pytest.mark.parametrize("client_opt, args", [("feddecorr", {"beta": 5.0}), ("moon", {"mu": 5.0}), ("fedlc", {}), ("fedrs", {})])
@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_a_model_without_head_trains_under_each_objective(data, client_opt, args, executor):
    # MOON's term has no gradient while the previous model is the global one (a client's first round)
    fast = {**FAST, "rounds": 2} if client_opt == "moon" else FAST
    plain = fednorm.run(model=Net, data=data, executor=executor, **fast)
    run = fednorm.run(model=Net, data=data, client_opt=client_opt, client_opt_args=args, executor=executor, **fast)
    assert run.summary["status"] == "completed" and math.isfinite(run.history[-1]["train_loss"])
    assert run.history[-1]["train_loss"] != plain.history[-1]["train_loss"]  # the objective acted


@pytest.mark.parametrize("client_opt", ["feddecorr", "moon", "fedlc"])
def test_a_model_without_any_linear_is_refused_in_one_line(data, client_opt):
    with pytest.raises(ConfigError) as err:
        fednorm.run(model=NoLinear, data=data, client_opt=client_opt, norm="none", **FAST)
    message = str(err.value)
    assert "\n" not in message and client_opt in message and "NoLinear" in message and "nn.Linear" in message


def test_agc_leaves_the_classifier_of_a_model_without_head_unclipped(data):
    assert head_parameter_names(Net()) == {"fc.weight", "fc.bias"}  # was empty: AGC clipped the classifier too
    with pytest.raises(ConfigError) as err:
        fednorm.run(model=NoLinear, data=data, norm="none", agc_clip=0.01, **FAST)
    assert "\n" not in str(err.value) and "agc_clip=0" in str(err.value)
    assert fednorm.run(model=NoLinear, data=data, norm="none", **FAST).summary["status"] == "completed"  # AGC off: no head needed
