import numpy as np
import pytest
import torch

from fednorm.config import ExperimentConfig
from fednorm.data.datasets import load_dataset
from fednorm.data.federated import federated_data_from_config
from fednorm.errors import DatasetError


def _pixels(train: bool) -> torch.Tensor:
    ds = load_dataset("digits", None, train=train)
    return torch.from_numpy(np.asarray(ds.data, dtype=np.float64) / 255.0).permute(0, 3, 1, 2)


@pytest.mark.parametrize("input_norm", ["dataset", "none", {"mean": [0.25], "std": [0.5]}])
def test_input_norm_standardises_every_split_as_asked(input_norm) -> None:
    data = federated_data_from_config(ExperimentConfig(dataset="digits", num_clients=3, partition="iid",
                                                       input_norm=input_norm))
    info = data.info
    if input_norm == "dataset":
        mean, std = info.mean, info.std
    elif input_norm == "none":
        mean, std = (0.0,), (1.0,)
    else:
        mean, std = tuple(input_norm["mean"]), tuple(input_norm["std"])
    for x, train in ((data.train_x, True), (data.test_x, False)):
        want = (_pixels(train) - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)
        torch.testing.assert_close(x.double(), want, rtol=0, atol=1e-6)


def test_input_norm_is_checked() -> None:
    with pytest.raises(ValueError, match="positive"):
        ExperimentConfig(input_norm={"mean": [0.0], "std": [0.0]})
    with pytest.raises(ValueError, match="exactly the keys"):
        ExperimentConfig(input_norm={"mean": [0.0]})
    with pytest.raises(DatasetError, match="channel"):  # digits has one channel
        federated_data_from_config(ExperimentConfig(dataset="digits", num_clients=2, partition="iid",
                                                    input_norm={"mean": [0.1, 0.2, 0.3], "std": [1.0, 1.0, 1.0]}))
