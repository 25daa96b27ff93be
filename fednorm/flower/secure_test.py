"""SecAgg+ of the updates in the Flower app: the node vector's algebra, the refusals, and a run on
Flower's simulation engine whose aggregate equals the plain one to the quantization error."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("flwr", reason="the Flower extra (flwr) is not installed")

from fednorm.config import load_config  # noqa: E402
from fednorm.errors import ConfigError  # noqa: E402
from fednorm.flower.secure import CLIPPING_RANGE, QUANTIZATION_RANGE, apply_mean, check_secure, node_vector  # noqa: E402
from fednorm.methods.base import ClientUpdates, weighted_average  # noqa: E402
from fednorm.methods.fedavg import FedAvg  # noqa: E402


def test_weighted_node_vectors_combine_to_the_methods_weighted_mean_in_float64() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).double()
    method = FedAvg()
    method.setup(model)
    glob = {k: v.detach().clone() for k, v in model.state_dict().items()}
    k = 5
    states = {key: (v + torch.randn(k, *v.shape, dtype=v.dtype) if v.is_floating_point() else v.expand(k).clone())
              for key, v in glob.items()}
    ups = ClientUpdates(list(range(k)), states, torch.tensor([3.0, 1, 4, 1, 5], dtype=torch.float64), torch.zeros(k), torch.ones(k))
    nodes = [ups.subset([0, 2]), ups.subset([1, 3, 4])]  # two SuperNodes' clients
    vectors = [node_vector(method, n, glob) for n in nodes]
    total = sum(w for _, w, _ in vectors)
    mean = sum(w * x for x, w, _ in vectors) / total  # what SecAgg+ unmasks, before quantization
    got, rest = apply_mean(method, glob, mean)
    assert rest.numel() == 0  # no statistics uploads here
    for key in method.shared_keys:
        if glob[key].is_floating_point():
            torch.testing.assert_close(got[key], weighted_average(states[key], ups.num_examples), rtol=0, atol=1e-12)


@pytest.mark.parametrize("overrides, why", [
    (dict(method="fedtan"), "layer by layer"),
    (dict(method="fbn", norm="fbn"), "same number of steps"),
    (dict(aggregator="median"), "reveals only their sum"),
])
def test_methods_that_need_each_clients_value_are_refused(overrides: dict, why: str) -> None:
    from fednorm.engine.simulator import Simulation

    sim = Simulation(load_config(overrides=dict(num_clients=3, rounds=1, **overrides)))
    with pytest.raises(ConfigError, match=why):
        check_secure(sim.method, sim.config)


def test_statistics_sums_give_the_exact_pooled_statistics_in_float64() -> None:
    from fednorm.flower.secure import pooled_from_sums, statistics_layers, statistics_sums
    from fednorm.nn.functional import pooled_stats

    g = torch.Generator().manual_seed(0)
    rows = [{"hbn.l.count": torch.tensor(float(n), dtype=torch.float64),
             "hbn.l.mean": torch.randn(3, generator=g, dtype=torch.float64) * (i + 1),
             "hbn.l.var": torch.rand(3, generator=g, dtype=torch.float64) + i} for i, n in enumerate((5, 9, 2))]
    layers = statistics_layers(rows[0])
    assert layers == ["hbn.l"]
    # two nodes: clients {0, 1} and {2}, each dividing by its own total weight (here its counts)
    parts = [(statistics_sums(rows[:2], layers, 14.0), 14.0), (statistics_sums(rows[2:], layers, 2.0), 2.0)]
    total = 16.0
    mean = sum(w * x for x, w in parts) / total
    count, mu, var = pooled_from_sums(mean, {"hbn.l": [3, 0]}, total)["hbn.l"]
    ref_n, ref_mu, ref_var = pooled_stats(torch.tensor([5.0, 9.0, 2.0], dtype=torch.float64),
                                          torch.stack([r["hbn.l.mean"] for r in rows]), torch.stack([r["hbn.l.var"] for r in rows]))
    assert count == pytest.approx(float(ref_n), rel=1e-12)
    torch.testing.assert_close(mu, ref_mu, rtol=0, atol=1e-12)
    torch.testing.assert_close(var, ref_var, rtol=0, atol=1e-12)


def test_fbn_step_sums_give_eq_9_10_of_the_clients_own_copies_in_float64() -> None:
    import json

    from fednorm.engine.simulator import Simulation
    from fednorm.flower.secure import fbn_rows_from_sums, secure_layout

    sim = Simulation(load_config(overrides=dict(method="fbn", norm="fbn", num_clients=3, rounds=1, local_steps=2, threads=1,
                                                dtype="float64", method_args={"initial_pass": False})))
    sim.begin_round()
    updates = sim.train_clients(1, [0, 1, 2], 0.05)
    glob = sim.global_state
    plain = sim.method.aggregate_statistics(glob, updates)
    nodes = [updates.subset([0, 1]), updates.subset([2])]
    vectors = [node_vector(sim.method, n, glob, steps=2) for n in nodes]
    total = sum(w for _, w, _ in vectors)
    _, rest = apply_mean(sim.method, glob, sum(w * x for x, w, _ in vectors) / total)
    layout = json.loads(secure_layout(updates.extras, 2))
    assert all(steps == 2 for _, steps in layout.values())
    counts = {p: updates.extras[f"{p}.count"] for p in layout}
    momenta = {f"fbn.{n}": b for n, b in sim.method.momenta.items()}
    rows = fbn_rows_from_sums(rest, layout, total, counts, momenta)
    extras = dict(updates.extras)
    for p, (mu, var) in rows.items():
        extras[f"{p}.mean"], extras[f"{p}.var"] = mu, var
    import dataclasses

    got = sim.method.aggregate_statistics(glob, dataclasses.replace(updates, extras=extras))
    for k, v in plain.items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=1e-10)


@pytest.mark.slow
def test_secagg_on_the_simulation_engine_equals_the_plain_aggregate_to_quantization_error() -> None:
    pytest.importorskip("ray")
    from fednorm.api import run
    from fednorm.flower import run_simulation

    cfg = load_config(overrides=dict(method="fedavg", norm="bn", num_clients=4, rounds=1, local_steps=2, threads=1))
    plain = run(cfg, write=False, progress=False).simulation.global_state
    result = run_simulation(cfg, num_nodes=2, num_cpus=2, cpus_per_node=1, write=False, secure=True)
    secure = result.simulation.global_state
    # each node's entries are stochastically rounded to 2·clip/Q; the unmasked mean carries at
    # most one level per node (its weights sum to 1), plus float32 rounding
    bound = 2 * 2 * CLIPPING_RANGE / QUANTIZATION_RANGE + 1e-6
    worst = max(float((secure[k] - v).abs().max()) for k, v in plain.items() if v.is_floating_point())
    assert 0 < worst <= bound  # not the plain values (it went through the protocol), within its error
    assert result.summary["flower_exchanges"] >= 5  # the train message and SecAgg+'s four stages


@pytest.mark.slow
def test_hbn_under_secagg_pools_its_statistics_from_the_secure_sums() -> None:
    pytest.importorskip("ray")
    from fednorm.api import run
    from fednorm.flower import run_simulation

    cfg = load_config(overrides=dict(method="hbn", norm="hbn", num_clients=4, rounds=1, local_steps=2, threads=1,
                                     method_args={"initial_pass": False, "final_sync": False}))
    plain = run(cfg, write=False, progress=False)
    result = run_simulation(cfg, num_nodes=2, num_cpus=2, cpus_per_node=1, write=False, secure=True)
    bound = 2 * 2 * CLIPPING_RANGE / QUANTIZATION_RANGE
    for k, v in plain.simulation.global_state.items():  # weights and the pooled statistics (Eq. 8, 11)
        if v.is_floating_point():
            # the variance is E[x²] − mean², so it carries the error of both sums
            tol = bound * (2 + 2 * float(v.abs().max())) if k.endswith("running_var") else bound + 1e-6
            assert float((result.simulation.global_state[k] - v).abs().max()) <= tol, k
    # the evaluation re-sync ran as a secure statistics query: the same accuracy as in process
    assert abs(result.history[-1]["test_accuracy"] - plain.history[-1]["test_accuracy"]) <= 1 / 359
    assert result.summary["flower_exchanges"] >= 10  # train + 4 stages, query + 4 stages


@pytest.mark.slow
def test_fbn_under_secagg_on_the_simulation_engine() -> None:
    pytest.importorskip("ray")
    from fednorm.api import run
    from fednorm.flower import run_simulation

    cfg = load_config(overrides=dict(method="fbn", norm="fbn", num_clients=4, rounds=1, local_steps=2, threads=1,
                                     method_args={"initial_pass": False}))
    plain = run(cfg, write=False, progress=False).simulation.global_state
    secure = run_simulation(cfg, num_nodes=2, num_cpus=2, cpus_per_node=1, write=False, secure=True).simulation.global_state
    bound = 2 * 2 * CLIPPING_RANGE / QUANTIZATION_RANGE
    # The statistics sums are scaled to their own magnitude before quantization (stats-scale), so a
    # replayed step's mean carries the bound once (two steps here); the variance adds the squared
    # means' sum divided by beta (0.1).
    for k, v in plain.items():
        if v.is_floating_point():
            if k.endswith("running_mean"):
                tol = 2 * bound
            elif k.endswith("running_var"):
                tol = 2 * bound * (1 + (1 + 2 * float(secure[k.replace("var", "mean")].abs().max())) / 0.1)
            else:
                tol = bound + 1e-6
            assert float((secure[k] - v).abs().max()) <= tol, k
