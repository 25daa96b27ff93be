"""Diagnostics: exact pooled statistics and gradient deviation against independent float64
computations, and the per-round metrics of a real run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fednorm.config import load_config
from fednorm.diagnostics import Diagnostics, exact_statistics, gradient_deviation, parse_schedule
from fednorm.errors import ConfigError


class _Net(nn.Module):
    """Conv-BN-ReLU-Conv-BN-Linear-BN1d, with the BN modules registered in reverse forward order
    (the passes must follow the forward order, not the registration order)."""

    def __init__(self) -> None:
        super().__init__()
        self.bn3 = nn.BatchNorm1d(5)
        self.bn2 = nn.BatchNorm2d(4)
        self.bn1 = nn.BatchNorm2d(3)
        self.conv1 = nn.Conv2d(2, 3, 3, padding=1)
        self.conv2 = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 4 * 4, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.head(F.relu(self.bn3(self.fc(x.flatten(1)))))


def _clients(n: list[int], shift: bool = True) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(k, 2, 4, 4, generator=g, dtype=torch.float64) * (1 + i) + (2.0 * i if shift else 0.0)
          for i, k in enumerate(n)]
    ys = [torch.randint(0, 3, (k,), generator=g) for k in n]
    return xs, ys


def _model() -> _Net:
    torch.manual_seed(0)
    net = _Net().double()
    with torch.no_grad():  # statistics buffers far from anything exact, so stale ones would show
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.fill_(3.0)
                m.running_var.fill_(7.0)
                m.weight.uniform_(0.5, 1.5)
    return net


def test_exact_statistics_equal_centralized_batch_norm_on_the_union_in_float64() -> None:
    xs, _ = _clients([7, 12, 5])
    net = _model()
    got = exact_statistics(net, xs, batch_size=4)  # chunks of 4: the pooling must be exact
    # Independent: training-mode BN on the concatenated data as one batch normalises every layer
    # with the union's own statistics; record each layer's input and take its moments directly.
    ref = _model()
    seen: dict[str, torch.Tensor] = {}
    for name in ("bn1", "bn2", "bn3"):
        getattr(ref, name).register_forward_pre_hook(lambda _m, a, name=name: seen.__setitem__(name, a[0].detach()))
    ref.train()
    with torch.no_grad():
        ref(torch.cat(xs))
    for name, x in seen.items():
        dims = [0] + list(range(2, x.dim()))
        torch.testing.assert_close(got.union[name].mean, x.mean(dim=dims), rtol=0, atol=1e-10)
        torch.testing.assert_close(got.union[name].var, x.var(dim=dims, unbiased=False), rtol=0, atol=1e-10)
        assert float(got.union[name].count) == x.numel() // x.shape[1]
        # each client's share is its own rows of the same layer input
        start = 0
        for i, xi in enumerate(xs):
            rows = x[start:start + len(xi)]
            start += len(xi)
            torch.testing.assert_close(got.clients[name][i].mean, rows.mean(dim=dims), rtol=0, atol=1e-10)
    assert net.bn1.running_mean[0] == 3.0  # the model itself is untouched


def _params(net: nn.Module) -> list[str]:
    return [n for n, _ in net.named_parameters()]


def test_gradient_deviation_is_zero_for_fedtans_synchronised_step_on_non_iid_clients() -> None:
    xs, ys = _clients([6, 9, 4])
    net = _model()
    state = net.state_dict()
    dev = gradient_deviation(net, state, [state] * 3, xs, ys, _params(net), mode="synchronised")
    assert dev["rel_error"] < 1e-12 and abs(dev["cosine"] - 1) < 1e-12
    local = gradient_deviation(net, state, [state] * 3, xs, ys, _params(net), mode="local")
    assert local["rel_error"] > 1e-2  # FedAvg+BN on the same non-IID clients: its B_i terms


def test_gradient_deviation_is_zero_when_clients_hold_identical_statistics() -> None:
    xs, ys = _clients([8])
    xs, ys = xs * 3, ys * 3  # every client the same data: every local batch has the union's statistics
    net = _model()
    state = net.state_dict()
    dev = gradient_deviation(net, state, [state] * 3, xs, ys, _params(net), mode="local")
    assert dev["rel_error"] < 1e-12 and abs(dev["norm_ratio"] - 1) < 1e-12


def test_schedule_parsing_and_config_errors() -> None:
    assert parse_schedule("every:3") == 3
    assert load_config(overrides={"diagnostics": "every: 2"}).diagnostics == "every:2"
    assert load_config(overrides={"diagnostics": "off"}).diagnostics is None
    for bad in ("every:0", "sometimes", "every:x"):
        with pytest.raises(ConfigError, match="diagnostics must be 'every:N'"):
            load_config(overrides={"diagnostics": bad})


def test_run_writes_diagnostics_at_due_rounds_and_recalibration_uses_exact_statistics(tmp_path) -> None:
    from fednorm.api import run
    from fednorm.engine.outputs import read_metrics

    res = run(dict(method="fedavg", norm="bn", num_clients=3, rounds=3, diagnostics="every:2", threads=1,
                   dtype="float64", local_steps=2, out=str(tmp_path / "run")), progress=False)
    assert (tmp_path / "run" / "diagnostics.png").is_file()
    assert read_metrics(tmp_path / "run")[-1]["diag/acc/recalibrated"] == res.history[-1]["diag/acc/recalibrated"]
    by_round = {h["round"]: h for h in res.history}
    assert not any(k.startswith("diag/") for k in by_round[1])
    for r in (2, 3):  # every 2nd round, and the last
        h = by_round[r]
        assert 0 <= h["diag/acc/recalibrated"] <= 1 and h["diag/seconds"] > 0
        assert abs(h["diag/acc/aggregated"] - h["test_accuracy"]) < 1e-12  # FedAvg evaluates the aggregate
        assert h["diag/grad/rel_error"] > 0 and h["diag/stats/agg_var_logratio/features.1"] > 0
    # The recalibrated statistics are exact: feeding them back gives zero aggregated mismatch.
    sim = res.simulation
    diag = Diagnostics(1)
    stats = exact_statistics(sim.global_model(sim.global_state), [sim.data.train_x[ix] for ix in sim.data.client_train])
    for name, m in stats.union.items():
        sim.global_state[f"{name}.running_mean"] = m.mean.clone()
        sim.global_state[f"{name}.running_var"] = m.var.clone()
    out = diag.statistics(sim, [sim.data.train_x[ix] for ix in sim.data.client_train])
    assert out["diag/stats/agg_mean_shift/features.1"] < 1e-9 and out["diag/stats/agg_var_logratio/features.9"] < 1e-9


def test_plot_diagnostics_writes_a_png(tmp_path) -> None:
    from fednorm.diagnostics import layer_mean, plot_diagnostics

    rows = [{"round": r, "diag/seconds": 0.1, "diag/stats/agg_var_logratio/a": 0.2 * r, "diag/stats/agg_var_logratio/b": 0.4 * r,
             "diag/grad/rel_error": 0.3, "diag/acc/aggregated": 0.5, "diag/acc/recalibrated": 0.6} for r in (1, 2)]
    assert abs(layer_mean(rows[1], "diag/stats/agg_var_logratio") - 0.6) < 1e-12
    out = plot_diagnostics({"FedAvg+BN": rows, "no diagnostics": [{"round": 1}]}, tmp_path / "d.png")
    assert out.stat().st_size > 1000 and out.read_bytes()[:4] == b"\x89PNG"


def test_remote_runtimes_refuse_diagnostics() -> None:
    from fednorm.engine.simulator import Simulation

    class Remote(Simulation):  # a runtime whose clients answer elsewhere (torch.distributed, Flower)
        def query_clients(self, client_ids, query, state=None):  # type: ignore[no-untyped-def]
            return super().query_clients(client_ids, query, state)

    with pytest.raises(ConfigError, match="in-process simulator only"):
        Remote(load_config(overrides=dict(num_clients=2, rounds=1, diagnostics="every:1")))


def test_diagnostics_can_be_switched_on_when_resuming(tmp_path) -> None:
    from fednorm.api import run

    out = tmp_path / "run"
    run(dict(num_clients=2, rounds=1, local_steps=1, threads=1, out=str(out)), progress=False)
    res = run(resume=out, rounds=2, diagnostics="every:1", progress=False)
    assert "diag/seconds" in res.history[-1] and "diag/seconds" not in res.history[0]
