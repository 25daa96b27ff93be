"""FL optimizers: neutral settings equal FedAvg, update equations against hand computations (float64)."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from fednorm.config import ExperimentConfig
from fednorm.engine.simulator import Simulation
from fednorm.errors import ConfigError
from fednorm.methods import ClientContext
from fednorm.optim import FedAdam, FedAvgM, FedProx, FedYogi, Moon, Scaffold, get_server_optimizer
from fednorm.optim.client import SCAFFOLD_PREFIX
from fednorm.nn.state import batch_norm_keys


def _cfg(**kw):
    base = dict(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=4, clients_per_round=2, rounds=3,
                batch_size=32, lr=0.05, model="mlp", norm="bn", dtype="float64", executor="sequential", threads=1,
                augment=False, seed=3)
    base.update(kw)
    return ExperimentConfig(**base)


def _run(**kw):
    sim = Simulation(_cfg(**kw))
    for _ in sim.rounds():
        pass
    return sim


def _assert_states_equal(a, b):
    bad = [k for k in a if not torch.equal(a[k], b[k])]
    assert not bad, f"{len(bad)} tensors differ, e.g. {bad[:3]}"


# -- neutral settings --------------------------------------------------------------------------

def test_fedprox_mu0_equals_fedavg_bit_for_bit():
    ref = _run(momentum=0.9)
    with pytest.warns(UserWarning, match="equivalent to FedAvg"):
        prox = _run(momentum=0.9, client_opt="fedprox", client_opt_args={"mu": 0.0})
    _assert_states_equal(ref.global_state, prox.global_state)
    assert [h["test_loss"] for h in ref.history] == [h["test_loss"] for h in prox.history]


def test_moon_mu0_equals_fedavg_bit_for_bit():
    ref = _run(momentum=0.9)
    moon = _run(momentum=0.9, client_opt="moon", client_opt_args={"mu": 0.0})
    _assert_states_equal(ref.global_state, moon.global_state)


def test_scaffold_with_one_client_equals_local_sgd_to_1e12_and_its_variate_still_moves():
    ref = _run(num_clients=1, clients_per_round=None, momentum=0.0)
    sc = Simulation(_cfg(num_clients=1, clients_per_round=None, momentum=0.0, client_opt="scaffold"))
    cs = []
    for _ in sc.rounds():
        cs.append({k: v.clone() for k, v in sc.method.client_opt.c.items()})
    # c + (c_1' - c_1) equals c_1' up to float rounding, so the correction c - c_1 is ~1e-17, not 0
    for k, v in ref.global_state.items():
        torch.testing.assert_close(sc.global_state[k], v, rtol=0, atol=1e-12)
    # c = c_1 after every round (one client), and it is not zero: the correction cancels
    bank = sc.bank.get(0)
    for key, c in sc.method.client_opt.c.items():
        torch.testing.assert_close(bank[SCAFFOLD_PREFIX + key], c, rtol=0, atol=1e-12)
    assert any(not torch.equal(cs[0][k], cs[1][k]) for k in cs[0])


def test_fedavgm_momentum0_equals_fedavg():
    ref = _run(momentum=0.9)
    avgm = _run(momentum=0.9, server_opt="fedavgm", server_opt_args={"momentum": 0.0, "server_lr": 1.0})
    for k, v in ref.global_state.items():
        torch.testing.assert_close(avgm.global_state[k], v, rtol=0, atol=1e-12)


# -- FedProx gradient --------------------------------------------------------------------------

def test_fedprox_loss_adds_mu_times_displacement_to_the_gradient():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).double()
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.tensor([0, 1, 1, 0, 1])
    opt = FedProx(mu=0.3)
    opt.setup(model, _FakeMethod(["weight", "bias"]), num_clients=1)
    ctx = ClientContext(1, 0, model, x, y, {}, {})
    opt.begin(ctx)
    w0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        model.weight.add_(0.5)
        model.bias.sub_(0.25)
    data_loss = F.cross_entropy(model(x), y)
    (data_grad_w,) = torch.autograd.grad(data_loss, [model.weight], retain_graph=True)
    total = opt.loss(ctx, model, data_loss)
    total.backward()
    expected = data_grad_w + 0.3 * (model.weight.detach() - w0["weight"])
    torch.testing.assert_close(model.weight.grad, expected, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(model.bias.grad - 0.3 * (model.bias.detach() - w0["bias"]),
                               torch.autograd.grad(F.cross_entropy(model(x), y), [model.bias])[0], rtol=1e-13, atol=1e-13)


class _FakeMethod:
    def __init__(self, shared):
        self.shared_keys = shared


# -- SCAFFOLD against an independent implementation ----------------------------------------------

def _full_batch_cfg(**kw):
    # one batch per epoch (batch_size >= every client), so each local step is a full-batch gradient step
    return _cfg(norm="none", batch_size=4096, local_epochs=3, momentum=0.0, lr=0.1, num_clients=3, clients_per_round=2,
                alpha=1.0, client_opt="scaffold", **kw)


def test_scaffold_matches_option_ii_written_out():
    sim = Simulation(_full_batch_cfg())
    data, model = sim.data, sim.model
    x = {k: v.clone() for k, v in sim.global_state.items()}
    names = [n for n, _ in model.named_parameters()]
    c = {n: torch.zeros_like(x[n]) for n in names}
    ci = {cid: {n: torch.zeros_like(x[n]) for n in names} for cid in range(3)}
    lr, steps, n_total = 0.1, 3, 3
    for _ in range(3):
        record = sim.step()
        ys, deltas, sizes = [], [], []
        for cid in record.client_ids:
            idx = data.client_train[cid]
            model.load_state_dict(x)
            for _ in range(steps):
                loss = F.cross_entropy(model(data.train_x[idx]), data.train_y[idx])
                grads = torch.autograd.grad(loss, list(model.parameters()))
                with torch.no_grad():
                    for (n, p), g in zip(model.named_parameters(), grads):
                        p -= lr * (g - ci[cid][n] + c[n])  # SCAFFOLD's corrected step
            y = {n: p.detach().clone() for n, p in model.named_parameters()}
            new_ci = {n: ci[cid][n] - c[n] + (x[n] - y[n]) / (steps * lr) for n in names}  # Option II
            deltas.append({n: new_ci[n] - ci[cid][n] for n in names})
            ci[cid] = new_ci
            ys.append(y)
            sizes.append(len(idx))
        w = torch.tensor(sizes, dtype=torch.float64) / sum(sizes)
        for n in names:
            x[n] = sum(wk * yk[n] for wk, yk in zip(w, ys))
            c[n] = c[n] + len(ys) / n_total * sum(d[n] for d in deltas) / len(deltas)
        for n in names:
            torch.testing.assert_close(sim.global_state[n], x[n], rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(sim.method.client_opt.c[n], c[n], rtol=1e-10, atol=1e-12)
            for cid in record.client_ids:
                torch.testing.assert_close(sim.bank.get(cid)[SCAFFOLD_PREFIX + n], ci[cid][n], rtol=1e-10, atol=1e-12)


def test_scaffold_server_variate_and_participants_variates_change_every_round():
    sim = Simulation(_cfg(rounds=4, client_opt="scaffold", momentum=0.9))
    prev_c = {k: v.clone() for k, v in sim.method.client_opt.c.items()}
    for _ in range(4):
        before = {cid: dict(sim.bank.get(cid) or {}) for cid in range(4)}
        record = sim.step()
        c = sim.method.client_opt.c
        assert all(not torch.equal(c[k], prev_c[k]) for k in c if k.endswith("weight")), "c did not move"
        for cid in record.client_ids:
            now = sim.bank.get(cid)
            for k in c:
                if k.endswith("weight"):
                    old = before[cid].get(SCAFFOLD_PREFIX + k, torch.zeros_like(now[SCAFFOLD_PREFIX + k]))
                    assert not torch.equal(now[SCAFFOLD_PREFIX + k], old)
        prev_c = {k: v.clone() for k, v in c.items()}


@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("steps", [1, 2, 7])
def test_scaffold_effective_steps_is_torch_sgd_displacement_per_unit_gradient(beta, steps):
    w = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    g = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    opt = torch.optim.SGD([w], lr=0.1, momentum=beta)
    for _ in range(steps):
        w.grad = g.clone()
        opt.step()
    sc = Scaffold()
    sc.local_momentum = beta
    torch.testing.assert_close(-w.detach() / (0.1 * g), torch.full((3,), sc.effective_steps(steps), dtype=torch.float64))
    sc.momentum_aware = False
    assert sc.effective_steps(steps) == steps


# -- server optimizers --------------------------------------------------------------------------

def _two_steps(opt):
    old = {"w": torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)}
    a1 = {"w": torch.tensor([1.1, -2.0, 0.4999], dtype=torch.float64)}
    x1 = opt.step(old, a1)
    a2 = {"w": x1["w"] + torch.tensor([-0.2, 0.03, 0.0], dtype=torch.float64)}
    x2 = opt.step(x1, a2)
    return x1["w"], x2["w"]


def test_fedadam_two_steps_by_hand():
    eta, b1, b2, tau = 0.01, 0.9, 0.99, 1e-3
    x1, x2 = _two_steps(FedAdam())
    d1 = torch.tensor([0.1, 0.0, -0.0001], dtype=torch.float64)
    m1 = 0.1 * d1
    v1 = 0.99 * tau**2 + 0.01 * d1**2
    e1 = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + eta * m1 / (v1.sqrt() + tau)
    torch.testing.assert_close(x1, e1, rtol=1e-14, atol=1e-15)
    d2 = torch.tensor([-0.2, 0.03, 0.0], dtype=torch.float64)
    m2 = b1 * m1 + (1 - b1) * d2
    v2 = b2 * v1 + (1 - b2) * d2**2
    torch.testing.assert_close(x2, e1 + eta * m2 / (v2.sqrt() + tau), rtol=1e-14, atol=1e-15)


def test_fedyogi_two_steps_by_hand():
    eta, tau = 0.01, 1e-3
    x1, x2 = _two_steps(FedYogi())
    # step 1, coordinate by coordinate: v0 = 1e-6; d^2 = [1e-2, 0, 1e-8]
    # sign(v0 - d^2) = [-1, +1, +1] -> v1 = v0 + 0.01*d^2*[1, -1, -1]
    v1 = torch.tensor([1e-6 + 1e-4, 1e-6, 1e-6 - 1e-10], dtype=torch.float64)
    m1 = torch.tensor([0.01, 0.0, -0.00001], dtype=torch.float64)
    e1 = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + eta * m1 / (v1.sqrt() + tau)
    torch.testing.assert_close(x1, e1, rtol=1e-12, atol=1e-15)
    d2 = torch.tensor([-0.2, 0.03, 0.0], dtype=torch.float64)
    m2 = 0.9 * m1 + 0.1 * d2
    v2 = torch.stack([v1[0] + 0.01 * 0.04, v1[1] + 0.01 * 0.0009, v1[2]])  # d2^2 > v1 in 0, 1; d2 = 0 in 2
    torch.testing.assert_close(x2, e1 + eta * m2 / (v2.sqrt() + tau), rtol=1e-12, atol=1e-15)


def test_fedavgm_two_steps_by_hand():
    x1, x2 = _two_steps(FedAvgM(server_lr=0.5, momentum=0.8))
    d1 = torch.tensor([0.1, 0.0, -0.0001], dtype=torch.float64)
    e1 = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + 0.5 * d1
    torch.testing.assert_close(x1, e1, rtol=1e-14, atol=1e-15)
    d2 = torch.tensor([-0.2, 0.03, 0.0], dtype=torch.float64)
    torch.testing.assert_close(x2, e1 + 0.5 * (0.8 * d1 + d2), rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("server_opt", ["fedadam", "fedyogi", "fedavgm"])
def test_server_optimizer_moves_parameters_only_and_bn_buffers_keep_the_aggregate(server_opt):
    sim = Simulation(_cfg(rounds=3, server_opt=server_opt, momentum=0.9))
    aggregated = []
    inner_aggregate = sim.method.inner.aggregate

    def spy(server_round, global_state, updates):
        out = inner_aggregate(server_round, global_state, updates)
        aggregated.append({k: v.clone() for k, v in out.items()})
        return out

    sim.method.inner.aggregate = spy
    buffers = batch_norm_keys(sim.model, which="buffers")
    params = {n for n, _ in sim.model.named_parameters()}
    assert buffers and any(k.endswith("num_batches_tracked") for k in buffers)
    for r in range(3):
        sim.step()
        for k in buffers:
            assert torch.equal(sim.global_state[k], aggregated[r][k]), k
        assert all(not torch.equal(sim.global_state[k], aggregated[r][k]) for k in params if k.endswith("weight"))
    assert set(sim.method.server_opt.moments) == params


def test_fedadam_first_round_equals_hand_step_from_fedavg_aggregate():
    ref = Simulation(_cfg(rounds=1, momentum=0.9))
    x0 = {k: v.clone() for k, v in ref.global_state.items()}
    ref.step()
    adam = Simulation(_cfg(rounds=1, momentum=0.9, server_opt="fedadam", server_opt_args={"server_lr": 0.02}))
    adam.step()
    tau = 1e-3
    for k, v in x0.items():
        if k in dict(adam.model.named_parameters()):
            d = ref.global_state[k] - v
            expected = v + 0.02 * (0.1 * d) / ((0.99 * tau**2 + 0.01 * d**2).sqrt() + tau)
            torch.testing.assert_close(adam.global_state[k], expected, rtol=1e-12, atol=1e-14)
        else:  # buffers: the same as FedAvg's
            assert torch.equal(adam.global_state[k], ref.global_state[k]), k


# -- MOON ----------------------------------------------------------------------------------------

def test_moon_contrastive_loss_matches_the_formula():
    torch.manual_seed(1)
    z, zg, zp = (torch.randn(6, 4, dtype=torch.float64) for _ in range(3))
    got = Moon(temperature=0.5).contrastive(z, zg, zp)
    cos = lambda a, b: (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))
    pos, neg = torch.exp(cos(z, zg) / 0.5), torch.exp(cos(z, zp) / 0.5)
    torch.testing.assert_close(got, (-torch.log(pos / (pos + neg))).mean(), rtol=1e-13, atol=1e-13)


def test_moon_keeps_each_clients_last_model_and_uses_it_next_time():
    sim = Simulation(_cfg(rounds=2, client_opt="moon", client_opt_args={"mu": 1.0}, clients_per_round=None))
    r1 = sim.step()
    prev = {cid: {k[len("moon.prev."):]: v.clone() for k, v in sim.bank.get(cid).items() if k.startswith("moon.prev.")}
            for cid in r1.client_ids}
    # the banked previous model is the client's trained model: FedAvg of them is the new global model
    sizes = torch.tensor([len(sim.data.client_train[c]) for c in r1.client_ids], dtype=torch.float64)
    for key, _ in sim.model.named_parameters():
        avg = sum(w * prev[c][key] for w, c in zip(sizes / sizes.sum(), r1.client_ids))
        torch.testing.assert_close(sim.global_state[key], avg, rtol=1e-12, atol=1e-12)
    seen = []
    opt = sim.method.client_opt
    orig_begin = opt.begin

    def spy(ctx):
        orig_begin(ctx)
        seen.append((ctx.client_id, {k: v.clone() for k, v in opt._prev.state_dict().items()}))

    opt.begin = spy
    sim.step()
    for cid, state in seen:
        _assert_states_equal(state, prev[cid])


# -- composition and configuration -------------------------------------------------------------

def test_server_optimizer_and_stacked_client_optimizers_keep_the_vectorized_executor():
    vec = Simulation(_cfg(executor="auto", dtype="float32", server_opt="yogi"))
    assert vec.executor.name == "vectorized"
    # stacked forms (tests/test_vectorized_methods.py: equal to sequential)
    for opt in ("fedprox", "scaffold", "moon", "fedsam", "fedlc", "fedrs", "feddecorr", "fedacg"):
        sim = Simulation(_cfg(executor="auto", dtype="float32", client_opt=opt))
        assert sim.executor.name == "vectorized", sim.executor_note
    hbn = Simulation(_cfg(executor="auto", dtype="float32", norm="hbn", method="hbn", client_opt="fedprox"))
    assert hbn.executor.name == "vectorized", hbn.executor_note


def test_plain_config_builds_the_plain_method():
    from fednorm.methods import FedAvg

    assert type(Simulation(_cfg()).method) is FedAvg


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"client_opt": "scafold"}, "Did you mean 'scaffold'"),
        ({"server_opt": "adamw"}, "server_opt"),
        ({"client_opt": "fedprox", "client_opt_args": {"mu": -1}}, "mu must be >= 0"),
        ({"client_opt": "fedprox", "client_opt_args": {"m": 1}}, "client_opt_args for 'fedprox'"),
        ({"server_opt": "fedadam", "server_opt_args": {"beta1": 1.0}}, "beta1"),
        ({"server_opt": "fedadam", "server_opt_args": {"tau": 0}}, "tau"),
    ],
)
def test_bad_optimizer_settings_raise_config_errors(kw, needle):
    with pytest.raises(ConfigError, match=needle):
        Simulation(_cfg(**kw))


def test_registry_aliases():
    assert type(get_server_optimizer("yogi")) is FedYogi and type(get_server_optimizer("FedAdam")) is FedAdam
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FedProx(mu=0.01)
