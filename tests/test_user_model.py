"""Issue 38.1: a user's own nn.Module (or a factory of one) trains under every method with its
norm layers converted as ``--norm`` converts fednorm's models, with the user's data, through
``fednorm.run``, ``fednorm.compare`` and ``run_seeds``; the user's module is never changed; a run
of it resumes from Python only, with the same architecture; layers a method cannot handle are
one-line errors."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import fednorm
from fednorm.cli.main import main
from fednorm.config import ExperimentConfig
from fednorm.errors import ConfigError
from fednorm.models import get_model
from fednorm.nn.fbn import FederatedBatchNorm
from fednorm.nn.hbn import HybridBatchNorm
from fednorm.seeds import run_seeds

FAST = dict(threads=1, batch_size=8, dtype="float64")


def shifted_clients(n: int = 24, clients: int = 4, seed: int = 0) -> fednorm.FederatedData:
    """Three classes told apart by which rows of an 8×8 image are bright; client k sees its
    images scaled by 1 + k/2 and offset by k (feature shift, FedBN's setting)."""
    g = torch.Generator().manual_seed(seed)

    def draw(m: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.arange(m) % 3
        x = 0.5 * torch.randn(m, 1, 8, 8, generator=g)
        for c in range(3):
            x[y == c, :, 3 * c:3 * c + 2, :] += 2.0
        return (1 + k / 2) * x + k, y

    parts = [draw(n, k) for k in range(clients)]
    tests = [draw(n // 2, k) for k in range(clients)]  # the global test set: every client's kind of image
    test = (torch.cat([t[0] for t in tests]), torch.cat([t[1] for t in tests]))
    return fednorm.FederatedData.from_tensors(clients=parts, test=test, name="rows")


class Net(nn.Module):
    """A user's CNN with its own forward (not a fednorm ClassifierModel)."""

    def __init__(self, eps: float = 1e-5) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.BatchNorm2d(6, eps=eps), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Linear(6 * 4 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


@pytest.fixture(scope="module")
def data() -> fednorm.FederatedData:
    return shifted_clients()


def run(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. FedBN's warning on a model without BatchNorm
        return fednorm.run(**{**FAST, "write": False, **kw})


def states_equal(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_fedbn_trains_a_users_cnn_on_users_tensors_and_leaves_the_module_alone(data):
    net = Net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    result = run(model=net, data=data, method="fedbn", rounds=6, lr=0.1)
    assert result.summary["status"] == "completed"
    assert result.summary["final_mean_client_accuracy"] >= 0.9  # chance is 1/3: it learned
    assert (result.config.model, result.config.dataset) == ("user:net", "user:rows")
    recorded = result.config.model_args
    assert recorded["class"].endswith("Net") and recorded["given"] == "instance"
    assert recorded["parameters"] == sum(p.numel() for p in net.parameters())
    # the user's module is untouched; the result's model is a trained copy with the same layers
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert result.model is not net and isinstance(result.model.features[1], nn.BatchNorm2d)
    assert not torch.equal(result.model.state_dict()["classifier.weight"], before["classifier.weight"])


@pytest.mark.parametrize("method,norm,executor", [
    ("fedbn", "bn", "sequential"), ("fedbn", "bn", "vectorized"), ("hbn", "hbn", "sequential"),
    ("hbn", "hbn", "vectorized"), ("fbn", "fbn", "vectorized"), ("fedtan", "bn", "vectorized"), ("fedavg", "gn", "sequential"),
])
def test_a_factory_of_a_registry_model_trains_exactly_as_that_registry_model(data, method, norm, executor):
    """The user path (factory called under the run's seeded init, BN converted for the method)
    against the registry path (the norm built in): the same final weights, bit for bit."""
    kw = dict(data=data, method=method, rounds=2, executor=executor)
    registry = run(model="simple_cnn", norm=norm, **kw)
    users = run(model=lambda: get_model("simple_cnn", num_classes=3, in_channels=1, input_size=(8, 8)),
                **({"norm": norm} if norm == "gn" else {}), **kw)  # hbn, fbn: the method's norm by itself
    assert users.config.norm == norm and users.config.model == "user:simplecnn"
    assert states_equal(registry.model, users.model)
    assert users.summary["final_test_accuracy"] == registry.summary["final_test_accuracy"]


def test_norm_layers_are_converted_for_the_method_keeping_eps(data):
    for method, kind in (("hbn", HybridBatchNorm), ("fbn", FederatedBatchNorm)):
        result = run(model=Net(eps=1e-3), data=data, method=method, rounds=1)
        layer = result.model.features[1]
        assert result.config.norm == method and isinstance(layer, kind) and layer.eps == 1e-3
    gn = run(model=Net(), data=data, norm="gn", rounds=1).model.features[1]
    assert isinstance(gn, nn.GroupNorm) and gn.num_groups == 2


def test_an_unstackable_module_falls_back_to_sequential_and_lockstep_methods_say_why(data):
    reflect = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, padding_mode="reflect"), nn.BatchNorm2d(4), nn.ReLU(),
                            nn.Flatten(), nn.Linear(256, 3))
    result = run(model=reflect, data=data, method="fedbn", rounds=1)
    assert "sequential because" in result.simulation.executor_note and "reflect" in result.simulation.executor_note
    with pytest.raises(ConfigError, match="lockstep") as err:
        run(model=reflect, data=data, method="fedtan", rounds=1)
    assert "\n" not in str(err.value)


class RunningNorm(nn.Module):
    """A norm with running statistics that is not a torch BatchNorm: methods cannot find it."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - self.running_mean[None, :, None, None]


def _conv(norm: nn.Module, channels: int = 4) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(1, channels, 3, padding=1), norm, nn.ReLU(), nn.Flatten(), nn.Linear(64 * channels, 3))


@pytest.mark.parametrize("kw,words", [
    (dict(model=_conv(RunningNorm(4)), method="fedbn"), ["layer '1'", "RunningNorm", "subclass nn.BatchNorm2d"]),
    (dict(model=_conv(nn.GroupNorm(2, 4)), method="hbn"), ["method 'hbn'", "has none", "add nn.BatchNorm2d"]),
    (dict(model=nn.Sequential(nn.Unflatten(1, (1, 1)), nn.Conv3d(1, 2, 1), nn.BatchNorm3d(2), nn.Flatten(), nn.Linear(128, 3)),
          method="hbn"), ["layer '2'", "BatchNorm3d", "keep norm 'bn'"]),
    (dict(model=_conv(nn.BatchNorm2d(3), channels=3), norm="gn"), ["layer '1'", "norm 'gn'", "num_groups"]),
    (dict(model=nn.Sequential(nn.LazyConv2d(4, 3), nn.Flatten(), nn.LazyLinear(3))), ["layer '0'", "LazyConv2d", "run one batch"]),
    (dict(model=nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(144, 3))), ["fails on a batch", "(2, 1, 8, 8)"]),
    (dict(model=_conv(nn.BatchNorm2d(4))[:-1]), ["returns (2, 256)", "3 classes", "(2, 3)"]),
    (dict(model=lambda: 3), ["factory", "returned a int", "class or a function"]),
    (dict(model=3), ["registry name, an nn.Module or a function"]),
    (dict(model=nn.DataParallel(Net())), ["model=net.module"]),
    (dict(model=Net(), model_args={"width": 2}), ["model_args (width)", "build your module"]),
])
def test_what_a_method_cannot_handle_is_one_line_naming_the_fix(data, kw, words):
    with pytest.raises(ConfigError) as err:
        run(data=data, rounds=1, **kw)
    message = str(err.value)
    assert "\n" not in message and len(message) < 400, message
    for w in words:
        assert w in message, message


def test_a_running_norm_that_fedavg_averages_with_everything_else_is_accepted(data):
    result = run(model=_conv(RunningNorm(4)), data=data, method="fedavg", rounds=1)
    assert result.summary["status"] == "completed"


def test_an_instance_starts_every_seed_from_its_weights_and_a_factory_draws_per_seed(data):
    net = Net()
    first = [run(model=net, data=data, rounds=1, seed=s, lr=1e-12).model for s in (0, 1)]  # lr ~ 0: the initial weights
    assert all(torch.allclose(m.classifier.weight.float(), net.classifier.weight) for m in first)
    drawn = [run(model=Net, data=data, rounds=1, seed=s, lr=1e-12).model for s in (0, 1)]
    assert not torch.allclose(drawn[0].classifier.weight, drawn[1].classifier.weight)
    again = run(model=Net, data=data, rounds=1, seed=1, lr=1e-12).model
    assert states_equal(again, drawn[1])  # seeded: the same seed draws the same weights
    before = torch.get_rng_state()
    fednorm.models.user.UserModel(Net)  # describing a factory draws on a forked stream
    assert torch.equal(before, torch.get_rng_state())


def test_a_run_of_a_users_model_resumes_from_python_to_the_same_numbers(tmp_path, data, capsys):
    straight = fednorm.run(model=Net, data=data, method="hbn", rounds=3, out=str(tmp_path / "a"), **FAST)
    fednorm.run(model=Net, data=data, method="hbn", rounds=2, out=str(tmp_path / "b"), **FAST)
    # the CLI cannot rebuild a module: one line, exit 2, saying how to resume from Python
    assert main(["run", "--resume", str(tmp_path / "b"), "--rounds", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "fednorm.run(resume=" in err and "model=..." in err and "data=..." in err
    with pytest.raises(ConfigError, match="not the architecture it trained"):
        fednorm.run(resume=tmp_path / "b", model=nn.Sequential(nn.Flatten(), nn.Linear(64, 3)), data=data, rounds=3)
    resumed = fednorm.run(resume=tmp_path / "b", model=Net(), data=data, rounds=3)  # any weights: the checkpoint's win
    assert states_equal(straight.model, resumed.model)
    assert [h["test_accuracy"] for h in straight.history] == [h["test_accuracy"] for h in resumed.history]
    registry = fednorm.run(data=data, rounds=1, out=str(tmp_path / "c"), **FAST)
    with pytest.raises(ConfigError, match="leave model out"):
        fednorm.run(resume=registry.out_dir, model=Net(), data=data, rounds=2)


def test_compare_trains_every_variant_on_the_users_model_and_data(tmp_path, data):
    variants = [{"method": "fedavg"}, {"method": "fedbn"}, {"method": "hbn"}]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = fednorm.compare(model=Net, data=data, variants=variants, rounds=2, out=tmp_path / "cmp", **FAST)
    assert list(table.results) == ["fedavg+bn", "fedbn+bn", "hbn+hbn"]
    for r in table.results.values():
        assert (r.config.model, r.config.dataset) == ("user:net", "user:rows")
    alone = run(model=Net, data=data, method="fedbn", rounds=2)
    assert states_equal(alone.model, table.results["fedbn+bn"].model)  # a variant is the run made alone
    with pytest.raises(ConfigError, match=r"model=\.\.\., data=\.\.\.") as err:
        fednorm.compare(resume=tmp_path / "cmp")
    assert "\n" not in str(err.value)
    again = fednorm.compare(resume=tmp_path / "cmp", model=Net, data=data)
    assert [r.summary["final_test_accuracy"] for r in again.results.values()] == \
           [r.summary["final_test_accuracy"] for r in table.results.values()]
    with pytest.raises(ConfigError, match="every variant trains the model given"):
        fednorm.compare(model=Net, data=data, variants=[{"model": "simple_cnn"}], rounds=1)
    with pytest.raises(ConfigError, match="cannot change num_clients"):
        fednorm.compare(model=Net, data=data, variants=[{"num_clients": 2}], rounds=1)
    with pytest.raises(ConfigError, match=r"fednorm.compare\(model=net\)"):
        fednorm.compare(data=data, variants=[{"model": Net()}], rounds=1)
    # the default variants include FN, which needs a fednorm classifier (forward_features, head):
    # refused before any variant trains, naming the variant
    with pytest.raises(ConfigError, match=r"variant fedavg\+fn: model 'user:net' with norm 'fn'.*forward_features") as err:
        fednorm.compare(model=Net, data=data, rounds=1, out=tmp_path / "default")
    assert "\n" not in str(err.value) and not (tmp_path / "default" / "fedavg_bn").exists()


def test_run_seeds_stacks_a_users_model_and_data_and_equals_each_seed_alone(tmp_path, data):
    cfg = ExperimentConfig(method="fedbn", rounds=2, **FAST)
    res = run_seeds(cfg, [0, 1], tmp_path / "seeds", model=Net, data=data, progress=False, plot=False)
    assert res.stacking["joint_rounds"] == 2 and not res.stacking["blockers"]
    for seed in (0, 1):
        alone = run(model=Net, data=data, method="fedbn", rounds=2, seed=seed)
        assert res.summaries[seed]["final_test_loss"] == pytest.approx(alone.summary["final_test_loss"], rel=1e-9)
        assert res.summaries[seed]["final_test_accuracy"] == alone.summary["final_test_accuracy"]
    assert res.summaries[0]["final_test_loss"] != res.summaries[1]["final_test_loss"]  # a factory: seeds differ


def test_a_module_inside_a_config_mapping_counts_as_model(data):
    result = run(config={"model": Net(), "method": "fedbn", "rounds": 1}, data=data)
    assert result.config.model == "user:net"
