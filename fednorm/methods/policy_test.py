"""The normalization policy, read from what clients actually upload: per method, which keys
travel (``ClientUpdates.states`` of a real round), what stays local, what the server
recomputes; conflicts are clear errors; ``num_batches_tracked`` stays an integer maximum."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fednorm.config import ExperimentConfig
from fednorm.engine.simulator import Simulation
from fednorm.errors import ConfigError

BASE = dict(dataset="digits", num_clients=3, rounds=1, batch_size=32, threads=1)

# Per method (and its norm): which BatchNorm tensors its paper sends to the server.
#   (buffers sent, affine sent, evaluated per client)
EXPECTED = {
    "fedavg": ("bn", {}, True, True, False),
    "fedtan": ("bn", {}, True, True, False),
    "fedtan_forward": ("bn", {}, True, True, False),
    "fixbn": ("bn", {"switch_round": 1}, True, True, False),
    "fedbn": ("bn", {}, False, False, True),
    "silobn": ("bn", {}, False, True, True),
    "fbn": ("fbn", {}, False, True, False),
    "hbn": ("hbn", {}, False, True, False),
}


def _bn_keys(model: nn.Module) -> tuple[set[str], set[str], set[str]]:
    """Independently of fednorm: BN buffers, BN weight/bias, and every other key."""
    buffers, affine = set(), set()
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            buffers |= {f"{name}.{b}" for b in ("running_mean", "running_var", "num_batches_tracked")}
            affine |= {f"{name}.{p}" for p in ("weight", "bias")}
    return buffers, affine, set(model.state_dict()) - buffers - affine


def _one_round(**cfg):
    sim = Simulation(ExperimentConfig(**{**BASE, **cfg}))
    before = {k: v.clone() for k, v in sim.global_state.items()}
    seen = []
    train = sim.train_clients
    sim.train_clients = lambda *a, **k: seen.append(train(*a, **k)) or seen[-1]  # type: ignore[method-assign]
    sim.step()
    return sim, seen[0], before


@pytest.mark.parametrize("method", sorted(EXPECTED))
def test_the_keys_that_travel_are_the_methods_policy(method: str) -> None:
    norm, args, buffers_sent, affine_sent, per_client = EXPECTED[method]
    sim, updates, before = _one_round(method=method, norm=norm, method_args=args)
    buffers, affine, rest = _bn_keys(sim.model)
    assert buffers and affine
    sent = set(updates.states)
    if method == "hbn":  # HBN's mixing logits never travel (its paper), nor do they count as affine
        alpha = {k for k in rest if k.endswith(".alpha")}
        assert alpha and not alpha & sent
        rest -= alpha
    assert rest <= sent  # every non-norm weight travels
    assert (buffers <= sent) is buffers_sent and (not buffers & sent) is (not buffers_sent)
    assert (affine <= sent) is affine_sent and (not affine & sent) is (not affine_sent)
    assert sim.method.personalized is per_client
    if method in ("fbn", "hbn"):  # dropped: not sent, yet recomputed by the server
        means = [k for k in buffers if k.endswith("running_mean")]
        assert any(not torch.equal(sim.global_state[k], before[k]) for k in means)


def test_singleset_sends_nothing() -> None:
    sim, updates, _ = _one_round(method="singleset")
    assert updates.states == {} and sim.uplink_bytes == 0


def test_fedavg_with_local_buffers_keeps_the_statistics_home_and_evaluates_per_client() -> None:
    sim, updates, before = _one_round(method="fedavg", buffers="local")
    buffers, affine, _ = _bn_keys(sim.model)
    assert not buffers & set(updates.states) and affine <= set(updates.states)
    assert sim.method.personalized
    bank = sim.bank.state_dict()
    key = next(k for k in buffers if k.endswith("running_mean"))
    assert not torch.equal(bank[0][key], bank[1][key])  # each client its own statistics
    assert torch.equal(sim.global_state[key], before[key])  # the server never saw them


def test_fedbn_with_global_affine_is_silobn() -> None:
    a, ua, _ = _one_round(method="fedbn", affine="global")
    b, ub, _ = _one_round(method="silobn")
    assert set(ua.states) == set(ub.states)
    assert all(torch.equal(a.global_state[k], b.global_state[k]) for k in a.global_state)


@pytest.mark.parametrize("method,norm,setting", [("fedbn", "bn", {"buffers": "global"}), ("fbn", "fbn", {"buffers": "global"}),
                                                 ("hbn", "hbn", {"affine": "local"}), ("fedavg", "bn", {"buffers": "drop"}),
                                                 ("fedtan", "bn", {"buffers": "local"})])
def test_a_setting_the_method_cannot_honour_is_a_clear_error(method: str, norm: str, setting: dict) -> None:
    kind, value = next(iter(setting.items()))
    with pytest.raises(ConfigError, match=f"method '{method}' .* cannot run with --{kind} {value}"):
        Simulation(ExperimentConfig(**BASE, method=method, norm=norm, **setting))


def test_num_batches_tracked_is_the_integer_maximum_never_a_float_average() -> None:
    sim, updates, _ = _one_round(method="fedavg", num_clients=3, partition="dirichlet", alpha=0.3)
    keys = [k for k in updates.states if k.endswith("num_batches_tracked")]
    assert keys
    for k in keys:
        sent = updates.states[k]
        assert sent.dtype == torch.int64 and len(set(sent.tolist())) > 1  # clients took different numbers of steps
        assert sim.global_state[k].dtype == torch.int64 and int(sim.global_state[k]) == int(sent.max())


def test_dropped_statistics_are_downloaded_not_uploaded() -> None:
    sim, updates, _ = _one_round(method="hbn", norm="hbn")
    nbytes = lambda keys: sum(sim.global_state[k].numel() * sim.global_state[k].element_size() for k in keys)  # noqa: E731
    buffers, _, _ = _bn_keys(sim.model)
    sent = nbytes(updates.states) + sum(t[0].numel() * t.element_size() for t in updates.extras.values())
    assert sim.uplink_bytes == 3 * sent
    down = [k for k in sim.global_state if k not in sim.method.local_keys]
    assert buffers <= set(down) and sim.downlink_bytes == 3 * nbytes(down)
