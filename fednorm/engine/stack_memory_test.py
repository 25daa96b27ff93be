import pytest
import torch
from torch import nn

from fednorm.engine.stack_memory import clients_that_fit, gib_needed, lockstep_overflow, stack_budget


def test_an_explicit_budget_is_gib_and_the_default_follows_the_device(monkeypatch):
    assert stack_budget(0.5, "cpu") == 1 << 29
    assert stack_budget(3, "cuda") == 3 * 2**30  # explicit: whatever the device has
    assert stack_budget(None, "cpu") == 2 * 2**30  # fednorm's budget before the field
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * 2**30, 80 * 2**30))
    assert stack_budget(None, "cuda:0") == 5 * 2**30  # half the free memory, not of the total
    assert stack_budget(None, "cpu") == 2 * 2**30


def test_the_cap_is_the_budget_over_four_copies_of_the_model():
    model = nn.Sequential(nn.Linear(10, 5), nn.BatchNorm1d(5))  # 55 + 10 float32, 5 + 5 float32 buffers, one int64
    per_client = 4 * ((55 + 10 + 10) * 4 + 8)
    assert clients_that_fit(model, 3 * per_client + per_client - 1) == 3
    assert clients_that_fit(model, 3 * per_client) == 3
    assert clients_that_fit(model, per_client - 1) == 1  # one client always trains
    assert clients_that_fit(model, 100 * per_client) == 100
    assert clients_that_fit(model.double(), 3 * per_client) == 1  # float64 doubles the parameters' bytes


@pytest.mark.parametrize("clients,per_client", [(4, 913_315_200), (6, 913_315_200), (3, 12_345), (7, 2**30 // 7)])
def test_the_budget_the_error_asks_for_holds_the_clients_as_written(clients, per_client):
    need = gib_needed(clients, per_client)
    written = float(f"{need:.3g}")
    assert int(written * 2**30) // per_client >= clients
    assert written <= clients * per_client / 2**30 * 1.01  # and no more than 1 % above what they take


def test_the_lockstep_error_names_the_limit_that_holds_the_clients_back():
    per_client = 913_315_200  # FedBN's AlexNet-BN in float32, four copies
    memory = lockstep_overflow("fedtan", 4, 64, 2 * 2**30, per_client)
    assert "at most 2 fit" in memory and "stack_memory_gib to at least 3.41" in memory
    assert "max_parallel_clients" not in memory
    parallel = lockstep_overflow("fedtan", 4, 3, 64 * 2**30, per_client)
    assert "at most 3 fit" in parallel and "max_parallel_clients is 3" in parallel and "stack_memory_gib" not in parallel
