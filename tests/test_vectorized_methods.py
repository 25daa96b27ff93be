"""Methods with client hooks run on the vectorized executor through their stacked hooks
(``Method.stacked_client_begin/stacked_client_end``) and agree with the sequential executor
(float64, to rounding): global state after two rounds, the metrics, the clients' banks, and
what the clients upload. Equal clients (IID) and unequal ones (Dirichlet, one local epoch:
clients run out of steps at different times, ragged last batches)."""

import pytest
import torch

from fednorm.config import ExperimentConfig
from fednorm.engine.simulator import Simulation

CASES = {
    "fbn": dict(method="fbn", norm="fbn"),
    "fbn_literal": dict(method="fbn", norm="fbn", method_args={"mode": "literal"}),
    "fbn_round_average": dict(method="fbn", norm="fbn", method_args={"mode": "round_average", "initial_pass": False}),
    "robust_fbn": dict(method="fbn", norm="fbn", aggregator="median"),
    "fixbn": dict(method="fixbn", norm="bn", method_args={"switch_round": 1}),  # round 2 frozen
    "hbn": dict(method="hbn", norm="hbn"),  # default preset: initial pass, debiased EMA, local alpha
    # the released code's choices: alpha averaged, own alpha kept in the bank, hybrid uploads,
    # statistics of the first 64 samples by class, augmented as training is
    "hbn_reference_code": dict(method="hbn", norm="hbn", method_args={"preset": "reference-code"}, augment=True),
    "hbn_paper_eval_mode": dict(method="hbn", norm="hbn",
                                method_args={"preset": "paper", "stats_mode": "eval", "bessel_count": "elements"}),
    # client optimizers in the client dimension (stacked proximal / control-variate terms)
    "fedavg_fedprox": dict(method="fedavg", norm="bn", client_opt="fedprox", client_opt_args={"mu": 0.5}),
    "fedbn_fedprox": dict(method="fedbn", norm="bn", client_opt="fedprox", client_opt_args={"mu": 0.5}),
    "hbn_fedprox": dict(method="hbn", norm="hbn", client_opt="fedprox", client_opt_args={"mu": 0.5}),
    "fedavg_scaffold": dict(method="fedavg", norm="bn", client_opt="scaffold"),
    "fbn_scaffold": dict(method="fbn", norm="fbn", client_opt="scaffold", server_opt="fedavgm"),
    # label-skew objectives: per-client calibrated logits (forward hook on the client-concatenated
    # logits) and the decorrelation loss on each client's head input
    "fedavg_fedlc": dict(method="fedavg", norm="bn", client_opt="fedlc", client_opt_args={"tau": 0.5}),
    "fedavg_fedlc_clamp": dict(method="fedavg", norm="ln", client_opt="fedlc", client_opt_args={"absent": "clamp"}),
    "fedavg_fedrs": dict(method="fedavg", norm="bn", client_opt="fedrs", client_opt_args={"alpha": 0.3}),
    "hbn_fedrs": dict(method="hbn", norm="hbn", client_opt="fedrs"),
    # (eps 1e-2: with the default 1e-8 a nearly dead ReLU feature, variance ~1e-12, divides the
    # executors' 1e-16 rounding differences by sqrt(eps) and two rounds drift apart by ~1e-5)
    "fedavg_feddecorr": dict(method="fedavg", norm="bn", client_opt="feddecorr", client_opt_args={"beta": 0.5, "eps": 1e-2}),
    "fn_feddecorr": dict(method="fedavg", norm="fn", client_opt="feddecorr", client_opt_args={"beta": 0.5, "eps": 1e-2}),
    # MOON: the two frozen models stacked too, run on the same client-layout batches
    "fedavg_moon": dict(method="fedavg", norm="bn", client_opt="moon", client_opt_args={"mu": 2.0}),
    "fedbn_moon": dict(method="fedbn", norm="bn", client_opt="moon", client_opt_args={"mu": 2.0}),
    "fbn_moon": dict(method="fbn", norm="fbn", client_opt="moon"),
    "hbn_moon": dict(method="hbn", norm="hbn", client_opt="moon", client_opt_args={"mu": 2.0}),
    # FedSAM: each client's own ascent point, the second pass over the chunk on the same batches
    "fedavg_fedsam": dict(method="fedavg", norm="bn", client_opt="fedsam", client_opt_args={"rho": 0.1}),
    "fbn_fedsam": dict(method="fbn", norm="fbn", client_opt="fedsam", client_opt_args={"rho": 0.1}),
    "hbn_fedsam": dict(method="hbn", norm="hbn", client_opt="fedsam", client_opt_args={"rho": 0.1}, augment=True),
    # GN + weight-standardized convolutions (each client's filters standardized in the stacked conv)
    "fedavg_gn_ws": dict(method="fedavg", norm="gn_ws"),
}


def _pair(**kw):
    base = dict(dataset="digits", num_clients=5, rounds=2, batch_size=32, lr=0.05, momentum=0.9, weight_decay=1e-3,
                model="simple_cnn", dtype="float64", eval_every=1, threads=1, checkpoint_every=0, out=None)
    base.update(kw)
    seq = Simulation(ExperimentConfig(**base, executor="sequential"))
    vec = Simulation(ExperimentConfig(**base, executor="vectorized"))
    # both sides of every comparison must run where they say (a mutant that built the vectorized
    # executor for "sequential" passed every case before these checks)
    assert vec.executor.name == "vectorized" and seq.executor.name == "sequential"
    assert type(seq.executor).__name__ == "SequentialExecutor" and type(vec.executor).__name__ == "VectorizedExecutor"
    return seq, vec


def _close(a, b, what):
    torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12, msg=lambda m: f"{what}: {m}")


def _assert_same(seq, vec, rounds=2):
    for _ in range(rounds):
        a, b = seq.step(), vec.step()
        assert a.client_ids == b.client_ids
        assert a.train_loss == pytest.approx(b.train_loss, rel=1e-10)
        assert set(a.metrics) == set(b.metrics)
        for key, value in a.metrics.items():
            if key in ("wall_seconds", "events"):
                continue
            assert b.metrics[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert seq.executor.last_samples_seen == vec.executor.last_samples_seen
    assert set(seq.global_state) == set(vec.global_state)
    for key, value in seq.global_state.items():
        _close(value, vec.global_state[key], key)
    assert set(seq.bank) == set(vec.bank)
    for cid in seq.bank:
        for key, value in seq.bank.get(cid).items():
            _close(value, vec.bank.get(cid)[key], f"client {cid} {key}")


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("partition", ["iid", "dirichlet"])
def test_hooked_methods_vectorized_equal_sequential(case, partition):
    kw = dict(CASES[case], partition=partition)
    if partition == "dirichlet":
        kw.update(alpha=0.3)
    seq, vec = _pair(**kw)
    if partition == "dirichlet":
        sizes = seq.data.client_sizes()
        assert len(set(sizes.tolist())) > 1  # clients finish at different steps: masking and ragged batches
    _assert_same(seq, vec)
    if kw.get("client_opt") == "scaffold":  # the server's control variate, and it moved
        for key, c in seq.method.client_opt.c.items():
            _close(c, vec.method.client_opt.c[key], f"scaffold c {key}")
        assert any(c.abs().sum() > 0 for c in vec.method.client_opt.c.values())


def test_fbn_uploads_equal_the_sequential_ones_padded_per_step():
    """The per-step uploads themselves (counts, local copies), zero-padded for clients with fewer
    steps, including a round split into chunks of clients."""
    seq, vec = _pair(method="fbn", norm="fbn", partition="dirichlet", alpha=0.3, max_parallel_clients=2, rounds=1)
    clients = seq.sample_clients(1)
    a = seq.executor.run_round(1, clients, seq.global_state, 0.05)
    b = vec.executor.run_round(1, clients, vec.global_state, 0.05)
    assert set(a.extras) == set(b.extras) and a.extras
    counts = next(v for k, v in a.extras.items() if k.endswith(".count"))
    assert (counts == 0).any()  # padding happened
    for key, value in a.extras.items():
        _close(value, b.extras[key], key)
    torch.testing.assert_close(a.num_steps, b.num_steps)


@pytest.mark.parametrize("method, norm", [("fbn", "fbn"), ("fixbn", "bn"), ("hbn", "hbn")])
def test_auto_picks_vectorized_for_methods_with_stacked_hooks(method, norm):
    args = {"switch_round": 1} if method == "fixbn" else {}
    sim = Simulation(ExperimentConfig(dataset="digits", num_clients=3, rounds=1, method=method, norm=norm,
                                      method_args=args, checkpoint_every=0, out=None))
    assert sim.executor.name == "vectorized", sim.executor_note


def test_hooks_without_a_stacked_form_still_fall_back_with_a_reason():
    from fednorm.engine.vectorized import vectorization_blockers
    from fednorm.methods import FedAvg, register_method

    @register_method("_test_begin_only", force=True)
    class BeginOnly(FedAvg):
        name = "_test_begin_only"

        def client_begin(self, ctx):
            pass

    sim = Simulation(ExperimentConfig(dataset="digits", num_clients=3, rounds=1, method="_test_begin_only",
                                      checkpoint_every=0, out=None))
    assert sim.executor.name == "sequential"
    assert "client_begin without a stacked form" in sim.summary()["executor_note"]
    # a client optimizer without a stacked form keeps FBN sequential, and says why
    from fednorm.optim import FedProx, register_client_optimizer
    from fednorm.optim.client import CLIENT_OPTIMIZERS

    @register_client_optimizer("_test_unstacked_prox", force=True)
    class UnstackedProx(FedProx):
        name = "_test_unstacked_prox"
        stacked = False

    try:
        sim = Simulation(ExperimentConfig(dataset="digits", num_clients=3, rounds=1, method="fbn", norm="fbn",
                                          client_opt="_test_unstacked_prox", checkpoint_every=0, out=None))
    finally:  # other tests list the registry
        CLIENT_OPTIMIZERS.remove("_test_unstacked_prox")
    assert sim.executor.name == "sequential"
    assert "client optimizer '_test_unstacked_prox'" in sim.summary()["executor_note"]
    assert vectorization_blockers(sim.method)


@pytest.mark.parametrize("method, norm, args", [("fbn", "fbn", {}), ("hbn", "hbn", {"preset": "reference-code"})])
def test_server_optimizer_composition_keeps_the_stacked_hooks(method, norm, args):
    """A server optimizer adds no client hook: the composed method forwards the wrapped method's
    stacked hooks (HBN's reference-code preset keeps each client's own alpha through them)."""
    seq, vec = _pair(method=method, norm=norm, method_args=args, server_opt="fedavgm", partition="dirichlet", alpha=0.3)
    assert type(vec.method).__name__.startswith("Optimized")
    _assert_same(seq, vec)
    if method == "hbn":  # the evaluation re-sync is answered stacked through the composition too
        assert vec.executor.query_clients(vec.server_round, [0, 1], "statistics", vec.global_state) is not None


@pytest.mark.parametrize("partition", ["iid", "dirichlet"])
@pytest.mark.parametrize("preset", ["default", "reference-code"])
def test_hbn_statistics_query_stacked_equals_one_client_at_a_time(partition, preset, monkeypatch):
    """The evaluation re-sync / round T+1 query answered in stacked chunks (several clients per
    chunk and several forwards per batch index) equals each client's own pass."""
    import fednorm.nn.stacked.hbn as stacked

    kw = dict(method="hbn", norm="hbn", partition=partition, method_args={"preset": preset, "stats_batch_size": 16})
    if partition == "dirichlet":
        kw.update(alpha=0.3)
    seq, vec = _pair(**kw, augment=preset == "reference-code")
    seq.step(), vec.step()
    monkeypatch.setattr(stacked, "STATS_MAX_ROWS", 40)  # 2 clients of 16 rows per forward
    vec.executor.max_clients = 3  # chunks of 3 and 2 clients
    ids = list(range(5))
    stacked_answers = vec.executor.query_clients(vec.server_round, ids, "statistics", vec.global_state)
    assert stacked_answers is not None
    assert vec.query_clients(ids, "statistics").keys() == set(ids)
    for cid in ids:
        want = seq.client_query(cid, "statistics")
        assert set(stacked_answers[cid]) == set(want)
        for key, value in want.items():
            _close(value, stacked_answers[cid][key], f"client {cid} {key}")
