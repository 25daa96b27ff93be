"""FixBN: naive BN (= FedAvg) until the switch, frozen statistics afterwards."""

from __future__ import annotations

import pytest
import torch

from fednorm.config import ExperimentConfig
from fednorm.engine.simulator import Simulation
from fednorm.errors import ConfigError
from fednorm.methods import get_method

BASE = dict(dataset="digits", model="fedbn_cnn", partition="gamma", gamma=0.0, num_clients=4, dsgd=True, batch_size=16,
            lr=0.05, momentum=0.5, rounds=5, executor="sequential", eval_every=100, checkpoint_every=0, threads=1,
            dtype="float64", out=None)


def _trajectory(method: str, **method_args):
    sim = Simulation(ExperimentConfig(**BASE, method=method, method_args=method_args))
    states = [{k: v.clone() for k, v in sim.global_state.items()}]
    for _ in sim.rounds():
        states.append({k: v.clone() for k, v in sim.global_state.items()})
    return states


def test_statistics_stop_changing_after_the_switch_and_phase_one_is_fedavg(tmp_path):
    BASE["out"] = str(tmp_path / "run")
    fix = _trajectory("fixbn", switch_round=2)
    avg = _trajectory("fedavg", weighting="uniform")
    stat_keys = [k for k in fix[0] if k.endswith(("running_mean", "running_var"))]
    assert stat_keys
    # phase 1 (rounds 1-2): bit for bit FedAvg with naive BN
    for r in (1, 2):
        for k in fix[r]:
            assert torch.equal(fix[r][k], avg[r][k]), (r, k)
    # the statistics moved in phase 1 and are frozen in phase 2 (rounds 3-5), bit for bit
    assert any(not torch.equal(fix[1][k], fix[0][k]) for k in stat_keys)
    for r in (3, 4, 5):
        for k in stat_keys:
            assert torch.equal(fix[r][k], fix[2][k]), (r, k)
    # ... while the weights keep training, differently from FedAvg (eval-mode BN in training)
    weight = next(k for k in fix[0] if k.endswith("conv1.weight") or k.endswith("0.weight"))
    assert not torch.equal(fix[5][weight], fix[2][weight])
    assert not torch.equal(fix[5][weight], avg[5][weight])


def test_switch_round_is_required():
    with pytest.raises(ConfigError, match="switch_round"):
        get_method("fixbn")
    with pytest.raises(ConfigError, match="switch_round"):
        get_method("fixbn", switch_round=-1)
