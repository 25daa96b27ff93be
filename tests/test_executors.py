"""Vectorized and sequential executors agree (float64, to rounding), masking included."""

import pytest
import torch

from fednorm.config import ExperimentConfig
from fednorm.engine.simulator import Simulation
from fednorm.errors import ConfigError


def _pair(**kw):
    base = dict(dataset="digits", partition="dirichlet", alpha=0.3, num_clients=5, rounds=2, batch_size=32, lr=0.05,
                momentum=0.9, weight_decay=1e-3, model="simple_cnn", norm="bn", dtype="float64", eval_every=100)
    base.update(kw)
    seq = Simulation(ExperimentConfig(**base, executor="sequential"))
    vec = Simulation(ExperimentConfig(**base, executor="vectorized"))
    # both sides of every comparison must run where they say (a mutant that built the vectorized
    # executor for "sequential" passed every case before these checks)
    assert vec.executor.name == "vectorized" and seq.executor.name == "sequential"
    assert type(seq.executor).__name__ == "SequentialExecutor" and type(vec.executor).__name__ == "VectorizedExecutor"
    return seq, vec


def _assert_same(seq, vec, rounds=2):
    for _ in range(rounds):
        a, b = seq.step(), vec.step()
        assert a.client_ids == b.client_ids
        assert a.train_loss == pytest.approx(b.train_loss, rel=1e-10)
    assert seq.executor.last_samples_seen == vec.executor.last_samples_seen
    for key, value in seq.global_state.items():
        torch.testing.assert_close(vec.global_state[key], value, rtol=1e-10, atol=1e-12, msg=lambda m: f"{key}: {m}")
    assert set(seq.bank) == set(vec.bank)
    for cid in seq.bank:
        for key, value in seq.bank.get(cid).items():
            torch.testing.assert_close(vec.bank.get(cid)[key], value, rtol=1e-10, atol=1e-12, msg=lambda m: f"client {cid} {key}: {m}")


@pytest.mark.parametrize("norm", ["bn", "gn", "ln", "none"])
def test_fedavg_vectorized_equals_sequential_with_unequal_clients(norm):
    seq, vec = _pair(norm=norm, max_grad_norm=1.0, augment=True)
    sizes = seq.data.client_sizes()
    assert len(set(sizes.tolist())) > 1 and any(n % 32 not in (0, 1) for n in sizes)  # masking and ragged batches happen
    _assert_same(seq, vec)


@pytest.mark.parametrize("method", ["fedbn", "silobn"])
def test_personalized_methods_vectorized_equal_sequential(method):
    seq, vec = _pair(method=method, model="mlp", clients_per_round=3, rounds=3)
    _assert_same(seq, vec, rounds=3)


def test_fixed_local_steps_and_partial_participation():
    seq, vec = _pair(local_steps=6, batch_size=16, num_clients=8, clients_per_round=4, model="simple_cnn", norm="ln")
    _assert_same(seq, vec)


def test_dsgd_vectorized_equals_sequential():
    seq, vec = _pair(dsgd=True, model="mlp", norm="bn", rounds=3, momentum=0.5)
    _assert_same(seq, vec, rounds=3)


def test_chunks_of_clients_equal_one_stack():
    seq, vec = _pair(model="mlp", num_clients=7, max_parallel_clients=3)
    _assert_same(seq, vec)


def test_auto_picks_vectorized_and_falls_back_with_a_note():
    sim = Simulation(ExperimentConfig(dataset="digits", num_clients=3, rounds=1))
    assert sim.executor.name == "vectorized"
    from fednorm.methods import FedAvg, register_method

    @register_method("_test_hooked", force=True)
    class Hooked(FedAvg):
        name = "_test_hooked"

        def client_loss(self, ctx, model, loss):
            return loss

    sim = Simulation(ExperimentConfig(dataset="digits", num_clients=3, rounds=1, method="_test_hooked"))
    assert sim.executor.name == "sequential" and "client_loss" in sim.summary()["executor_note"]
    with pytest.raises(ConfigError, match="vectorized"):
        Simulation(ExperimentConfig(dataset="digits", num_clients=3, rounds=1, method="_test_hooked", executor="vectorized"))


def test_forward_macs_counts_convolutions_and_linear_layers_by_hand():
    from fednorm.engine.cost import forward_macs
    from fednorm.models import get_model

    # Simple-CNN at 32x32: three 3x3 convolutions (3->16 at 32x32, 16->32 at 16x16, 32->64 at 8x8),
    # Linear(64*4*4 -> 128) and the head 128 -> 10.
    want = 16 * 3 * 9 * 32 * 32 + 32 * 16 * 9 * 16 * 16 + 64 * 32 * 9 * 8 * 8 + 1024 * 128 + 128 * 10
    model = get_model("simple_cnn", num_classes=10, in_channels=3, input_size=(32, 32))
    assert forward_macs(model, torch.zeros(3, 3, 32, 32)) == want
    assert model.training  # the probe leaves the mode as it found it


@pytest.mark.parametrize("model, batch, expected", [
    ("simple_cnn", 64, "vectorized"),   # 8x8 digits: a step is 11M multiply-adds, overhead-bound
    ("fedbn_cnn", 16, "vectorized"),    # B <= 16 always runs stacked
    ("fedbn_cnn", 32, "sequential"),    # 2,000M-MAC steps: grouped convolutions lose on a CPU
])
def test_auto_runs_large_steps_one_client_at_a_time_on_cpu(model, batch, expected):
    sim = Simulation(ExperimentConfig(dataset="digits", num_clients=3, rounds=1, model=model, batch_size=batch,
                                      checkpoint_every=0, out=None))
    assert sim.executor.name == expected, sim.executor_note
    if expected == "sequential":
        assert "multiply-adds" in sim.executor_note
    # an explicit choice is always kept, and a lockstep method (FedTAN) stays stacked
    forced = Simulation(ExperimentConfig(dataset="digits", num_clients=3, rounds=1, model=model, batch_size=batch,
                                         executor="vectorized", checkpoint_every=0, out=None))
    assert forced.executor.name == "vectorized"
    tan = Simulation(ExperimentConfig(dataset="digits", num_clients=3, rounds=1, model=model, batch_size=batch,
                                      method="fedtan", checkpoint_every=0, out=None))
    assert tan.executor.name == "vectorized"


def test_feature_norm_models_vectorized_equal_sequential():
    seq, vec = _pair(model="simple_cnn", norm="none", model_args={"feature_norm": True}, rounds=1)
    _assert_same(seq, vec, rounds=1)


def test_hbn_layers_are_not_mistaken_for_plain_bn():
    import torch

    from fednorm.models import get_model
    from fednorm.nn.stacked import StackedBatchNorm, StackedHybridBatchNorm, stack_model

    # stack_model verifies the stacked forward against the HBN model's, train and eval mode
    net = stack_model(get_model("simple_cnn", in_channels=1, input_size=8, norm="hbn"), 2, example_input=torch.randn(2, 1, 8, 8))
    layers = [m for m in net.modules() if isinstance(m, StackedBatchNorm)]
    assert layers and all(isinstance(m, StackedHybridBatchNorm) for m in layers)


def _client_bytes(sim) -> int:
    """One client's share of a stacked model, counted apart from fednorm.engine.stack_memory: four
    copies of every parameter and buffer, 8 bytes each (float64, and the int64 batch counters)."""
    count = sum(p.numel() for p in sim.model.parameters()) + sum(b.numel() for b in sim.model.buffers())
    assert sim.config.dtype == "float64"
    return 4 * 8 * count


def test_the_memory_budget_sets_how_many_clients_stack_and_not_the_results():
    """stack_memory_gib caps a stacked model at budget // (4 × model bytes) clients; a budget that
    holds 3 of the 7 clients trains them in chunks of 3, 3 and 1, and equals one stack of all 7."""
    kw = dict(dataset="digits", partition="dirichlet", alpha=0.3, num_clients=7, rounds=2, batch_size=32, lr=0.05,
              momentum=0.9, model="mlp", norm="bn", dtype="float64", eval_every=100, executor="vectorized")
    large = Simulation(ExperimentConfig(**kw, stack_memory_gib=64))
    per_client = _client_bytes(large)
    for clients in (1, 3, 5):
        gib = (clients + 0.5) * per_client / 2**30
        sim = Simulation(ExperimentConfig(**kw, stack_memory_gib=gib))
        assert sim.executor.max_clients == clients
    assert large.executor.max_clients == 64  # max_parallel_clients holds it, not the budget
    small = Simulation(ExperimentConfig(**kw, stack_memory_gib=3.5 * per_client / 2**30))
    chunks = []
    run_chunk = small.executor._run_chunk
    small.executor._run_chunk = lambda r, ids, *a: chunks.append(len(ids)) or run_chunk(r, ids, *a)
    _assert_same(large, small)
    assert chunks == [3, 3, 1, 3, 3, 1]


@pytest.mark.parametrize("client_opt, copies", [("fedprox", 1), ("scaffold", 1), ("moon", 2)])
def test_a_client_optimizers_own_copies_count_in_the_memory_budget(client_opt, copies):
    """FedProx's anchor, SCAFFOLD's correction and MOON's two frozen models are per-client copies
    the stacked model does not hold: a budget for 3 clients of plain FedAvg holds fewer of them
    (the 4 + copies model copies counted here, apart from fednorm.engine.stack_memory), and the
    memory the stacked hooks hold per client, measured, is that many models (to BN's buffers)."""
    kw = dict(dataset="digits", partition="dirichlet", alpha=0.3, num_clients=7, rounds=1, batch_size=32, lr=0.05,
              model="mlp", norm="bn", dtype="float64", eval_every=100, executor="vectorized")
    per_client = _client_bytes(Simulation(ExperimentConfig(**kw, stack_memory_gib=64)))
    gib = 3.5 * per_client / 2**30
    assert Simulation(ExperimentConfig(**kw, stack_memory_gib=gib)).executor.max_clients == 3
    sim = Simulation(ExperimentConfig(**kw, stack_memory_gib=gib, client_opt=client_opt))
    assert sim.executor.max_clients == int(3.5 * 4 // (4 + copies))

    # what the hooks hold at their first chunk of 1 and of 2 clients, counted from their tensors
    def tensors_of(value, out: dict) -> dict:
        if isinstance(value, torch.Tensor):
            out[id(value)] = value
        elif isinstance(value, torch.nn.Module):
            out.update({id(t): t for t in value.state_dict().values()})
        elif isinstance(value, dict):
            for v in value.values():
                tensors_of(v, out)
        elif isinstance(value, (tuple, list)):
            for v in value:
                tensors_of(v, out)
        return out

    def first_chunk_holds(chunk: int) -> int:
        run = Simulation(ExperimentConfig(**kw, client_opt=client_opt))
        run.executor.max_clients = chunk
        opt, held = run.method.client_opt, []
        begin = opt.stacked_begin

        def measure(ctx):
            begin(ctx)
            if not held:
                assert len(ctx) == chunk
                held.append(sum(t.numel() * t.element_size() for t in tensors_of(list(opt.__dict__.values()), {}).values()))

        opt.stacked_begin = measure
        for _ in run.rounds():
            pass
        return held[0]

    per_client_held = first_chunk_holds(2) - first_chunk_holds(1)  # what a client adds (shared copies cancel)
    model_bytes = per_client // 4
    # FedProx and SCAFFOLD copy the parameters only (not BN's statistics): just under the models
    assert copies * model_bytes * 0.9 <= per_client_held <= copies * model_bytes, (per_client_held, model_bytes)
