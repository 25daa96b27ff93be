"""The method hooks later methods build on: statistics pass, uploads, loss hook, persistent client state."""

import torch

from fednorm.config import ExperimentConfig
from fednorm.engine.simulator import Simulation
from fednorm.methods import ClientContext, FedAvg, register_method
from fednorm.nn.functional import channel_stats, pooled_stats


@register_method("_test_stats_pass", force=True)
class StatsPass(FedAvg):
    """Uploads per-client (count, mean, var) of the features under the downloaded weights."""

    name = "_test_stats_pass"

    def __init__(self):
        super().__init__()
        self.received = []
        self.weights_seen = []

    def client_begin(self, ctx: ClientContext) -> None:
        with torch.no_grad():
            ctx.model.eval()
            feats = ctx.model.forward_features(ctx.x)
        n, mu, var = channel_stats(feats)
        ctx.uploads.update({"count": n, "mean": mu, "var": var})
        ctx.local_state["_test.visits"] = ctx.local_state.get("_test.visits", torch.tensor(0)) + 1
        self.weights_seen.append(ctx.model.head.weight.detach().clone())

    def aggregate(self, server_round, global_state, updates):
        self.received.append({k: v.clone() for k, v in updates.extras.items()})
        return super().aggregate(server_round, global_state, updates)


@register_method("_test_frozen", force=True)
class Frozen(FedAvg):
    """A loss hook that cancels the data loss: training must not move the weights."""

    name = "_test_frozen"

    def client_loss(self, ctx, model, loss):
        return loss * 0.0


def _cfg(method, **kw):
    base = dict(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=5, clients_per_round=3, rounds=2,
                batch_size=32, model="mlp", norm="none", method=method, dtype="float64")
    base.update(kw)
    return ExperimentConfig(**base)


def test_statistics_pass_uploads_are_stacked_and_pool_to_exact_union_stats():
    sim = Simulation(_cfg("_test_stats_pass"))
    global_before = {k: v.clone() for k, v in sim.global_state.items()}
    record = sim.step()
    got = sim.method.received[0]
    assert got["mean"].shape == (3, sim.model.num_features)
    # every client ran its statistics pass on the downloaded global weights
    for w in sim.method.weights_seen:
        assert torch.equal(w, global_before["head.weight"])
    # pooled (count, mean, var) == the statistics of the union of the round's clients' features
    sim.model.load_state_dict(global_before)
    sim.model.eval()
    idx = torch.cat([sim.data.client_train[c] for c in record.client_ids])
    with torch.no_grad():
        feats = sim.model.forward_features(sim.data.train_x[idx])
    _, mu, var = pooled_stats(got["count"], got["mean"], got["var"], unbiased=True)
    torch.testing.assert_close(mu, feats.mean(0), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(var, feats.var(0, unbiased=True), rtol=1e-12, atol=1e-12)
    # extra uploads are counted in the uplink
    shared = sum(v.numel() * v.element_size() for v in sim.global_state.values())
    extra = sum(v[0].numel() * v.element_size() for v in got.values())
    assert sim.uplink_bytes == 3 * (shared + extra)


def test_method_state_persists_in_the_bank_across_rounds():
    sim = Simulation(_cfg("_test_stats_pass", clients_per_round=5, rounds=3))
    for _ in range(3):
        sim.step()
    assert all(int(sim.bank.get(c)["_test.visits"]) == 3 for c in range(5))


def test_loss_hook_replaces_the_data_loss():
    sim = Simulation(_cfg("_test_frozen"))
    before = {k: v.clone() for k, v in sim.global_state.items()}
    sim.step()
    for k, v in before.items():  # equal up to the rounding of averaging identical copies
        torch.testing.assert_close(sim.global_state[k], v, rtol=1e-14, atol=1e-15)
