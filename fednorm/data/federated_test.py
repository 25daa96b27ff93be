import numpy as np
import pytest
import torch

from fednorm.config import ExperimentConfig
from fednorm.data.datasets import load_dataset
from fednorm.data.federated import FederatedData, federated_data_from_config
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


def test_from_tensors_keeps_each_clients_samples_and_splits_the_test_set_once():
    import fednorm
    from fednorm.errors import DatasetError

    g = torch.Generator().manual_seed(0)
    clients = []
    for k in range(4):
        y = torch.randint(0, 3, (30 + 5 * k,), generator=g)
        clients.append((torch.randn(len(y), 1, 8, 8, generator=g) + y.view(-1, 1, 1, 1), y))
    yt = torch.randint(0, 3, (90,), generator=g)
    xt = torch.randn(90, 1, 8, 8, generator=g) + yt.view(-1, 1, 1, 1)
    data = FederatedData.from_tensors(clients, (xt, yt), name="mine")
    assert data.num_clients == 4 and data.num_classes == 3 and data.info.in_channels == 1
    for (x, y), ix in zip(clients, data.client_train):  # client k's rows are exactly its tensors
        assert torch.equal(data.train_x[ix], x) and torch.equal(data.train_y[ix], y)
    used = torch.cat(data.client_test).sort().values
    assert torch.equal(used, torch.arange(90))  # every class is held by some client: each test image once
    result = fednorm.run(data=data, model="mlp", rounds=3, batch_size=8, lr=0.1, write=False, progress=False)
    assert result.summary["dataset"] == "user:mine" and result.summary["final_test_accuracy"] > 0.6  # learnable
    for bad, needle in [([], "at least one client"), ([(xt, yt.float())], "y integer labels"),
                        ([(xt[:5], yt[:4])], "client 0: x must be"), ([(xt, yt), (xt[:, :, :4], yt)], "client 1: samples of shape")]:
        with pytest.raises(DatasetError, match=needle) as info:
            FederatedData.from_tensors(bad, (xt, yt))
        assert len(str(info.value)) <= 300 and "\n" not in str(info.value)


@pytest.mark.parametrize("change", [{"seed": 7}, {"alpha": 0.1, "seed": 2}, {"partition": "classes", "classes_per_client": 2},
                                    {"num_clients": 5, "partition": "iid"}])
def test_repartition_equals_a_fresh_build_and_shares_the_samples(change):
    from fednorm.data.federated import repartition

    base = ExperimentConfig(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=8, seed=0)
    data = federated_data_from_config(base)
    other = base.model_copy(update=change)
    again = repartition(data, other)
    fresh = federated_data_from_config(other)
    assert again is not None and again.train_x is data.train_x and again.test_x is data.test_x  # one copy
    assert torch.equal(again.train_x, fresh.train_x) and torch.equal(again.test_y, fresh.test_y)
    assert len(again.client_train) == len(fresh.client_train)
    for a, b in zip(again.client_train + again.client_test, fresh.client_train + fresh.client_test):
        assert torch.equal(a, b)
    assert repartition(data, base.model_copy(update={"input_norm": "none"})) is None  # other samples: no
