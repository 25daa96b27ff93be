"""Your own feature-shifted clients scored on their own test data (issue 47.1): from_tensors and
from_datasets take one test set per client, each client is evaluated on exactly its own, and test
data that cannot score honestly (empty, or classes no client holds) is refused or said."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import TensorDataset

from fednorm import api
from fednorm.data.federated import FederatedData
from fednorm.errors import DatasetError


def _clients(n: int = 3, train: int = 40, test: int = 12):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(train, 1, 8, 8, generator=g) + 10 * k, torch.randint(0, 3, (train,), generator=g),
             torch.randn(test + k, 1, 8, 8, generator=g) + 10 * k, torch.randint(0, 3, (test + k,), generator=g))
            for k in range(n)]


def test_each_client_is_scored_on_exactly_its_own_test_data():
    clients = _clients()
    data = FederatedData.from_tensors(clients)
    for k, (_, _, xt, yt) in enumerate(clients):
        assert torch.equal(data.test_x[data.client_test[k]], xt) and torch.equal(data.test_y[data.client_test[k]], yt)
    # the same federation from a list of per-client test pairs, and from datasets
    same = FederatedData.from_tensors([c[:2] for c in clients], test=[c[2:] for c in clients])
    assert torch.equal(same.test_x, data.test_x) and all(torch.equal(a, b) for a, b in zip(same.client_test, data.client_test))
    sets = FederatedData.from_datasets([TensorDataset(*c[:2]) for c in clients], test=[TensorDataset(*c[2:]) for c in clients])
    assert torch.equal(sets.test_x, data.test_x) and all(torch.equal(a, b) for a, b in zip(sets.client_test, data.client_test))


def test_a_run_reports_each_clients_accuracy_on_its_own_split():
    clients = _clients()
    data = FederatedData.from_tensors(clients)
    result = api.run(model="mlp", data=data, method="fedbn", rounds=1, write=False, progress=False, threads=1)
    accs = result.history[-1]["client_accuracies"]
    sim = result.simulation
    for k, (_, _, xt, yt) in enumerate(clients):  # an independent evaluation of client k's model on its own test data
        model = sim.client_model(k)
        model.eval()
        with torch.no_grad():
            own = float((model(xt).argmax(1) == yt).double().mean())
        assert accs[k] == pytest.approx(own, abs=1e-12)


def test_empty_test_data_is_refused_not_scored_nan():
    clients = _clients()
    with pytest.raises(DatasetError, match="test data is empty"):
        FederatedData.from_tensors([c[:2] for c in clients], test=(torch.empty(0, 1, 8, 8), torch.empty(0, dtype=torch.long)))


def test_test_samples_no_client_can_be_scored_on_are_said():
    clients = [(x, torch.zeros(len(x), dtype=torch.long)) for x, *_ in _clients()]  # every client holds class 0 only
    test = (torch.randn(9, 1, 8, 8), torch.arange(9) % 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        FederatedData.from_tensors(clients, test=test)
    assert any("6 of 9 test samples reach no client's test split" in str(w.message) for w in caught)


@pytest.mark.parametrize("bad, match", [
    (lambda c: [c[0], c[1][:2], c[2]], "every client its test data"),
    (lambda c: c + [("x",)], "expected tensors"),
])
def test_mixed_or_malformed_client_items_are_one_line(bad, match):
    with pytest.raises(DatasetError, match=match):
        FederatedData.from_tensors(bad(_clients()))
