"""A DSGD run resumed from a compacted checkpoint (client momenta replaced by their weighted mean)
continues as the uninterrupted run: the same global weights in float64, on both executors."""

import io

import pytest
import torch

from fednorm.config import ExperimentConfig
from fednorm.engine.compact import COMPACTED_KEY, compact_checkpoint, mean_momentum_exact
from fednorm.engine.executor import MOMENTUM_PREFIX
from fednorm.engine.simulator import Simulation

# digits in 5 Dirichlet shards of 194-395 samples: the server weights the clients by their sizes, so
# the mean is not uniform (the weighted mean is tested).
BASE = dict(dataset="digits", partition="dirichlet", alpha=0.3, num_clients=5, rounds=6, batch_size=64, lr=0.1,
            momentum=0.9, model="mlp", norm="fbn", method="fbn", dsgd=True, dtype="float64", eval_every=100,
            augment=False)


def _roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    size = buf.tell()
    buf.seek(0)
    return torch.load(buf, weights_only=True), size


def _resumed(cfg, rounds_before, *, weighting=None):
    """The run stepped ``rounds_before`` rounds, compacted, saved, loaded into a fresh simulation."""
    first = Simulation(cfg)
    for _ in range(rounds_before):
        first.step()
    state = first.state_dict()
    if weighting is not None:  # a deliberately wrong mean, for the negative control
        state["config"]["method_args"] = {"weighting": weighting}
    plain = _roundtrip(state)[1]
    info = compact_checkpoint(state, first.data.client_sizes().tolist())
    loaded, compacted = _roundtrip(state)
    second = Simulation(cfg)
    second.load_state_dict(loaded)
    return second, info, plain, compacted


@pytest.mark.parametrize("executor, extra", [
    ("sequential", {}),
    ("vectorized", {}),
    # the FBN robust table's attack on the statistics, undefended and with NNM + median on them only
    ("sequential", dict(attack="sign_flip", num_byzantine=2, attack_targets="stats")),
    ("sequential", dict(attack="alie", num_byzantine=2, attack_targets="stats", aggregator="median", nnm=True,
                        robust_targets="stats")),
])
def test_resume_from_compacted_checkpoint_equals_uninterrupted_run(executor, extra):
    cfg = ExperimentConfig(**BASE, **extra, executor=executor)
    full = Simulation(cfg)
    assert full.executor.name == executor
    sizes = full.data.client_sizes()
    assert len(set(sizes.tolist())) > 1  # unequal weights
    for _ in range(cfg.rounds):
        full.step()
    resumed, info, plain, compacted = _resumed(cfg, 3)
    assert info.clients == 5 and info.round == 3
    # the momenta are the bulk of what was saved: the file shrinks by the storage of 4 of them
    assert compacted <= plain - info.bytes_saved + 4096 and info.bytes_saved > plain / 2
    keys = [k for k in resumed.bank.get(0) if k.startswith(MOMENTUM_PREFIX)]
    assert keys and resumed.bank.get(0)[keys[0]].data_ptr() != resumed.bank.get(1)[keys[0]].data_ptr()  # not aliased
    while resumed.server_round < cfg.rounds:
        resumed.step()
    for key, value in full.global_state.items():
        torch.testing.assert_close(resumed.global_state[key], value, rtol=1e-10, atol=1e-12, msg=lambda m: f"{key}: {m}")
    # ...though the clients' own momenta differ: the checkpoint really lost them
    gap = max(float((resumed.bank.get(c)[k] - full.bank.get(c)[k]).abs().max()) for c in range(5) for k in keys)
    assert gap > 1e-4


def test_mean_with_the_wrong_weights_changes_the_run():
    """Negative control: the uniform mean where the server weights by samples is not the same run."""
    cfg = ExperimentConfig(**BASE, executor="sequential")
    full = Simulation(cfg)
    for _ in range(cfg.rounds):
        full.step()
    resumed = _resumed(cfg, 3, weighting="uniform")[0]
    while resumed.server_round < cfg.rounds:
        resumed.step()
    gap = max(float((resumed.global_state[k] - v).abs().max()) for k, v in full.global_state.items() if v.is_floating_point())
    assert gap > 1e-6


@pytest.mark.parametrize("change, word", [
    (dict(dsgd=False), "not a DSGD run"),
    (dict(clients_per_round=3), "partial participation"),
    (dict(aggregator="median"), "median"),
    (dict(attack="sign_flip", num_byzantine=1, attack_targets="updates"), "Byzantine updates"),
    (dict(nnm=True, num_byzantine=1), "nnm+mean"),
    (dict(client_failure_rate=0.1), "miss a round"),
    (dict(method="fedbn"), "fedbn"),
])
def test_runs_where_the_mean_is_not_exact_are_refused(change, word):
    cfg = ExperimentConfig(**{**BASE, **change})
    reason = mean_momentum_exact(cfg.model_dump(mode="json"))
    assert reason is not None and word in reason
    sim = Simulation(ExperimentConfig(**BASE))
    sim.step()
    state = sim.state_dict()
    state["config"] = cfg.model_dump(mode="json")
    with pytest.raises(ValueError, match="cannot replace"):
        compact_checkpoint(state, sim.data.client_sizes().tolist())
    assert COMPACTED_KEY not in state


def test_robust_statistics_with_mean_weights_are_exact():
    """``robust_targets: stats`` aggregates only the BN statistics robustly; the weights keep the mean."""
    cfg = ExperimentConfig(**{**BASE, "aggregator": "median", "robust_targets": "stats"})
    assert mean_momentum_exact(cfg.model_dump(mode="json")) is None
