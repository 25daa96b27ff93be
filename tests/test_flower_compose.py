"""fednorm's methods inside a Flower app of one's own (fednorm.flower.MethodStrategy, MethodClient,
keep_local_mod), with the example app of examples/flower_own_app.

Each test runs the example's ServerApp logic (``own_app.server_app.run``: Flower's strategy loop)
against the example's ClientApp (or a plain Flower handler with ``keep_local_mod``) and checks the
outcome against a computation that does not use the pieces under test:

1. in-process (the ClientApp called directly, float64):
   - FedBN and SiloBN: the global model equals a plain-torch loop of the algorithm (shared tensors
     averaged 1/K, each client's BatchNorm tensors, resp. statistics, kept by that client), and
     no train reply ever holds a tensor the method keeps local;
   - HBN (layer-wise statistics exchanges): the statistics the server deploys after round T+1,
     and those it sends in round 1, are the exact statistics of every HBN layer's input over the
     union of the clients' data (Bessel-corrected over samples, Eq. 8), measured by running that
     model in evaluation mode;
   - FBN, one step per round: the shared running statistics are centralized BatchNorm's on the
     union batch, and the weights the sample-weighted mean of independently trained clients;
2. Flower's simulation runtime (``flwr run`` against a simulation SuperLink, Ray, 2 virtual
   SuperNodes; flwr 1.41 deprecates ``flwr.simulation.run_simulation``): the example app's FedBN
   run equals the plain-torch loop.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest
import torch
from torch import nn

flwr = pytest.importorskip("flwr", reason="the Flower extra (flwr) is not installed")
pytest.importorskip("sklearn", reason="the example's data come from scikit-learn")

from flwr.app import ArrayRecord, Context, Error, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402

from fednorm.errors import ConfigError  # noqa: E402
from fednorm.flower import MethodClient, MethodStrategy, keep_local_mod  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flower_own_app"
sys.path.insert(0, str(EXAMPLE))  # the example's package, `own_app` (Ray's workers inherit sys.path)

from own_app import client_app, server_app, task  # noqa: E402

NODES = 3


@pytest.fixture
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


class InProcessGrid(Grid):
    """A grid whose nodes are ClientApp calls in this process, each with its own Context; it keeps
    every message it carried."""

    def __init__(self, app: ClientApp, num_nodes: int) -> None:
        from flwr.supercore.task_identity import TaskIdentity  # Messages need one outside a Flower runtime

        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
        self.app = app
        self.outbox: dict[str, Message] = {}
        self.sent: list[Message] = []
        self.replies: list[Message] = []
        self.contexts = {
            1000 + 7 * i: Context(run_id=1, node_id=1000 + 7 * i, node_config={"partition-id": i, "num-partitions": num_nodes},
                                  state=RecordDict(), run_config={})
            for i in range(num_nodes)
        }

    def set_run(self, run) -> None:  # noqa: D102
        pass

    @property
    def run(self):  # noqa: D102
        return None

    def create_message(self, *args, **kwargs):  # noqa: D102
        raise NotImplementedError

    def get_node_ids(self):  # noqa: D102
        return list(self.contexts)

    def get_nodes(self):  # noqa: D102
        return list(self.contexts)

    def push_messages(self, messages):  # noqa: D102
        ids = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = str(uuid.uuid4())  # as flwr's InMemoryGrid does
            self.sent.append(m)
            self.before(m)
            try:
                reply = self.app(m, self.contexts[m.metadata.dst_node_id])
            except Exception as exc:  # as Flower's runtime: an error reply (CLIENT_APP_RAISED_EXCEPTION)
                reply = Message(Error(code=2, reason=f"{type(exc)}:<'{exc}'>"), reply_to=m)
            self.replies.append(reply)
            self.outbox[m.metadata.message_id] = reply
            ids.append(m.metadata.message_id)
        return ids

    def before(self, message: Message) -> None:
        """Called before a message reaches its node (tests override it)."""

    def pull_messages(self, message_ids):  # noqa: D102
        return [self.outbox.pop(i) for i in list(message_ids) if i in self.outbox]

    def send_and_receive(self, messages, *, timeout=None):  # noqa: D102
        return self.pull_messages(self.push_messages(messages))

    def partition(self, node: int) -> int:
        return int(self.contexts[node].node_config["partition-id"])


RUN = {"num-rounds": 3, "lr": 0.2, "local-epochs": 2, "batch-size": 64, "num-nodes": NODES, "seed": 5}


def _bn_keys(model: nn.Module, names: tuple[str, ...]) -> set[str]:
    """State keys ``names`` of the model's BatchNorm2d layers (written out here, not fednorm's selection)."""
    return {f"{n}.{k}" for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d) for k in names}


def _reference(run: dict, local: set[str], num_nodes: int) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """The algorithm in plain torch: every client starts from the shared tensors and its own
    ``local`` ones, trains with the example's loop, keeps its ``local`` tensors; the server
    averages the rest uniformly (FedBN's and SiloBN's 1/K). Returns (shared, each client's local)."""
    torch.manual_seed(run["seed"])
    init = {k: v.clone() for k, v in task.Net().state_dict().items()}
    shared = {k: v for k, v in init.items() if k not in local}
    own = [{k: init[k].clone() for k in local} for _ in range(num_nodes)]
    for rnd in range(1, run["num-rounds"] + 1):
        results = []
        for p in range(num_nodes):
            model = task.Net()
            model.load_state_dict({**shared, **own[p]})
            (x, y), _ = task.load_data(p, num_nodes)
            task.train(model, x, y, epochs=run["local-epochs"], lr=run["lr"], batch_size=run["batch-size"], seed=1000 * rnd + p)
            state = model.state_dict()
            own[p] = {k: state[k].clone() for k in local}
            results.append({k: state[k].clone() for k in shared})
        shared = {k: (torch.stack([r[k] for r in results]).sum(0) / num_nodes).to(v.dtype) if v.is_floating_point()
                  else torch.stack([r[k] for r in results]).max(0).values for k, v in shared.items()}
    return shared, own


def _train_replies(grid: InProcessGrid) -> list[Message]:
    return [r for r in grid.replies if r.metadata.message_type == "train"]


def _close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    for k in want:
        torch.testing.assert_close(got[k].to(want[k].dtype), want[k], rtol=1e-10, atol=1e-12, msg=lambda m: f"{what} {k}: {m}")


# -- 1. in-process --------------------------------------------------------------------------------

def test_fedbn_in_your_own_app_is_the_algorithm_and_batchnorm_never_reaches_the_server(float64):
    grid = InProcessGrid(client_app.app, NODES)
    result = server_app.run(grid, {**RUN, "method": "fedbn"})
    bn = _bn_keys(task.Net(), ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"))
    shared, own = _reference(RUN, bn, NODES)

    replies = _train_replies(grid)
    assert len(replies) == NODES * RUN["num-rounds"] and not any(r.has_error() for r in replies)
    for reply in replies:
        sent = set(reply.content["arrays"].keys())
        assert not sent & bn and sent == set(shared)  # the shared tensors, and nothing of BatchNorm
    final = result.arrays.to_torch_state_dict()
    _close(final, shared, "global")
    for node, context in grid.contexts.items():  # each node's own BatchNorm, from context.state
        kept = {k: torch.from_numpy(a.numpy()) for k, a in context.state["fednorm.local"].items()}
        assert set(kept) == bn
        _close(kept, own[grid.partition(node)], f"node {node}'s")
    assert result.evaluate_metrics_clientapp[RUN["num-rounds"]]["eval-accuracy"] > 0.8  # it learns


def _plain_client(method: str) -> ClientApp:
    """A Flower user's unchanged handler (the quickstart's): the state dict in, the state dict out;
    ``keep_local_mod`` makes it the method's client."""
    app = ClientApp(mods=[keep_local_mod(method, task.Net())])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        config = msg.content["config"]
        model = task.Net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        (x, y), _ = task.load_data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))
        seed = 1000 * int(config["server-round"]) + int(context.node_config["partition-id"])
        task.train(model, x, y, epochs=int(config["local-epochs"]), lr=float(config["lr"]),
                   batch_size=int(config["batch-size"]), seed=seed)
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord({"num-examples": len(y)})})
        return Message(content, reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        model = task.Net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        _, (x, y) = task.load_data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))
        _, accuracy = task.test(model, x, y)
        return Message(RecordDict({"metrics": MetricRecord({"accuracy": accuracy, "num-examples": len(y)})}), reply_to=msg)

    return app


def test_silobn_with_keep_local_mod_around_an_unchanged_handler(float64):
    grid = InProcessGrid(_plain_client("silobn"), NODES)
    result = server_app.run(grid, {**RUN, "method": "silobn"})
    stats = _bn_keys(task.Net(), ("running_mean", "running_var", "num_batches_tracked"))
    shared, own = _reference(RUN, stats, NODES)

    for reply in _train_replies(grid):
        assert not reply.has_error() and set(reply.content["arrays"].keys()) == set(shared)  # BN affine goes up, statistics not
    _close(result.arrays.to_torch_state_dict(), shared, "global")
    for node, context in grid.contexts.items():
        kept = {k: torch.from_numpy(a.numpy()) for k, a in context.state["fednorm.local"].items()}
        _close(kept, own[grid.partition(node)], f"node {node}'s")


def test_keep_local_mod_refuses_methods_that_run_client_code():
    with pytest.raises(ConfigError, match="MethodClient"):
        keep_local_mod("hbn", task.make_model("hbn"))


def _hbn_inputs(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every HBN layer's input when ``model`` runs on ``x`` in evaluation mode."""
    from fednorm.nn import HybridBatchNorm

    seen: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_pre_hook(lambda _m, args, name=name: seen.__setitem__(name, args[0].detach()))
             for name, m in model.named_modules() if isinstance(m, HybridBatchNorm)]
    model.eval()
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return seen


def _assert_union_statistics(state: dict[str, torch.Tensor], x: torch.Tensor, what: str) -> None:
    """``state``'s HBN statistics are the exact statistics of each layer's input over ``x``, the
    model running with those same statistics: mean over samples and positions, variance
    Bessel-corrected over the N samples (HBN Eq. 8)."""
    model = task.make_model("hbn")
    model.load_state_dict(state)
    inputs = _hbn_inputs(model, x)
    assert len(inputs) == 2
    n = len(x)
    for name, z in inputs.items():
        mean = z.mean(dim=(0, 2, 3))
        var = z.var(dim=(0, 2, 3), unbiased=False) * n / (n - 1)
        torch.testing.assert_close(state[f"{name}.running_mean"], mean, rtol=1e-10, atol=1e-12, msg=lambda m: f"{what} {name}: {m}")
        torch.testing.assert_close(state[f"{name}.running_var"], var, rtol=1e-10, atol=1e-12, msg=lambda m: f"{what} {name}: {m}")


def test_hbn_statistics_are_the_exact_statistics_of_the_clients_union(float64):
    grid = InProcessGrid(client_app.app, NODES)
    run = {**RUN, "num-rounds": 2, "method": "hbn", "method-args": json.dumps({"sync_pass": "layerwise"})}
    result = server_app.run(grid, run)
    union = torch.cat([task.load_data(p, NODES)[0][0] for p in range(NODES)])

    # round T+1 (layer-wise): what the server deploys
    _assert_union_statistics(result.arrays.to_torch_state_dict(), union, "deployed")
    # the initial pass: what round 1 trains with
    first = next(m for m in grid.sent if m.metadata.message_type == "train")
    sent = first.content["arrays"].to_torch_state_dict()
    torch.manual_seed(run["seed"])
    initial = task.make_model("hbn").state_dict()
    assert all(torch.equal(sent[k], initial[k]) for k in sent if "running" not in k)  # the initial weights
    _assert_union_statistics({**initial, **{k: v for k, v in sent.items() if "running" in k}}, union, "round 1's")

    alpha = {k for k in initial if k.endswith(".alpha")}
    for reply in _train_replies(grid):
        keys = set(reply.content["arrays"].keys())
        assert not keys & alpha and not any("running" in k for k in keys)  # alpha stays, statistics are the server's
        assert {k for k in keys if k.startswith("upload/")} == {f"upload/hbn.{n}.{s}" for n in ("bn1", "bn2")
                                                                for s in ("count", "mean", "var")}
    assert all(context.state["fednorm.local"].keys() == alpha for context in grid.contexts.values())


def test_fbn_shared_statistics_are_centralized_batchnorm_on_the_union_batch(float64):
    from fednorm.nn import FederatedBatchNorm, recording_fbn_statistics

    grid = InProcessGrid(client_app.app, NODES)
    run = {**RUN, "num-rounds": 1, "local-epochs": 1, "batch-size": 10_000, "method": "fbn",  # one full-batch step
           "method-args": json.dumps({"initial_pass": False})}
    result = server_app.run(grid, run)
    final = result.arrays.to_torch_state_dict()

    torch.manual_seed(run["seed"])
    model = task.make_model("fbn")
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    data = [task.load_data(p, NODES)[0] for p in range(NODES)]
    # centralized BatchNorm on the union batch: torch's BatchNorm2d, given each FBN layer's input
    # (the model normalising with the round-start statistics, as every client's step does)
    inputs: dict[str, torch.Tensor] = {}
    layers = {n: m for n, m in model.named_modules() if isinstance(m, FederatedBatchNorm)}
    hooks = [m.register_forward_pre_hook(lambda _m, args, n=n: inputs.__setitem__(n, args[0])) for n, m in layers.items()]
    model.eval()
    with torch.no_grad():
        model(torch.cat([x for x, _ in data]))
    for h in hooks:
        h.remove()
    central = {}
    for n, layer in layers.items():
        bn = nn.BatchNorm2d(layer.num_features, momentum=layer.momentum)
        bn.running_mean.copy_(initial[f"{n}.running_mean"])
        bn.running_var.copy_(initial[f"{n}.running_var"])
        bn.train()(inputs[n])
        central.update({f"{n}.running_mean": bn.running_mean, f"{n}.running_var": bn.running_var})
    stats = set(central)
    _close(final, central, "shared statistics")
    assert not any(torch.equal(final[k], initial[k]) for k in stats)  # they did move

    # the weights: each client trained on its own from the initial model (its FBN layers
    # normalising with the shared statistics, which a recorder keeps fixed), averaged by sample count
    trained, counts = [], []
    for p, (x, y) in enumerate(data):
        model = task.make_model("fbn")
        model.load_state_dict(initial)
        with recording_fbn_statistics(model):
            task.train(model, x, y, epochs=1, lr=run["lr"], batch_size=run["batch-size"], seed=1000 + p)
        trained.append(model.state_dict())
        counts.append(len(y))
    w = torch.tensor(counts, dtype=torch.float64) / sum(counts)
    weights = {k: sum(wi * s[k] for wi, s in zip(w, trained)) for k, v in initial.items()
               if v.is_floating_point() and k not in stats}
    _close(final, weights, "weights")


def test_method_client_refuses_a_method_other_than_the_servers(float64):
    t = task
    app = ClientApp()
    client = MethodClient("silobn")

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        return client.begin(msg, context, t.Net(), num_examples=1).reply()

    grid = InProcessGrid(app, 2)
    strategy = MethodStrategy("fedbn", t.Net(), min_available_nodes=2, min_train_nodes=2, fraction_evaluate=0.0)
    result = strategy.start(grid, ArrayRecord(t.Net().state_dict()), num_rounds=1, timeout=10)
    replies = _train_replies(grid)
    assert len(replies) == 2 and all(r.has_error() for r in replies)
    assert all("server runs method 'fedbn' and this ClientApp 'silobn'" in r.error.reason for r in replies)
    assert not result.arrays  # nothing was aggregated


def test_a_node_that_lost_its_state_fails_once_then_starts_over_from_the_initial_values(float64):
    class Restart(InProcessGrid):
        def before(self, message: Message) -> None:  # the first node restarts before round 2's training
            node = min(self.contexts)
            if (message.metadata.message_type, message.metadata.dst_node_id) == ("train", node) \
                    and int(message.content["config"]["server-round"]) == 2:
                self.contexts[node] = Context(run_id=1, node_id=node, node_config=dict(self.contexts[node].node_config),
                                              state=RecordDict(), run_config={})

    grid = Restart(client_app.app, NODES)
    server_app.run(grid, {**RUN, "method": "fedbn"})
    replies = _train_replies(grid)
    failed = [r for r in replies if r.has_error()]
    assert len(failed) == 1 and failed[0].metadata.src_node_id == min(grid.contexts)
    assert "lost its context.state" in failed[0].error.reason
    last = [r for r in replies if r.metadata.reply_to_message_id in {m.metadata.message_id for m in grid.sent
            if m.metadata.message_type == "train" and int(m.content["config"]["server-round"]) == 3}]
    assert len(last) == NODES and not any(r.has_error() for r in last)  # back in round 3
    assert "fednorm.local" in grid.contexts[min(grid.contexts)].state


def test_a_reply_with_local_tensors_is_refused_with_the_fix(float64):
    app = ClientApp()  # a plain handler without keep_local_mod: it would send FedBN's BatchNorm up

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        model = task.Net()
        return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord({"num-examples": 5})}),
                       reply_to=msg)

    grid = InProcessGrid(app, 2)
    strategy = MethodStrategy("fedbn", task.Net(), min_available_nodes=2, min_train_nodes=2, fraction_evaluate=0.0)
    with pytest.raises(ValueError, match="keeps on the client.*keep_local_mod"):
        strategy.start(grid, ArrayRecord(task.Net().state_dict()), num_rounds=1, timeout=10)


# -- 2. Flower's simulation engine (Ray) -------------------------------------------------------------

def _toml(value) -> str:
    """A run-config value as ``flwr run --run-config`` reads it (TOML)."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


@pytest.mark.slow
def test_the_example_app_on_flowers_simulation_runtime_is_the_algorithm(tmp_path):
    """The example app as its README runs it, with what Flower 1.41 recommends in place of the
    deprecated ``flwr.simulation.run_simulation``: ``flwr run`` against a simulation SuperLink
    (Ray, 2 virtual SuperNodes); the ServerApp saves the final global model to ``out``."""
    pytest.importorskip("ray")
    from test_flower import Federation, needs_daemons

    if needs_daemons.args[0]:
        pytest.skip(needs_daemons.kwargs["reason"])
    out = tmp_path / "final.pt"
    run = {**RUN, "num-rounds": 2, "num-nodes": 2, "method": "fedbn"}
    fed = Federation(tmp_path, 2, simulation=True)
    try:
        fed.run_args += ["--run-config", " ".join(f"{k}={_toml(v)}" for k, v in {**run, "out": str(out)}.items())]
        fed.run_app(EXAMPLE, tmp_path / "no-summary", timeout=300.0)  # waits for the run's status: finished:completed
    finally:
        fed.close()
    bn = _bn_keys(task.Net(), ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"))
    shared, _ = _reference(run, bn, 2)
    final = torch.load(out)
    for k, v in shared.items():  # float32, and the ClientApps ran with other thread counts
        torch.testing.assert_close(final[k], v, rtol=1e-4, atol=1e-5, msg=lambda m: f"{k}: {m}")
    assert set(final) == set(task.Net().state_dict())


def test_nothing_of_the_example_app_uses_flowers_deprecated_run_simulation():
    """``flwr.simulation.run_simulation`` is deprecated in flwr 1.41 ("use `flwr run`"): the
    example's README, docs/deploy.md's section on it and this file's run show ``flwr run``."""
    import re

    readme = (EXAMPLE / "README.md").read_text()
    deploy = (EXAMPLE.parents[1] / "docs" / "deploy.md").read_text()
    own_app = deploy[deploy.index("## Use fednorm's methods in your own Flower app"):]
    assert "flwr run . sim" in readme and "flwr run examples/flower_own_app sim" in own_app
    for text in (readme, own_app, Path(__file__).read_text().split("# -- 2.")[1]):
        assert not re.search(r"flwr\.simulation import run_simulation|flwr\.simulation\.run_simulation\(", text)


def test_the_example_is_a_flower_app_whose_run_config_is_the_server_apps():
    import tomllib

    from flwr.common.config import validate_config

    config = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    valid, errors, warnings = validate_config(config, check_module=True, project_dir=EXAMPLE)
    assert valid and not errors and not warnings, errors + warnings
    assert config["tool"]["flwr"]["app"]["config"] == server_app.DEFAULTS  # `flwr run --run-config` may set every key
