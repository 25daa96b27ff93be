"""Issue 38.1: ``FederatedData.from_datasets`` reads map-style torch Datasets per client into the
same federation ``from_tensors`` makes of their samples (checked by the content fingerprint), is
recorded as the user's data, and rejects what it cannot read with one line naming the client."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset

import fednorm
from fednorm.data import FederatedData
from fednorm.data.provenance import describe_data, fingerprint
from fednorm.errors import ConfigError, DatasetError


def client_tensors(seed: int = 0) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    clients = [(torch.randn(n, 1, 6, 6, generator=g), torch.randint(0, 3, (n,), generator=g)) for n in (10, 7, 12)]
    return clients, (torch.randn(15, 1, 6, 6, generator=g), torch.randint(0, 3, (15,), generator=g))


class NumpySamples(Dataset):
    """What a user's dataset often returns: NumPy images and Python int labels."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x.numpy(), y.tolist()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def test_datasets_make_the_federation_their_tensors_make():
    clients, test = client_tensors()
    ref = FederatedData.from_tensors(clients=clients, test=test, name="mine")
    for wrap in (lambda x, y: TensorDataset(x, y), NumpySamples):
        got = FederatedData.from_datasets(clients=[wrap(x, y) for x, y in clients], test=wrap(*test), name="mine")
        assert fingerprint(got) == fingerprint(ref)  # samples, labels, client splits and test splits alike
        assert got.client_sizes().tolist() == [10, 7, 12] and got.num_classes == 3
    pair_test = FederatedData.from_datasets(clients=[TensorDataset(x, y) for x, y in clients], test=test, name="mine")
    assert fingerprint(pair_test) == fingerprint(ref)


def test_an_empty_client_dataset_is_an_empty_client():
    clients, test = client_tensors()
    empty = (torch.empty(0, 1, 6, 6), torch.empty(0, dtype=torch.int64))
    ref = FederatedData.from_tensors(clients=[clients[0], empty, clients[1]], test=test)
    got = FederatedData.from_datasets(clients=[TensorDataset(*clients[0]), TensorDataset(*empty), TensorDataset(*clients[1])],
                                      test=TensorDataset(*test), name="tensors")
    assert got.client_sizes().tolist() == [10, 0, 7] and fingerprint(got) == fingerprint(ref)


def test_a_run_records_datasets_as_the_users_and_resumes_only_with_the_same(tmp_path):
    clients, test = client_tensors()
    data = FederatedData.from_datasets(clients=[TensorDataset(x, y) for x, y in clients], test=TensorDataset(*test), name="Scans")
    out = tmp_path / "r"
    result = fednorm.run(data=data, model="simple_cnn", rounds=1, batch_size=4, threads=1, out=str(out))
    # recorded as config.yaml reads it back (lowercase), so that the resume below finds the same settings
    assert (result.config.dataset, result.config.partition) == ("user:scans", "user:scans")
    assert result.config.dataset_args == describe_data(data)
    again = FederatedData.from_datasets(clients=[TensorDataset(x, y) for x, y in clients], test=TensorDataset(*test), name="Scans")
    assert fednorm.run(resume=out, data=again, rounds=2).summary["rounds"] == 2
    other = [(x + 1, y) for x, y in clients]
    changed = FederatedData.from_datasets(clients=[TensorDataset(x, y) for x, y in other], test=TensorDataset(*test), name="Scans")
    with pytest.raises(ConfigError, match="not the data it trained on"):
        fednorm.run(resume=out, data=changed, rounds=3)


class Stream(IterableDataset):
    def __iter__(self):
        yield torch.zeros(1, 6, 6), 0


class Items(Dataset):
    def __init__(self, items: list) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.items[i]


X = torch.zeros(1, 6, 6)


@pytest.mark.parametrize("clients,words", [
    ([Stream()], ["client 0", "map-style", "from_tensors"]),
    ([Items([(X, 0)]), Items([X])], ["client 1", "sample 0", "Tensor", "pair (x, y)"]),
    ([Items([(X, 0), ([[0.0] * 6] * 6, 1)])], ["client 0", "sample 1", "list", "ToTensor()"]),
    ([Items([(X, 0), (torch.zeros(1, 5, 5), 1)])], ["client 0", "sample 1", "(1, 5, 5)", "(1, 6, 6)"]),
    ([Items([(X, 0.5)])], ["client 0", "integer labels"]),
    ([Items([(X, torch.tensor([0, 1]))])], ["client 0", "sample 0", "label has shape (2,)"]),
    ([Items([(X, 0)]), Items([(torch.zeros(1, 5, 5), 0)])], ["client 1", "(1, 5, 5)", "client 0's are (1, 6, 6)"]),
    ([Items([(X.to(torch.uint8), 0)])], ["client 0", "x must be float", "torch.uint8"]),
    ([Items([]), Items([])], ["every client's dataset is empty"]),
    ([], ["a list of datasets"]),
    (Items([(X, 0)]), ["a list of datasets"]),
])
def test_what_it_cannot_read_is_one_line_naming_the_client(clients, words):
    with pytest.raises(DatasetError) as err:
        FederatedData.from_datasets(clients=clients, test=Items([(X, 0)]))
    message = str(err.value)
    assert "\n" not in message
    for w in words:
        assert w in message, message


def test_a_bad_test_set_is_one_line_too():
    for test, words in ((Items([X]), ["test", "sample 0", "pair (x, y)"]), ((X, 0), ["test", "pair of tensors"]),
                        (Items([(np.zeros((1, 6, 6), np.float32), 2.0)]), ["test", "integer labels"])):
        with pytest.raises(DatasetError) as err:
            FederatedData.from_datasets(clients=[Items([(X, 0)])], test=test)
        assert "\n" not in str(err.value) and all(w in str(err.value) for w in words), str(err.value)
