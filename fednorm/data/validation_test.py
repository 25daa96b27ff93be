"""The validation split held out of each client's training data (``validation_fraction``)."""

import numpy as np
import pytest
import torch

from fednorm.data.federated import FederatedData
from fednorm.data.validation import hold_out_validation, validation_size


def _data(sizes: list[int]) -> FederatedData:
    g = torch.Generator().manual_seed(0)
    clients = [(torch.randn(n, 3, generator=g), torch.arange(n) % 2) for n in sizes]
    return FederatedData.from_tensors(clients, test=(torch.randn(6, 3, generator=g), torch.arange(6) % 2))


def test_every_training_sample_trains_or_validates_exactly_once() -> None:
    data = _data([10, 7, 1, 2])
    held = hold_out_validation(data, 0.3, seed=5)
    # round(0.3 n) halves up, at most n - 1: 3.0 -> 3, 2.1 -> 2, 0.3 -> 0, 0.6 -> 1
    assert [len(v) for v in held.client_val] == [3, 2, 0, 1]
    for before, train, val in zip(data.client_train, held.client_train, held.client_val):
        assert not set(train.tolist()) & set(val.tolist())
        assert sorted(train.tolist() + val.tolist()) == before.tolist()
        assert train.tolist() == sorted(train.tolist()) and val.tolist() == sorted(val.tolist())
    assert held.train_x is data.train_x and data.client_val is None  # the tensors shared, the input unchanged


def test_the_same_seed_draws_the_same_split_per_client() -> None:
    a, b = hold_out_validation(_data([40, 30]), 0.25, seed=1), hold_out_validation(_data([40, 30]), 0.25, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.client_val, b.client_val))
    other = hold_out_validation(_data([40, 30]), 0.25, seed=2)
    assert any(not torch.equal(x, y) for x, y in zip(a.client_val, other.client_val))
    # client 1's draw does not depend on client 0 (its own stream): the same positions in its indices
    resized = hold_out_validation(_data([12, 30]), 0.25, seed=1)
    offset_a, offset_r = 40, 12
    assert torch.equal(a.client_val[1] - offset_a, resized.client_val[1] - offset_r)


def test_the_held_out_samples_are_a_uniform_draw() -> None:
    """Over many seeds every position of a client's 20 samples is held out about 5 / 20 of the time."""
    data = _data([20])
    counts = np.zeros(20)
    for seed in range(2000):
        counts[hold_out_validation(data, 0.25, seed=seed).client_val[0].numpy()] += 1
    assert counts.sum() == 2000 * 5
    assert np.abs(counts / 2000 - 0.25).max() < 0.04  # binomial sd 0.0097: four of them


def test_fraction_zero_is_the_data_itself() -> None:
    data = _data([5, 5])
    assert hold_out_validation(data, 0.0, seed=0) is data


def test_sizes_round_to_the_nearest_count() -> None:
    assert validation_size(100, 0.29) == 29  # 0.29 * 100 is 28.999999999999996 in floating point
    assert validation_size(112, 0.44643) == 50  # FedBN's Office-Caltech10: 50 of 112
    assert validation_size(210, 0.5) == 105  # FedBN's DomainNet: 105 of 210
    assert validation_size(0, 0.5) == 0 and validation_size(1, 0.9) == 0 and validation_size(3, 0.9) == 2
    with pytest.raises(ValueError, match="fraction"):
        validation_size(10, 1.0)


def test_a_split_is_held_out_once() -> None:
    held = hold_out_validation(_data([10]), 0.5, seed=0)
    with pytest.raises(ValueError, match="once"):
        hold_out_validation(held, 0.5, seed=0)
