"""FBN method: the aggregated shared statistics equal centralized BatchNorm's, step after step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fednorm.config import ExperimentConfig
from fednorm.engine.simulator import Simulation
from fednorm.methods import get_method
from fednorm.methods.base import ClientContext, ClientUpdates, stack_rows
from fednorm.nn.fbn import FederatedBatchNorm2d
from fednorm.robust import get_aggregator

BETA = 0.1


def _net(norm: type[nn.Module], **kw) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), norm(3, **kw), nn.ReLU(), nn.Conv2d(3, 4, 3), norm(4, **kw)).double()


def _layer_channels(net: nn.Module, names: list[str], x: torch.Tensor) -> dict[str, np.ndarray]:
    """Each named layer's input on ``x`` (hooks on a no-grad forward), as ``[C, N·H·W]`` numpy."""
    modules = dict(net.named_modules())
    inputs: dict[str, torch.Tensor] = {}
    hooks = [modules[n].register_forward_pre_hook(lambda _m, a, n=n: inputs.__setitem__(n, a[0].detach())) for n in names]
    with torch.no_grad():
        net(x)
    for h in hooks:
        h.remove()
    return {n: inputs[n].transpose(0, 1).reshape(inputs[n].shape[1], -1).numpy() for n in names}


def _client_round(method, model, global_state, xs_per_step, server_round=1) -> dict[str, torch.Tensor]:
    """One client's round without the optimiser: forward each step's batch in training mode."""
    model.load_state_dict(global_state)
    ctx = ClientContext(server_round, 0, model, xs_per_step[0], torch.zeros(0), global_state, {})
    method.client_begin(ctx)
    model.train()
    for x in xs_per_step:
        model(x)
    method.client_end(ctx)
    return ctx.uploads


def _run_fbn(method, fbn_net, client_batches, global_state):
    """Aggregate one round of ``client_batches[i][e]`` (client i, step e); returns the new state.
    Each client's ``num_examples`` is the number of samples it trained on."""
    uploads = [_client_round(method, fbn_net, global_state, steps) for steps in client_batches]
    k = len(uploads)
    updates = ClientUpdates(
        client_ids=list(range(k)),
        states={key: torch.stack([global_state[key]] * k) for key in method.shared_keys},
        num_examples=torch.tensor([float(sum(len(x) for x in steps)) for steps in client_batches], dtype=torch.float64),
        train_loss=torch.zeros(k, dtype=torch.float64),
        num_steps=torch.tensor([len(steps) for steps in client_batches]),
        extras={key: stack_rows([u[key] for u in uploads]) for key in uploads[0]},  # the engine's stacking
    )
    new = dict(global_state)
    new.update(method.aggregate(1, global_state, updates))
    return new


@pytest.mark.parametrize(
    "mode,steps,sizes",
    [
        ("exact", [1, 1, 1, 1], [3, 3, 3, 3]),  # Algorithm 2 exactly
        ("literal", [1, 1, 1, 1], [3, 3, 3, 3]),
        ("exact", [3, 3, 3, 3], [3, 3, 3, 3]),  # F10
        ("exact", [3, 1, 2, 4], [3, 5, 1, 2]),  # unequal clients: different step counts and batches
        ("literal", [1, 1, 1], [2, 7, 4]),  # unequal batches, one step: Eq. 9–10 with count weights
    ],
)
def test_shared_statistics_equal_centralized_batchnorm_step_after_step(mode, steps, sizes):
    """F1/F3/F10 and footnote 2: over several rounds, FBN's shared running statistics equal those
    of torch.nn.BatchNorm2d run centrally on the union batches (float64). With unequal clients the
    e-th union batch is the e-th batch of every client that took an e-th step.

    The network's earlier FBN layers normalise with the shared statistics, so the centralized
    reference feeds each BN layer the same input: it runs the FBN net in eval mode with hooks
    capturing every FBN layer's input, and steps an independent ``nn.BatchNorm2d`` on it."""
    torch.manual_seed(1)
    fbn_net = _net(FederatedBatchNorm2d, momentum=BETA)
    method = get_method("fbn", mode=mode)
    method.setup(fbn_net)
    state = {k: v.clone() for k, v in fbn_net.state_dict().items()}
    refs = {name: nn.BatchNorm2d(m.num_features, momentum=BETA).double() for name, m in fbn_net.named_modules() if isinstance(m, FederatedBatchNorm2d)}
    for rnd in range(4):
        shifts = [torch.randn(1, 2, 1, 1, dtype=torch.float64) * 3 for _ in sizes]  # heterogeneous clients
        batches = [[torch.randn(b, 2, 5, 5, dtype=torch.float64) * (1 + i) + shifts[i] for _ in range(steps[i])] for i, b in enumerate(sizes)]
        # reference: each step, the union batch through the net with the round-start shared statistics
        fbn_net.load_state_dict(state)
        fbn_net.eval()
        for e in range(max(steps)):
            union = torch.cat([batches[i][e] for i in range(len(sizes)) if e < steps[i]])
            inputs = {}
            hooks = [m.register_forward_pre_hook(lambda _m, a, n=n: inputs.__setitem__(n, a[0])) for n, m in fbn_net.named_modules() if n in refs]
            fbn_net(union)
            for h in hooks:
                h.remove()
            for name, ref in refs.items():
                ref.train()
                ref(inputs[name])
        state = _run_fbn(method, fbn_net, batches, state)
        for name, ref in refs.items():
            torch.testing.assert_close(state[f"{name}.running_mean"], ref.running_mean, rtol=0, atol=1e-12)
            torch.testing.assert_close(state[f"{name}.running_var"], ref.running_var, rtol=0, atol=1e-12)


def _fbn_round_updates(method, net, state, sizes, seed=0):
    torch.manual_seed(seed)
    batches = [[torch.randn(b, 2, 5, 5, dtype=torch.float64) + 4 * i] for i, b in enumerate(sizes)]
    uploads = [_client_round(method, net, state, steps) for steps in batches]
    k = len(sizes)
    return ClientUpdates(
        client_ids=list(range(k)),
        states={key: torch.stack([state[key]] * k) for key in method.shared_keys},
        num_examples=torch.ones(k, dtype=torch.float64),
        train_loss=torch.zeros(k, dtype=torch.float64),
        num_steps=torch.ones(k, dtype=torch.int64),
        extras={key: torch.stack([u[key] for u in uploads]) for key in uploads[0]},
    )


def test_unequal_batches_are_exact_with_count_weights_f7():
    net = _net(FederatedBatchNorm2d, momentum=BETA)
    method = get_method("fbn")
    method.setup(net)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    sizes = [1, 4, 2]
    updates = _fbn_round_updates(method, net, state, sizes, seed=5)
    new = method.aggregate(1, state, updates)
    torch.manual_seed(5)
    union = torch.cat([torch.randn(b, 2, 5, 5, dtype=torch.float64) + 4 * i for i, b in enumerate(sizes)])
    ref = nn.BatchNorm2d(3, momentum=BETA).double().train()
    ref(net[0](union))
    torch.testing.assert_close(new["1.running_mean"], ref.running_mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(new["1.running_var"], ref.running_var, rtol=0, atol=1e-12)


def test_robust_fbn_under_sign_flip_f8():
    """f = 3 sign-flipping clients: the mean moves the shared mean far outside the honest range,
    the median (with or without NNM) and the trimmed mean keep it inside; variances stay >= 0;
    the 'mean' aggregator object is the exact rule, bit for bit."""
    from fednorm.robust import get_attack

    net = _net(FederatedBatchNorm2d, momentum=BETA)
    method = get_method("fbn")
    method.setup(net)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    state["1.running_mean"] += 5.0  # after warm-up the honest copies cluster near the shared mean
    honest = _fbn_round_updates(method, net, state, [4] * 7, seed=2)
    exact = method.aggregate(1, state, honest)
    method.stats_aggregator = get_aggregator("mean")
    assert all(torch.equal(exact[k], v) for k, v in method.aggregate(1, state, honest).items())
    attacked = get_attack("sign_flip", 3, "stats", {"variance": True}, first_id=7)(honest, state, method)
    lo = honest.extras["fbn.1.mean"][:, 0].min(0).values
    hi = honest.extras["fbn.1.mean"][:, 0].max(0).values
    mean = method.aggregate(1, state, attacked)["1.running_mean"]
    assert ((mean < lo) | (mean > hi)).any()
    for rule, use_nnm in (("median", False), ("median", True), ("trimmed_mean", False), ("trimmed_mean", True)):
        method.stats_aggregator = get_aggregator(rule, f=3, nnm=use_nnm)
        new = method.aggregate(1, state, attacked)
        assert ((new["1.running_mean"] >= lo - 1e-12) & (new["1.running_mean"] <= hi + 1e-12)).all(), rule
        assert (new["1.running_var"] >= 0).all() and (new["4.running_var"] >= 0).all()
    for variant in ("two_stage", "literal"):  # with no attack the robust rules stay close to FBN
        m = get_method("fbn", robust_variance=variant)
        m.setup(net)
        m.stats_aggregator = get_aggregator("median", f=3)
        new = m.aggregate(1, state, honest)
        assert (new["1.running_var"] - exact["1.running_var"]).abs().max() < 0.3 * exact["1.running_var"].max()


def test_fbn_layers_need_the_fbn_method_and_fbn_needs_them():
    from fednorm.errors import ConfigError

    with pytest.raises(ConfigError, match="only works under method 'fbn'"):
        Simulation(ExperimentConfig(norm="fbn", method="fedavg", rounds=1, out=None))
    with pytest.raises(ConfigError, match="needs FBN layers"):
        Simulation(ExperimentConfig(norm="bn", method="fbn", rounds=1, out=None))


def test_initial_pass_gives_every_layer_the_exact_statistics_of_its_input_on_the_union(tmp_path):
    """``initial_pass``: before round 1 the shared statistics of every FBN layer are
    the unbiased mean and variance of that layer's input over all clients' training samples,
    with every layer normalising with the statistics so set (float64, independent reference:
    one centralized forward over the union with hooks, numpy moments). DSGD keeps (0, 1)."""
    cfg = dict(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=4, rounds=1, model="simple_cnn", norm="fbn",
               method="fbn", dtype="float64", threads=1, checkpoint_every=0, out=None)
    sim = Simulation(ExperimentConfig(**cfg))
    start = sim.method.initial_state(sim)
    assert start is not None
    net = sim.global_model(start).eval()
    names = [n for n, m in net.named_modules() if isinstance(m, FederatedBatchNorm2d)]
    assert len(names) >= 2
    union = torch.cat([sim.data.train_x.index_select(0, ix) for ix in sim.data.client_train])
    channels = _layer_channels(net, names, union)
    for n in names:
        x = channels[n]
        np.testing.assert_allclose(start[f"{n}.running_mean"].numpy(), x.mean(axis=1), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(start[f"{n}.running_var"].numpy(), x.var(axis=1, ddof=1), rtol=1e-10, atol=1e-12)
    assert not torch.equal(start[f"{names[0]}.running_var"], torch.ones_like(start[f"{names[0]}.running_var"]))
    dsgd = Simulation(ExperimentConfig(**dict(cfg, dsgd=True)))
    assert dsgd.method.initial_state(dsgd) is None  # the paper's loop starts from (0, 1)


def test_round_average_mode_is_hbn_codes_fbn_baseline():
    """``mode: round_average`` against a numpy transcription of HBN's released FBN baseline
    (the authors' ``FedBaseline/models/FBN``): each client averages its round's per-batch mean and
    biased variance
    uniformly; the server pools with sample counts, takes a momentum step for the mean, and the
    variance Σ N_k[σ_k² + (μ_k − μ̃)²]/(N − 1) about the smoothed mean μ̃, then a momentum step.
    Unequal clients (steps 3, 1, 2; batches 3, 5, 2), two rounds, float64. The layer inputs come
    from hooks on an eval-mode forward (FBN normalises with the shared statistics either way)."""
    torch.manual_seed(3)
    net = _net(FederatedBatchNorm2d, momentum=BETA)
    method = get_method("fbn", mode="round_average")
    method.setup(net)
    names = [n for n, m in net.named_modules() if isinstance(m, FederatedBatchNorm2d)]
    state = {k: v.clone() for k, v in net.state_dict().items()}
    steps, sizes = [3, 1, 2], [3, 5, 2]
    for rnd in range(2):
        batches = [[torch.randn(b, 2, 5, 5, dtype=torch.float64) * (1 + i) + 2 * i for _ in range(steps[i])] for i, b in enumerate(sizes)]
        net.load_state_dict(state)
        net.eval()
        expected = {}
        per_client = {n: [] for n in names}  # (N_k, mean of batch means, mean of batch variances)
        for client in batches:
            moments = {n: [] for n in names}
            for x in client:
                for n, z in _layer_channels(net, names, x).items():
                    moments[n].append((z.mean(axis=1), z.var(axis=1)))
            for n in names:
                per_client[n].append((len(client) * len(client[0]), np.mean([m for m, _ in moments[n]], axis=0), np.mean([v for _, v in moments[n]], axis=0)))
        for n in names:
            total = sum(k for k, _, _ in per_client[n])
            mu = sum(k * m for k, m, _ in per_client[n]) / total
            smoothed = (1 - BETA) * state[f"{n}.running_mean"].numpy() + BETA * mu
            var = sum(k * (v + (m - smoothed) ** 2) for k, m, v in per_client[n]) / (total - 1)
            expected[n] = (smoothed, (1 - BETA) * state[f"{n}.running_var"].numpy() + BETA * var)
        state = _run_fbn(method, net, batches, state)
        for n in names:
            np.testing.assert_allclose(state[f"{n}.running_mean"].numpy(), expected[n][0], rtol=0, atol=1e-12)
            np.testing.assert_allclose(state[f"{n}.running_var"].numpy(), expected[n][1], rtol=0, atol=1e-12)
    assert not torch.allclose(state[f"{names[0]}.running_var"], torch.ones(3, dtype=torch.float64))
    from fednorm.errors import ConfigError

    with pytest.raises(ConfigError, match="round_average"):  # refused when the run is built, before any round
        method.stats_aggregator = get_aggregator("median", f=1)
    method.stats_aggregator = get_aggregator("mean")  # the mean is the plain rule: accepted


def test_literal_mode_warns_once_when_the_round_forgets_its_starting_statistics():
    """``literal`` with E steps keeps (1 − β)^E of the round-start statistics; below 1% the
    method warns, once. Exact mode and short rounds do not warn."""
    import warnings

    net = _net(FederatedBatchNorm2d, momentum=BETA)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    torch.manual_seed(0)
    long_round = [[torch.randn(2, 2, 5, 5, dtype=torch.float64) for _ in range(50)] for _ in range(2)]  # 0.9^50 = 5e-3
    short_round = [[torch.randn(2, 2, 5, 5, dtype=torch.float64) for _ in range(40)] for _ in range(2)]  # 0.9^40 = 1.5e-2
    for mode, batches, warns in (("literal", long_round, True), ("literal", short_round, False), ("exact", long_round, False)):
        method = get_method("fbn", mode=mode)
        method.setup(net)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _run_fbn(method, net, batches, state)
            _run_fbn(method, net, batches, state)
        hits = [w for w in caught if "FBN mode 'literal'" in str(w.message)]
        assert len(hits) == (1 if warns else 0), (mode, len(batches[0]))
