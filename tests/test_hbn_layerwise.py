"""HBN's layer-wise statistics pass (``sync_pass: layerwise``): the exact statistics of every HBN
layer's input over the clients' union when the model runs as it is evaluated, i.e. with earlier
layers normalised by the pass's own pooled statistics (A.2's S(ω_g; D_g)), against an
independent float64 re-implementation; not what the one-pass (train-mode) re-sync gives; the
same on the sequential and vectorized executors; one exchange per layer."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fednorm.config import ExperimentConfig
from fednorm.engine.simulator import Simulation
from fednorm.errors import ConfigError
from fednorm.methods.base import ClientContext
from fednorm.methods.hbn import HBN
from fednorm.nn.hbn import HybridBatchNorm2d, collect_hbn_layer_statistics

EPS = 1e-5


class _TwoNorms(nn.Module):
    """conv → HBN → ReLU → conv → HBN, with the *second* HBN registered first, so that
    registration order is not the order in which the layers run."""

    def __init__(self) -> None:
        super().__init__()
        self.norm_b = HybridBatchNorm2d(4, eps=EPS)
        self.conv_a = nn.Conv2d(2, 3, 3, padding=1)
        self.norm_a = HybridBatchNorm2d(3, eps=EPS)
        self.conv_b = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm_b(self.conv_b(F.relu(self.norm_a(self.conv_a(x)))))


def _model() -> nn.Module:
    g = torch.Generator().manual_seed(0)
    model = _TwoNorms().double()
    with torch.no_grad():
        for conv in (model.conv_a, model.conv_b):
            conv.weight.copy_(torch.randn(conv.weight.shape, generator=g, dtype=torch.float64) * 0.5)
            conv.bias.copy_(torch.randn(conv.bias.shape, generator=g, dtype=torch.float64))
        for m in (model.norm_a, model.norm_b):  # non-trivial affine, buffers and mixing
            c = m.num_features
            m.weight.copy_(torch.rand(c, generator=g, dtype=torch.float64) + 0.5)
            m.bias.copy_(torch.randn(c, generator=g, dtype=torch.float64))
            m.running_mean.copy_(torch.randn(c, generator=g, dtype=torch.float64))
            m.running_var.copy_(torch.rand(c, generator=g, dtype=torch.float64) + 0.5)
            m.alpha.copy_(torch.randn(c, generator=g, dtype=torch.float64))
    return model


def _clients() -> list[torch.Tensor]:
    """Four clients of different sizes and distributions (one without data)."""
    g = torch.Generator().manual_seed(1)
    return [torch.randn(n, 2, 5, 5, generator=g, dtype=torch.float64) * s + shift
            for n, s, shift in ((5, 1.0, 0.0), (9, 2.0, 1.5), (0, 1.0, 0.0), (7, 0.5, -2.0))]


class _Server:
    """The server's view the method needs: every client answers a query on its own copy of the
    model loaded with the state the server sends."""

    def __init__(self, model: nn.Module, method: HBN, xs: list[torch.Tensor]) -> None:
        self.model, self.method, self.xs = model, method, xs
        self.global_state = {k: v.clone() for k, v in model.state_dict().items()}
        self.server_round = 1
        self.queries: list[str] = []

    def query_clients(self, client_ids, query, state=None):
        self.queries.append(query)
        out = {}
        for c in client_ids:
            model = copy.deepcopy(self.model)
            model.load_state_dict(self.global_state if state is None else state)
            x = self.xs[c]
            ctx = ClientContext(self.server_round, c, model, x, torch.zeros(len(x), dtype=torch.long), self.global_state, {})
            out[c] = self.method.client_query(query, ctx)
        return out


def _synced(method: HBN, xs: list[torch.Tensor]) -> tuple[dict[str, torch.Tensor], _Server]:
    model = _model()
    method.setup(model)
    server = _Server(model, method, xs)
    return method.synced_state(server, list(range(len(xs)))), server


def _reference(model: nn.Module, xs: list[torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Layer by layer on the concatenated data, with plain tensor ops: the union's mean and
    Bessel variance of layer 1's input (N − 1 counting samples, each contributing H·W values);
    layer 1 normalised with them; then layer 2's input."""
    x = torch.cat(xs)
    n = len(x)

    def moments(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values = h.transpose(0, 1).reshape(h.shape[1], -1)  # [C, N·H·W]
        mean = values.sum(1) / values.shape[1]
        hw = values.shape[1] / n
        return mean, ((values - mean[:, None]) ** 2).sum(1) / (hw * (n - 1))

    def normalise(h, mean, var, norm):
        view = (1, -1, 1, 1)
        return (h - mean.view(view)) / torch.sqrt(var.view(view) + EPS) * norm.weight.view(view) + norm.bias.view(view)

    with torch.no_grad():
        h1 = F.conv2d(x, model.conv_a.weight, model.conv_a.bias, padding=1)
        m1, v1 = moments(h1)
        h2 = F.conv2d(torch.clamp(normalise(h1, m1, v1, model.norm_a), min=0), model.conv_b.weight, model.conv_b.bias, padding=1)
        m2, v2 = moments(h2)
    return {"norm_a": (m1, v1), "norm_b": (m2, v2)}


def test_layerwise_pool_is_the_exact_inference_statistics_of_the_union():
    xs = _clients()
    model = _model()
    assert [n for n, m in model.named_modules() if isinstance(m, HybridBatchNorm2d)] == ["norm_b", "norm_a"]
    state, server = _synced(HBN(preset="paper", sync_pass="layerwise", stats_batch_size=4), xs)
    assert server.queries == ["statistics-layer-0", "statistics-layer-1"]  # one exchange per layer
    want = _reference(model, xs)
    for name, (mean, var) in want.items():
        torch.testing.assert_close(state[f"{name}.running_mean"], mean, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(state[f"{name}.running_var"], var, rtol=1e-12, atol=1e-12)
    # the weights, affine, alpha are the global state's
    for key, value in model.state_dict().items():
        if "running" not in key:
            assert torch.equal(state[key], value), key


def test_layerwise_pass_differs_from_the_one_pass_resyncs():
    """The first layer's input does not depend on any statistics: every pass agrees there. The
    second layer's does: the paper preset's train-mode pass (hybrid normalisation with each
    client's batches) and the eval-mode pass (the old global statistics) both measure another
    input."""
    xs = _clients()
    layerwise, _ = _synced(HBN(preset="paper", sync_pass="layerwise", stats_batch_size=4), xs)
    train, server = _synced(HBN(preset="paper", stats_batch_size=4), xs)
    assert server.queries == ["statistics"]
    evalmode, _ = _synced(HBN(preset="paper", stats_mode="eval", stats_batch_size=4), xs)
    for other in (train, evalmode):
        for key in ("norm_a.running_mean", "norm_a.running_var"):
            torch.testing.assert_close(other[key], layerwise[key], rtol=1e-12, atol=1e-12)
        for key in ("norm_b.running_mean", "norm_b.running_var"):
            assert (other[key] - layerwise[key]).abs().max() > 1e-2 * layerwise[key].abs().max(), key


def test_each_stacked_step_answers_what_the_per_client_step_does():
    """The vectorized executor's form of a step (one stacked pass of all clients, the layer
    picked by order of first call) on the model whose registration order is not its run order,
    against the per-client steps, under the global state with the first layer's pool loaded."""
    from fednorm.methods.base import StackedClientContext
    from fednorm.nn.stacked import stack_model

    xs = _clients()
    state, _ = _synced(HBN(preset="paper", sync_pass="layerwise", stats_batch_size=4), xs)
    model = _model()
    model.load_state_dict({**model.state_dict(), **{k: v for k, v in state.items() if k.startswith("norm_a.")}})
    method = HBN(preset="paper", sync_pass="layerwise", stats_batch_size=4)
    method.setup(model)
    net = stack_model(model, len(xs), example_input=xs[1][:4])
    for index in range(3):
        query = f"statistics-layer-{index}"
        ctx = StackedClientContext(1, list(range(len(xs))), net, xs, [torch.zeros(len(x), dtype=torch.long) for x in xs],
                                   model.state_dict(), [{} for _ in xs])
        stacked = method.stacked_client_query(query, ctx)
        for i, x in enumerate(xs):
            one = method.client_query(query, ClientContext(1, i, copy.deepcopy(model), x, torch.zeros(len(x), dtype=torch.long),
                                                           model.state_dict(), {}))
            assert set(stacked[i]) == set(one), (index, i)
            assert bool(one) == (index < 2 and len(x) > 0)
            for key, value in one.items():
                torch.testing.assert_close(stacked[i][key], value, rtol=1e-12, atol=1e-12)
    assert set(stacked_keys := {k for a in method.stacked_client_query("statistics-layer-1", ctx) for k in a}) == {
        "hbn.norm_b.count", "hbn.norm_b.mean", "hbn.norm_b.var"}, stacked_keys


def test_one_step_stops_at_its_layer_and_finds_none_past_the_last():
    model = _model()
    x = _clients()[1]
    calls = []
    model.conv_b.register_forward_pre_hook(lambda *_: calls.append(1))
    name, stats = collect_hbn_layer_statistics(model, x.split(4), 0)
    assert name == "norm_a" and not calls and float(stats.count) == len(x) * 25
    h1 = F.conv2d(x, model.conv_a.weight, model.conv_a.bias, padding=1)
    torch.testing.assert_close(stats.mean, h1.mean(dim=(0, 2, 3)), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(stats.var, h1.var(dim=(0, 2, 3), unbiased=False), rtol=1e-12, atol=1e-12)
    assert collect_hbn_layer_statistics(model, x.split(4), 1)[0] == "norm_b"
    assert collect_hbn_layer_statistics(model, x.split(4), 2) is None
    model.train()
    collect_hbn_layer_statistics(model, x.split(4), 1)
    assert model.training and model.norm_a.training  # flags restored


def _sim(executor: str, **kw) -> Simulation:
    base = dict(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=5, clients_per_round=3, rounds=2,
                batch_size=16, lr=0.05, momentum=0.9, model="simple_cnn", norm="hbn", method="hbn", dtype="float64",
                local_steps=3, eval_every=1, threads=1, checkpoint_every=0, executor=executor)
    base.update(kw)
    return Simulation(ExperimentConfig(**base))


@pytest.mark.parametrize("case", [
    # the initial pass (it trains with its pool) and every evaluation re-sync are layer-wise
    dict(method_args={"sync_pass": "layerwise"}),
    # the released code's choices: own alpha, hybrid uploads, 64 first samples by class, augmented
    dict(method_args={"preset": "reference-code", "sync_pass": "layerwise"}, augment=True),
])
def test_layerwise_pass_is_the_same_on_both_executors(case):
    seq, vec = _sim("sequential", **case), _sim("vectorized", **case)
    assert (seq.executor.name, vec.executor.name) == ("sequential", "vectorized")
    for _ in range(2):
        a, b = seq.step(), vec.step()
        assert a.client_ids == b.client_ids
        assert b.metrics["test_accuracy"] == pytest.approx(a.metrics["test_accuracy"], abs=1e-12)
    for key, value in seq.global_state.items():
        torch.testing.assert_close(vec.global_state[key], value, rtol=1e-10, atol=1e-12, msg=key)
    sa, sb = seq.method.synced_state(seq, [0, 1, 2, 3, 4]), vec.method.synced_state(vec, [0, 1, 2, 3, 4])
    for key, value in sa.items():
        torch.testing.assert_close(sb[key], value, rtol=1e-10, atol=1e-12, msg=key)
    assert seq.method.report(seq)["hbn_statistics_sync"] == vec.method.report(vec)["hbn_statistics_sync"]


def test_exchanges_are_counted_and_the_presets_keep_one_pass():
    sim = _sim("sequential", rounds=1, method_args={"preset": "paper", "sync_pass": "layerwise"})
    sim.step()  # one evaluation re-sync
    layers = len(sim.method.layers)
    assert sim.method.report(sim)["hbn_statistics_sync"] == {"pass": "layerwise", "exchanges": layers}
    sim.method.final_state(sim)  # round T+1
    assert sim.method.report(sim)["hbn_statistics_sync"]["exchanges"] == 2 * layers
    restored = _sim("sequential", rounds=1, method_args={"preset": "paper", "sync_pass": "layerwise"})
    restored.method.load_state_dict(sim.method.state_dict())
    assert restored.method.report(restored)["hbn_statistics_sync"]["exchanges"] == 2 * layers
    one = _sim("sequential", rounds=1, method_args={"preset": "paper"})
    one.step()
    assert one.method.report(one)["hbn_statistics_sync"] == {"pass": "single", "exchanges": 1}
    for preset in ("default", "paper", "reference-code"):
        assert HBN(preset=preset).sync_pass == "single"
    assert HBN(preset="paper", sync_pass="layerwise").hparams()["sync_pass"] == "layerwise"
    with pytest.raises(ConfigError, match="sync_pass"):
        HBN(sync_pass="exact")
