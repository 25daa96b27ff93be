"""FedTAN (spec/001_fedtan.md §6.2): exact identities in float64 against centralized BatchNorm."""

import copy

import pytest
import torch
import torch.nn.functional as F

from fednorm.config import ExperimentConfig
from fednorm.engine.lockstep import scale_client_grads, synced_loss
from fednorm.engine.simulator import Simulation
from fednorm.errors import ConfigError
from fednorm.models import get_model
from fednorm.nn.comm import LocalClientComm
from fednorm.nn.stacked import set_client_comm, stack_model


def _skewed_batches(sizes, in_channels=3, side=8, num_classes=4, seed=0):
    """Client batches with different sizes, label sets and feature shifts (non-IID)."""
    g = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    for i, n in enumerate(sizes):
        xs.append(torch.randn(n, in_channels, side, side, generator=g, dtype=torch.float64) * (1 + i) + 0.5 * i)
        ys.append(torch.randint(2 * i % num_classes, 2 * i % num_classes + 2, (n,), generator=g))
    return xs, ys


def _client_gradients(model, xs, ys, backward=True):
    """Each client's gradient of the synchronised step, from the stacked model: {name: [K, ...]}."""
    stacked = stack_model(model, len(xs), verify=False)
    stacked.train()
    set_client_comm(stacked, LocalClientComm(), backward=backward)
    losses, total, p = synced_loss(stacked, stacked, xs, ys)
    total.backward()
    params = dict(stacked.named_parameters())
    scale_client_grads(params, 1.0 / p)
    return {n: t.grad for n, t in params.items()}, losses.detach(), p, stacked


def _central(model, xs, ys):
    central = copy.deepcopy(model)
    central.train()
    x, y = torch.cat(xs), torch.cat(ys)
    per_sample = F.cross_entropy(central(x), y, reduction="none")
    per_sample.mean().backward()
    bounds = torch.tensor([0] + [len(t) for t in xs]).cumsum(0)
    client_losses = torch.stack([per_sample[bounds[i] : bounds[i + 1]].mean() for i in range(len(xs))]).detach()
    return {n: t.grad for n, t in central.named_parameters()}, client_losses, central


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp(min=1e-300))


MODELS = [("simple_cnn", {}), ("resnet20", {}), ("mlp", {"hidden": 16})]


@pytest.mark.parametrize("sizes", [[5, 3, 8], [6, 6, 6]], ids=["unequal", "equal"])
@pytest.mark.parametrize("name,kw", MODELS)
def test_synchronised_step_gradient_equals_centralized_bn_on_the_union_batch(name, kw, sizes):
    """T2: Σ_i p_i ∇F_i = ∇F_central for every parameter, with unequal batch sizes (p_i = B_i/ΣB,
    the padded tensor-op form) and equal ones (the native-kernel form); each client's forward
    equals the centralized forward on its rows; running statistics follow the union's statistics."""
    torch.manual_seed(0)
    model = get_model(name, num_classes=4, in_channels=3, input_size=8, norm="bn", **kw).double()
    xs, ys = _skewed_batches(sizes)
    grads, losses, p, stacked = _client_gradients(model, xs, ys)
    central_grads, central_losses, central = _central(model, xs, ys)
    torch.testing.assert_close(losses, central_losses, rtol=1e-12, atol=1e-13)
    for n, g in central_grads.items():
        weighted = torch.tensordot(p.to(grads[n].dtype), grads[n], dims=1)
        torch.testing.assert_close(weighted, g, rtol=1e-9, atol=1e-13, msg=lambda m: f"{n}: {m}")
    # the clients' own gradients are not all the centralized one (only their weighted mean is)
    assert max(_rel(grads[n][0], g) for n, g in central_grads.items()) > 1e-3
    buffers = dict(stacked.named_buffers())
    for n, b in central.named_buffers():
        if b.is_floating_point():
            for i in range(len(xs)):
                torch.testing.assert_close(buffers[n][i], b, rtol=1e-11, atol=1e-13)


def test_forward_only_sync_has_the_centralized_forward_but_not_its_gradient():
    """T5 (Property 3): synchronising only the statistics (FedAvg + Algorithm 2) leaves a gradient
    deviation on non-IID batches, while its forward pass equals the centralized one."""
    torch.manual_seed(0)
    model = get_model("simple_cnn", num_classes=4, in_channels=3, input_size=8, norm="bn").double()
    xs, ys = _skewed_batches([6, 4, 6])
    grads, losses, p, _ = _client_gradients(model, xs, ys, backward=False)
    central_grads, central_losses, _ = _central(model, xs, ys)
    torch.testing.assert_close(losses, central_losses, rtol=1e-12, atol=1e-13)
    deviation = max(
        _rel(torch.tensordot(p.to(grads[n].dtype), grads[n], dims=1), g) for n, g in central_grads.items()
    )
    assert deviation > 1e-3


@pytest.mark.parametrize("sizes", [[6, 4, 6], [5, 5, 5]], ids=["unequal", "equal"])
def test_forward_only_sync_gradient_is_each_clients_own_backward_through_the_union_statistics(sizes):
    """What the forward-only gradient *is*: client i's gradient of its own loss through a plain
    model whose every BatchNorm normalises with the union's mean and biased variance (values from
    a centralized forward on the union batch) while its backward sees only the client's own
    batch mean and its variance around the (constant) union mean. Computed here with plain
    modules whose forward is rewritten, against the stacked model's synchronised step (float64)."""
    torch.manual_seed(0)
    model = get_model("simple_cnn", num_classes=4, in_channels=3, input_size=8, norm="bn").double()
    xs, ys = _skewed_batches(sizes)
    grads, _, _, _ = _client_gradients(model, xs, ys, backward=False)
    bns = [n for n, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert len(bns) >= 2  # the union statistics of later layers depend on the earlier ones
    union: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    central = copy.deepcopy(model).train()
    modules = dict(central.named_modules())

    def record(name):
        def hook(mod, args):
            x = args[0].detach()
            dims = [0, *range(2, x.dim())]
            union[name] = (x.mean(dims), x.var(dims, unbiased=False))
        return hook

    hooks = [modules[n].register_forward_pre_hook(record(n)) for n in bns]
    with torch.no_grad():
        central(torch.cat(xs))
    for h in hooks:
        h.remove()
    for i, (x, y) in enumerate(zip(xs, ys)):
        net = copy.deepcopy(model).train()
        for name, m in net.named_modules():
            if name in union:
                mu, var = union[name]

                def forward(inp, m=m, mu=mu, var=var):
                    dims = [0, *range(2, inp.dim())]
                    shape = [1, -1, *([1] * (inp.dim() - 2))]
                    own_mean = inp.mean(dims)
                    own_var = ((inp - mu.view(shape)) ** 2).mean(dims)
                    mean = own_mean + (mu - own_mean).detach()   # the union's value, the client's gradient
                    v = own_var + (var - own_var).detach()
                    return (inp - mean.view(shape)) * torch.rsqrt(v + m.eps).view(shape) * m.weight.view(shape) + m.bias.view(shape)

                m.forward = forward
        F.cross_entropy(net(x), y).backward()
        for n, p in net.named_parameters():
            torch.testing.assert_close(grads[n][i], p.grad, rtol=1e-9, atol=1e-12, msg=lambda m, n=n, i=i: f"client {i}, {n}: {m}")


def test_identical_client_batches_make_every_scheme_centralized():
    """T4 (Property 1): when every client holds a permutation of the same batch, forward-only
    sync gives each client the centralized gradient too."""
    torch.manual_seed(1)
    model = get_model("simple_cnn", num_classes=4, in_channels=3, input_size=8, norm="bn").double()
    x = torch.randn(6, 3, 8, 8, dtype=torch.float64)
    y = torch.randint(0, 4, (6,))
    perms = [torch.randperm(6) for _ in range(3)]
    xs, ys = [x[q] for q in perms], [y[q] for q in perms]
    central_grads, _, _ = _central(model, [x], [y])
    for backward in (True, False):
        grads, _, _, _ = _client_gradients(model, xs, ys, backward=backward)
        for n, g in central_grads.items():
            for i in range(3):
                torch.testing.assert_close(grads[n][i], g, rtol=1e-9, atol=1e-13)


def _digits_config(**kw):
    base = dict(
        dataset="digits", partition="dirichlet", alpha=0.3, num_clients=3, rounds=2, local_steps=1,
        batch_size=100_000, lr=0.5, model="mlp", model_args={"hidden": 32}, norm="bn", method="fedtan",
        dtype="float64", augment=False, eval_every=1000,
    )
    base.update(kw)
    return ExperimentConfig(**base)


def _centralized_gd(sim, rounds, lr):
    ref = copy.deepcopy(sim.model)
    ref.load_state_dict(sim.global_state)
    ref.train()
    idx = torch.cat([sim.data.client_train[c] for c in range(sim.config.num_clients)])
    x, y = sim.data.train_x[idx], sim.data.train_y[idx]
    for _ in range(rounds):
        ref.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        with torch.no_grad():
            for p in ref.parameters():
                p -= lr * p.grad
    return ref.state_dict()


@pytest.mark.slow
@pytest.mark.parametrize("model,model_args", [("mlp", {"hidden": 32}), ("resnet20", {})])
def test_fedtan_full_batch_rounds_equal_centralized_gradient_descent(model, model_args):
    """T7: one synchronised full-batch step per round on unequal, label-skewed clients reproduces
    gradient descent with BatchNorm on the union of the data — weights and running statistics."""
    cfg = _digits_config(model=model, model_args=model_args)
    sim = Simulation(cfg)
    sizes = sim.data.client_sizes()
    assert len(set(sizes.tolist())) > 1  # unequal clients
    expected = _centralized_gd(sim, cfg.rounds, cfg.lr)
    for _ in range(cfg.rounds):
        sim.step()
    for key, value in expected.items():
        torch.testing.assert_close(sim.global_state[key], value, rtol=1e-9, atol=1e-11, msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize("method", ["fedavg", "fedtan_forward"])
def test_baselines_do_not_equal_centralized_gradient_descent(method):
    """The identity above has power: FedAvg+BN and forward-only sync miss it on the same data."""
    cfg = _digits_config(method=method, rounds=1)
    sim = Simulation(cfg)
    expected = _centralized_gd(sim, 1, cfg.lr)
    sim.step()
    dev = max(_rel(sim.global_state[k], v) for k, v in expected.items() if k.endswith("weight"))
    assert dev > 1e-4


# T8 (communication, counted): tests/test_fedtan_comm.py


def test_fedtan2_freezes_statistics_after_the_switch_round():
    """T9: after M rounds the BN statistics stay exactly S̄_M while the weights keep training."""
    cfg = _digits_config(method_args={"freeze_after": 2}, rounds=4, local_steps=3, batch_size=64)
    sim = Simulation(cfg)
    sim.step()
    sim.step()
    frozen = {k: v.clone() for k, v in sim.global_state.items()}
    sim.step()
    sim.step()
    for k, v in frozen.items():
        if "running" in k or "num_batches" in k:
            assert torch.equal(sim.global_state[k], v), k
        elif k.endswith("weight"):
            assert not torch.equal(sim.global_state[k], v), k


def test_fedtan_needs_a_lockstep_executor():
    with pytest.raises(ConfigError, match="vectorized"):
        Simulation(_digits_config(executor="sequential"))
    with pytest.raises(ConfigError, match="synchronises all 3 clients"):
        Simulation(_digits_config(max_parallel_clients=2)).step()


def test_fedtan_needs_its_round_in_one_stack_and_the_error_names_the_budget_that_holds_it():
    """The stacked model's memory budget (stack_memory_gib) is what lets a lockstep round fit: one
    short of the round's 3 clients stops with the value to set, and that value trains as a large one."""
    import re

    large = Simulation(_digits_config(stack_memory_gib=64))
    count = sum(p.numel() for p in large.model.parameters()) + sum(b.numel() for b in large.model.buffers())
    per_client = 4 * 8 * count  # four float64 copies of the model
    with pytest.raises(ConfigError, match=r"all 3 clients .* at most 2 fit: the stacked model's memory budget \(stack_memory_gib\)") as err:
        Simulation(_digits_config(stack_memory_gib=2.5 * per_client / 2**30)).step()
    need = float(re.search(r"set stack_memory_gib to at least (\S+) ", str(err.value)).group(1))
    assert need >= 3 * per_client / 2**30
    exact = Simulation(_digits_config(stack_memory_gib=need))
    assert exact.executor.max_clients == 3
    for _ in range(2):
        a, b = large.step(), exact.step()
        assert a.train_loss == pytest.approx(b.train_loss, rel=1e-12)
    for key, value in large.global_state.items():
        torch.testing.assert_close(exact.global_state[key], value, rtol=1e-12, atol=1e-14)


def test_fedtan_learns_on_label_skewed_clients():
    cfg = ExperimentConfig(
        dataset="digits", partition="classes", classes_per_client=2, partition_args={"mode": "sequential"},
        num_clients=5, rounds=8, local_steps=5, batch_size=32, lr=0.1, momentum=0.9, model="mlp",
        norm="bn", method="fedtan", augment=False, eval_every=8,
    )
    sim = Simulation(cfg)
    for _ in range(cfg.rounds):
        record = sim.step()
    assert record.metrics["test_accuracy"] > 0.8


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_steps_after_the_synchronised_one_may_run_client_by_client(momentum):
    """FedTAN's steps 2..E in plain per-client models (``sequential_after_sync``, what ``auto``
    picks where a CPU runs large steps faster one by one) equal the all-stacked round in
    float64: unequal clients, a last partial batch, augmentation, clipping, momentum."""
    kw = dict(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=4, rounds=2, local_epochs=2,
              batch_size=24, lr=0.05, momentum=momentum, weight_decay=1e-3, max_grad_norm=5.0, model="simple_cnn",
              norm="bn", method="fedtan", augment=True, dtype="float64", eval_every=1, threads=1,
              checkpoint_every=0, out=None, executor="vectorized")
    stacked, split = Simulation(ExperimentConfig(**kw)), Simulation(ExperimentConfig(**kw))
    split.executor.sequential_after_sync = True
    for _ in range(2):
        a, b = stacked.step(), split.step()
        assert a.train_loss == pytest.approx(b.train_loss, rel=1e-10)
        assert b.metrics["test_accuracy"] == pytest.approx(a.metrics["test_accuracy"], abs=1e-12)
        assert b.metrics["uplink_bytes"] == a.metrics["uplink_bytes"]  # the same layer-wise exchanges
    assert stacked.executor.last_samples_seen == split.executor.last_samples_seen
    assert stacked.executor._plain is None and split.executor._plain is not None  # the split ran
    for key, value in stacked.global_state.items():
        torch.testing.assert_close(split.global_state[key], value, rtol=1e-10, atol=1e-12, msg=key)


def test_auto_runs_fedtans_unsynchronised_steps_one_by_one_where_steps_are_large(monkeypatch):
    import fednorm.engine.cost as cost

    cfg = _digits_config(batch_size=32)
    assert not Simulation(cfg).executor.sequential_after_sync  # small steps: all stacked
    monkeypatch.setattr(cost, "SEQUENTIAL_MACS", 0)
    sim = Simulation(cfg)
    assert sim.executor.name == "vectorized" and sim.executor.sequential_after_sync
    assert "client by client" in sim.summary()["executor_note"]
