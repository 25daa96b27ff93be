"""Runs as a dimension (issue 36.2): seeds trained together as one computation equal the same
runs made alone (float64), write the same run directories, and fall back with a reason where
they cannot stack."""

from __future__ import annotations

import json

import pytest
import torch

from fednorm import api
from fednorm.cli.main import main
from fednorm.config import ExperimentConfig
from fednorm.errors import ConfigError
from fednorm.api.run_set import run_stacked
from fednorm.engine.stacked_runs import stack_blockers
from fednorm.seeds import run_seeds

BASE = dict(dataset="digits", partition="dirichlet", alpha=0.3, num_clients=6, clients_per_round=4, batch_size=16, lr=0.05,
            momentum=0.9, model="simple_cnn", rounds=3, dtype="float64", eval_every=1, threads=1)


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch):
    monkeypatch.setattr("fednorm.plotting.plot_accuracy", lambda *a, **k: None)


def _assert_same(stacked, alone):
    assert [h["round"] for h in stacked.history] == [h["round"] for h in alone.history]
    for a, b in zip(stacked.history, alone.history):
        assert a["test_accuracy"] == b["test_accuracy"] and a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-10)
    for key, value in alone.simulation.global_state.items():
        torch.testing.assert_close(stacked.simulation.global_state[key], value, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("variant", [
    {"method": "fedavg", "norm": "bn"},
    {"method": "fedavg", "norm": "gn", "norm_args": {"num_groups": 2}},
    {"method": "fedbn", "norm": "bn"},          # local BN tensors: each run's own bank
    {"method": "fedavg", "norm": "ln", "local_epochs": 2, "batch_size": 50},  # unequal steps per client
    # methods whose stacked hooks read each row's run (seed, global state) from the context
    {"method": "hbn", "norm": "hbn", "method_args": {"preset": "paper"}},
    {"method": "hbn", "norm": "hbn", "method_args": {"preset": "default"}},
    # the code's preset: own alpha in each run's bank, per-run seeded augmentation of the statistics pass
    {"method": "hbn", "norm": "hbn", "method_args": {"preset": "reference-code"}, "augment": True},
    {"method": "hbn", "norm": "hbn", "method_args": {"preset": "paper", "stats_samples": "random", "stats_max_samples": 8}},
    {"method": "fbn", "norm": "fbn"},           # local copies of the statistics against each run's global ones
    {"method": "fixbn", "norm": "bn", "method_args": {"switch_round": 1}},
    # client objectives whose stacked hooks read only each row's own start, labels, features, gradients
    {"method": "fedavg", "norm": "bn", "client_opt": "fedprox", "client_opt_args": {"mu": 0.1}},
    {"method": "hbn", "norm": "hbn", "method_args": {"preset": "paper"}, "client_opt": "fedprox", "client_opt_args": {"mu": 0.1}},
    {"method": "fedavg", "norm": "bn", "client_opt": "fedlc"},
    {"method": "fedavg", "norm": "gn", "norm_args": {"num_groups": 2}, "client_opt": "fedsam", "server_opt": "fedadam"},
    # server state in each run's method object: each row reads its own run's (issue 46.5)
    {"method": "fedavg", "norm": "bn", "client_opt": "scaffold"},
    {"method": "fedavg", "norm": "bn", "client_opt": "fedacg"},
    {"method": "fedavg", "norm": "bn", "client_opt": "moon"},
    # BatchNorm synchronised across each run's clients only: one synchronisation group per run
    {"method": "fedtan", "norm": "bn"},
    {"method": "fedtan", "norm": "bn", "local_epochs": 2, "batch_size": 50},  # unequal batches: padded rows, row masks
    {"method": "fedtan_forward", "norm": "bn"},
    # the rest of the registries: every method and client/server optimizer stacks
    {"method": "silobn", "norm": "bn"},
    {"method": "singleset", "norm": "bn"},
    {"method": "fedavg", "norm": "bn", "client_opt": "fedrs"},
    # eps 1e-2 as in test_vectorized_methods.py: at the default 1e-8 the standardisation amplifies rounding
    {"method": "fedavg", "norm": "bn", "client_opt": "feddecorr", "client_opt_args": {"beta": 0.5, "eps": 1e-2}},
    {"method": "fedavg", "norm": "gn", "norm_args": {"num_groups": 2}, "server_opt": "fedavgm"},
    {"method": "fedavg", "norm": "gn", "norm_args": {"num_groups": 2}, "server_opt": "fedyogi"},
], ids=lambda v: "-".join([v["method"], v["norm"], *(str(x) for x in v.get("method_args", {}).values()),
                           *(v[k] for k in ("client_opt", "server_opt") if k in v)]))
def test_stacked_seeds_equal_the_runs_made_alone(variant, tmp_path):
    # 2 rounds: state carried from round to round (banks, momentum, control variates) is read once; the
    # variants at 3 rounds were most of this file's 460 s in a loaded suite run
    configs = [ExperimentConfig(**{**BASE, "rounds": 2, **variant}, seed=s, out=str(tmp_path / f"s{s}")) for s in (0, 1, 2)]
    assert stack_blockers(configs) == []
    stacked, info = run_stacked(configs)
    assert info["joint_rounds"] == 2 and info["separate_rounds"] == 0
    for cfg, res in zip(configs, stacked):
        assert not isinstance(res, BaseException), res
        alone = api.run(cfg.model_copy(update={"out": None}), write=False, progress=False)
        _assert_same(res, alone)
        summary = json.loads((tmp_path / f"s{cfg.seed}" / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["seed"] == cfg.seed
        assert summary["samples_trained"] == alone.summary["samples_trained"]
        for key in ("uplink_bytes", "downlink_bytes", "downlink_bytes_broadcast", "comm_rounds"):  # FedTAN's exchanges per run
            assert summary[key] == alone.summary[key], key


def test_runs_with_other_partitions_stack_too(tmp_path):
    configs = [ExperimentConfig(**{**BASE, "alpha": a}, seed=0, out=str(tmp_path / f"a{a}")) for a in (0.1, 1.0)]
    stacked, info = run_stacked(configs)
    assert info["joint_rounds"] == 3
    for cfg, res in zip(configs, stacked):
        _assert_same(res, api.run(cfg.model_copy(update={"out": None}), write=False, progress=False))


@pytest.mark.parametrize("variant", [
    {"method": "fedavg", "norm": "bn"},
    {"method": "fedavg", "norm": "ln", "local_epochs": 2, "batch_size": 50},  # unequal clients: the working set shrinks
    {"method": "fbn", "norm": "fbn", "dsgd": True, "momentum": 0.5},          # DSGD's dampened momentum
    {"method": "fedavg", "norm": "bn", "momentum": 0.0, "weight_decay": 1e-3},
    {"method": "fedavg", "norm": "bn", "client_opt": "scaffold"},  # its control variate update divides by each row's lr
], ids=["bn", "ln-unequal", "fbn-dsgd", "bn-wd-nomomentum", "scaffold"])
def test_a_learning_rate_sweep_stacks_and_each_run_equals_its_run_alone(variant, tmp_path):
    configs = [ExperimentConfig(**{**BASE, **variant, "lr": lr, "lr_decay": decay}, seed=0, out=str(tmp_path / f"lr{i}"))
               for i, (lr, decay) in enumerate(((0.05, 1.0), (0.02, 1.0), (0.1, 0.9)))]
    stacked, info = run_stacked(configs)
    assert info["joint_rounds"] == 3 and info["separate_rounds"] == 0  # one computation per round, not one per rate
    for cfg, res in zip(configs, stacked):
        assert not isinstance(res, BaseException), res
        _assert_same(res, api.run(cfg.model_copy(update={"out": None}), write=False, progress=False))


def test_what_cannot_stack_says_why_and_runs_one_by_one(tmp_path):
    a = ExperimentConfig(**BASE, seed=0, out=str(tmp_path / "a"))
    assert "the runs differ in model" in stack_blockers([a, a.model_copy(update={"model": "mlp"})])
    prox = [ExperimentConfig(**{**BASE, "method": "fedtan", "executor": "sequential"}, seed=s,  # executor asked for
                            out=str(tmp_path / f"p{s}")) for s in (0, 1)]
    prox = [c.model_copy(update={"method": "fedavg"}) for c in prox]
    why = stack_blockers(prox)
    assert any("sequential" in w for w in why)
    results, info = run_stacked(prox)
    assert info["joint_rounds"] == 0 and info["blockers"] == why
    assert all(r.summary["status"] == "completed" for r in results)


def test_run_seeds_stacks_by_default_and_equals_stack_off(tmp_path, capsys):
    cfg = ExperimentConfig(**BASE)
    stacked = run_seeds(cfg, [0, 1], tmp_path / "on", plot=False, progress=False)
    alone = run_seeds(cfg, [0, 1], tmp_path / "off", plot=False, progress=False, stack=False)
    assert stacked.stacking["joint_rounds"] == 3 and not alone.stacking
    for name, st in alone.stats.items():
        assert stacked.stats[name].mean == pytest.approx(st.mean, rel=1e-9)
    args = ["run", "--seeds", "3,4", "--rounds", "2", "--model", "mlp", "--num-clients", "3", "--threads", "1", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "cli")]) == 0
    assert "seeds ran stacked: 2 joint rounds" in capsys.readouterr().out
    assert main([*args, "--out", str(tmp_path / "cli-off"), "--stack", "off"]) == 0
    assert "stacked" not in capsys.readouterr().out


def test_a_joint_round_that_diverges_is_rerun_run_by_run(tmp_path, monkeypatch):
    """Only the run whose clients diverged may stop: the barrier reruns that round on each run's
    own executor, and the runs go on (here the joint step fails once; the reruns are exact)."""
    from fednorm.engine import stacked_runs
    from fednorm.errors import DivergenceError

    original = stacked_runs.StackedRunsExecutor.train
    calls = []

    def flaky(self, server_round, requests, lr):
        calls.append(server_round)
        if server_round == 2 and calls.count(2) == 1:
            raise DivergenceError("non-finite training loss at round 2 (injected)")
        return original(self, server_round, requests, lr)

    monkeypatch.setattr(stacked_runs.StackedRunsExecutor, "train", flaky)
    configs = [ExperimentConfig(**BASE, seed=s, out=str(tmp_path / f"s{s}")) for s in (0, 1)]
    stacked, info = run_stacked(configs)
    assert (info["joint_rounds"], info["separate_rounds"]) == (2, 1)
    for cfg, res in zip(configs, stacked):
        _assert_same(res, api.run(cfg.model_copy(update={"out": None}), write=False, progress=False))


def test_a_run_that_fails_before_it_is_built_does_not_hold_up_the_others(tmp_path):
    (tmp_path / "a-file").write_text("not a directory")
    configs = [ExperimentConfig(**BASE, seed=s, out=str(tmp_path / f"s{s}")) for s in (0, 1, 2)]
    configs[1] = configs[1].model_copy(update={"out": str(tmp_path / "a-file" / "run")})  # cannot be made
    results, info = run_stacked(configs)
    assert isinstance(results[1], Exception)
    assert info["joint_rounds"] == 3  # the two others still trained together
    for i in (0, 2):
        _assert_same(results[i], api.run(configs[i].model_copy(update={"out": None}), write=False, progress=False))


def test_what_stacked_runs_must_share_is_the_fields_roles(tmp_path):
    """Every field of the method and its local steps (role ``local_training``), of the data, the
    model and the execution blocks a stack when it differs; the seed, the partition, the learning
    rate, the server and the schedule never do (the runs above that differ in them stack)."""
    from fednorm.config_roles import FIELD_ROLES, STACK_SHARED_FIELDS

    a = ExperimentConfig(**BASE, seed=0, out=str(tmp_path / "a"))
    for name, role in FIELD_ROLES.items():
        why = stack_blockers([a, a.model_copy(update={name: "__another__"})])
        blocked = f"the runs differ in {name}" in why
        assert blocked == (name in STACK_SHARED_FIELDS), (name, role, why)
        if role in ("local_training", "model", "data", "preprocessing", "execution", "dtype", "device"):
            assert blocked, name
        if role in ("seed", "partition", "schedule", "training", "evaluation", "output", "runtime", "record"):
            assert not blocked, name


def test_the_memory_budget_holds_the_whole_stack_and_a_lockstep_run_is_never_split(tmp_path, monkeypatch):
    """One stack_memory_gib for the stack (the runs share it, and the device): a budget of 4 of
    FedTAN's clients trains two runs of 4 clients a round as one chunk each, equal to each run
    alone; a budget of 3 stops the set with the field named."""
    from fednorm.engine.simulator import Simulation
    from fednorm.engine.stacked_runs import StackedRunsExecutor

    probe = Simulation(ExperimentConfig(**{**BASE, "method": "fedtan"}))
    per_client = 4 * 8 * (sum(p.numel() for p in probe.model.parameters()) + sum(b.numel() for b in probe.model.buffers()))
    chunks = []
    run_round = StackedRunsExecutor.run_round
    monkeypatch.setattr(StackedRunsExecutor, "run_round",
                        lambda self, r, ids, *a: chunks.append(len(ids)) or run_round(self, r, ids, *a))
    configs = [ExperimentConfig(**{**BASE, "method": "fedtan", "stack_memory_gib": 4.5 * per_client / 2**30}, seed=s,
                                out=str(tmp_path / f"s{s}")) for s in (0, 1)]
    stacked, info = run_stacked(configs)
    assert info["joint_rounds"] == 3 and chunks == [4, 4] * 3
    for cfg, res in zip(configs, stacked):
        assert not isinstance(res, BaseException), res
        _assert_same(res, api.run(cfg.model_copy(update={"out": None}), write=False, progress=False))
    short = [c.model_copy(update={"stack_memory_gib": 3.5 * per_client / 2**30, "out": str(tmp_path / f"short{c.seed}")})
             for c in configs]
    with pytest.raises(ConfigError, match=r"all 4 clients .* at most 3 fit: the stacked model's memory budget \(stack_memory_gib\)"):
        run_stacked(short)
