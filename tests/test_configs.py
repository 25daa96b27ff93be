"""Every shipped config is valid, names registered components, and runs (briefly) on the real data."""

from pathlib import Path

import pytest

import math

from fednorm.config import load_config
from fednorm.engine.simulator import Simulation, check_names

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def test_configs_exist():
    assert len(CONFIGS) >= 5


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_shipped_config_is_valid(path):
    check_names(load_config(path))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_shipped_config_trains_one_short_round(path, shared_data):
    """Data, partition, model and method build, and a one-step round trains (no evaluation)."""
    cfg = load_config(path, {"local_steps": 1, "data_dir": str(shared_data), "eval_every": 10**6})
    sim = Simulation(cfg)
    record = sim.step()
    assert record.server_round == 1 and not record.metrics
    assert math.isfinite(record.train_loss)
