import pytest
import torch

from fednorm.errors import ConfigError, InconsistentUpdateError, UnknownNameError
from fednorm.methods import ClientUpdates, get_method, weighted_average


def test_weighted_average_matches_direct_sum_float64():
    torch.manual_seed(0)
    stacked = torch.randn(4, 3, 2, dtype=torch.float64)
    w = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    expected = sum(w[i] * stacked[i] for i in range(4)) / w.sum()
    torch.testing.assert_close(weighted_average(stacked, w), expected, rtol=1e-15, atol=1e-15)


def test_integer_counters_take_the_maximum():
    counters = torch.tensor([3, 9, 5])
    assert int(weighted_average(counters, torch.ones(3))) == 9


def _updates(values, n):
    return ClientUpdates(
        client_ids=list(range(len(n))),
        states={"w": torch.tensor(values, dtype=torch.float32)[:, None]},
        num_examples=torch.tensor(n, dtype=torch.float64),
        train_loss=torch.zeros(len(n)),
        num_steps=torch.ones(len(n), dtype=torch.int64),
    )


def _method(**kw):
    m = get_method("fedavg", **kw)
    m.local_keys, m.shared_keys = set(), ["w"]
    return m


def test_fedavg_weights_by_examples_or_uniformly():
    up = _updates([1.0, 4.0], [3, 1])
    g = {"w": torch.zeros(1)}
    assert float(_method().aggregate(1, g, up)["w"]) == pytest.approx(1.75)
    assert float(_method(weighting="uniform").aggregate(1, g, up)["w"]) == pytest.approx(2.5)


def test_empty_clients_do_not_count_and_all_empty_keeps_global():
    g = {"w": torch.tensor([7.0])}
    assert float(_method(weighting="uniform").aggregate(1, g, _updates([1.0, 4.0], [2, 0]))["w"]) == 1.0
    with pytest.warns(UserWarning, match="zero examples"):
        assert float(_method().aggregate(1, g, _updates([1.0, 4.0], [0, 0]))["w"]) == 7.0


def test_bad_method_options_and_names():
    with pytest.raises(ConfigError, match="weighting"):
        get_method("fedavg", weighting="median")
    with pytest.raises(ConfigError, match="unexpected keyword"):
        get_method("fedavg", mu=0.1)
    with pytest.raises(UnknownNameError, match="fedavg"):
        get_method("fedavgg")


def test_inconsistent_updates_are_named():
    up = _updates([1.0, 4.0], [3, 1])
    with pytest.raises(InconsistentUpdateError, match="'w' has shape"):
        up.check({"w": torch.zeros(2)})
    with pytest.raises(InconsistentUpdateError, match="missing"):
        up.check({"w": torch.zeros(1), "v": torch.zeros(1)})
