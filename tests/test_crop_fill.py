"""crop_fill (issue 37.7): the random crop pads with a black pixel, as the HBN and FedTAN released
code do (torchvision's RandomCrop before Normalize), on every path that augments."""

from __future__ import annotations

import pytest
import torch

from fednorm import api
from fednorm.config import ExperimentConfig
from fednorm.data.federated import crop_fill_values, federated_data_from_config
from fednorm.data.transforms import pixel_value
from fednorm.errors import ConfigError

BASE = dict(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=4, batch_size=16, lr=0.05, momentum=0.9,
            model="simple_cnn", rounds=2, dtype="float64", augment=True, threads=1, seed=3)


def _state(**kw) -> dict[str, torch.Tensor]:
    return api.run(ExperimentConfig(**{**BASE, **kw}), write=False, progress=False).simulation.global_state


def test_black_fill_trains_the_same_on_both_executors_and_not_as_zero_fill():
    black = _state(crop_fill="black", executor="sequential")
    for key, value in _state(crop_fill="black", executor="vectorized").items():
        torch.testing.assert_close(value, black[key], rtol=1e-10, atol=1e-12)
    zero = _state(crop_fill="zero", executor="sequential")
    assert any(not torch.allclose(zero[k], black[k]) for k in black if black[k].is_floating_point())


@pytest.mark.parametrize("input_norm, expected", [
    ({"mean": [0.25], "std": [0.5]}, (-0.5,)),  # (0 - 0.25) / 0.5
    ("none", (0.0,)),                            # pixels in [0, 1]: black is zero
])
def test_black_is_a_black_pixel_under_the_runs_normalisation(input_norm, expected):
    cfg = ExperimentConfig(**{**BASE, "crop_fill": "black", "input_norm": input_norm})
    assert crop_fill_values(cfg, federated_data_from_config(cfg)) == pytest.approx(expected, abs=1e-7)
    cfg = ExperimentConfig(**BASE, crop_fill="black")  # the dataset's own statistics
    data = federated_data_from_config(cfg)
    assert crop_fill_values(cfg, data) == pixel_value(0, data.info.mean, data.info.std)
    assert crop_fill_values(ExperimentConfig(**BASE), data) is None  # zero: the default


def test_black_fill_on_a_users_tensors_is_refused():
    cfg = ExperimentConfig(**BASE)
    data = federated_data_from_config(cfg)
    data.recipe = None  # as FederatedData.from_tensors leaves it: the normalisation is unknown
    with pytest.raises(ConfigError, match="crop_fill: black"):
        crop_fill_values(ExperimentConfig(**BASE, crop_fill="black"), data)
