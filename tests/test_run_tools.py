"""The tools on a run of your own model and data (issue 47.4): ``fednorm.evaluate``, ``diagnose``
and ``analyze`` take the module and the data back from Python and give the run's own figures; the
commands, which cannot rebuild them from a config, name that Python call; ``result.client_model(k)``
is the model the run scored client k with (FedBN's local BatchNorm), where ``result.model`` is the
server's."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import fednorm
from fednorm.engine.evaluation import evaluate as evaluate_model
from fednorm.errors import ConfigError


def own_data(shift: float = 0.6) -> fednorm.FederatedData:
    """Three clients of a 3-class toy image task, client k's images (train and test) shifted by k."""
    g = torch.Generator().manual_seed(0)
    clients = []
    for k in range(3):
        x = torch.randn(48, 1, 8, 8, generator=g) * (1 + 0.5 * k) + shift * k
        y = torch.arange(48) % 3
        x[torch.arange(48), 0, y, y] += 3.0
        clients.append((x[:36], y[:36], x[36:], y[36:]))
    return fednorm.FederatedData.from_tensors(clients)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 8 * 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    root = tmp_path_factory.mktemp("own")
    out = {}
    for method in ("fedbn", "fedavg"):
        torch.manual_seed(0)
        net, data = Net(), own_data()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # batch_size above the clients' sizes
            result = fednorm.run(model=net, data=data, method=method, rounds=3, lr=0.05, out=str(root / method), progress=False)
        out[method] = (result, net, data, root / method)
    return out


@pytest.mark.parametrize("method", ["fedbn", "fedavg"])
def test_evaluate_from_python_equals_the_runs_last_evaluation(runs, method):
    result, net, data, run_dir = runs[method]
    scores = fednorm.evaluate(run_dir, model=net, data=data)
    last = result.history[-1]
    assert scores["round"] == 3
    assert scores["test_accuracy"] == last["test_accuracy"] == result.summary["final_test_accuracy"]
    assert scores["client_accuracies"] == last["client_accuracies"]
    assert scores["test_loss"] == pytest.approx(last["test_loss"], rel=1e-6)


@pytest.mark.parametrize("method", ["fedbn", "fedavg"])
def test_diagnose_from_python_reports_the_runs_accuracy(runs, method):
    result, net, data, run_dir = runs[method]
    report = fednorm.diagnose(run_dir, model=net, data=data, write=False)
    assert report["round"] == 3 and report["personalized"] == (method == "fedbn")
    assert report["accuracy"]["as_evaluated"] == result.summary["final_test_accuracy"]
    if method == "fedavg":  # a global model: its buffers and the exact statistics are scored too
        assert report["accuracy"]["global_buffers"] == result.summary["final_test_accuracy"]
        assert set(report["layers"]) == {"bn"}


def test_analyze_from_python_analyses_the_users_model_through_its_last_linear(runs):
    result, net, data, run_dir = runs["fedavg"]
    figures = fednorm.analyze(run_dir, model=net, data=data, plots=False)
    assert figures["round"] == 3 and figures["model"] == "user:net"
    assert figures["local"]["as_trained"]["before"]["accuracy"] == pytest.approx(result.summary["final_test_accuracy"])
    assert figures["local"]["as_trained"]["after"]["accuracy"] >= 0
    assert len(figures["global"]["norms"]["class_embedding_norm"]) == 3  # the rows of net.fc, its classifier
    assert (run_dir / "analysis.json").is_file()


def test_client_model_is_what_the_run_scored_each_client_with_under_fedbn(runs):
    result, _, data, _ = runs["fedbn"]
    accuracies = result.summary["final_client_accuracies"]
    for k in range(3):
        ix = data.client_test[k]
        own = evaluate_model(result.client_model(k), data.test_x[ix], data.test_y[ix]).accuracy
        assert own == pytest.approx(accuracies[k])
    a, b = result.client_model(0), result.client_model(1)
    assert not torch.equal(a.bn.running_mean, b.bn.running_mean)  # copies: the second call left the first alone
    # result.model is the server's model: FedBN's BatchNorm there was never trained
    assert torch.equal(result.model.bn.running_mean, torch.zeros(4))
    assert not torch.equal(a.bn.running_mean, torch.zeros(4))
    with pytest.raises(ConfigError, match=r"client_id must be an int in \[0, 3\), got 3"):
        result.client_model(3)


def test_the_tools_refuse_other_data_or_a_missing_model(runs):
    _, net, data, run_dir = runs["fedbn"]
    with pytest.raises(ConfigError, match="cannot evaluate .*: the data given is not the data it trained on"):
        fednorm.evaluate(run_dir, model=net, data=own_data(shift=0.7))
    with pytest.raises(ConfigError, match=r"its model 'user:net' came from Python.*fednorm\.diagnose\('.*', model=\.\.\., data=\.\.\.\)"):
        fednorm.diagnose(run_dir, data=data, write=False)
    with pytest.raises(ConfigError, match="cannot analyze .*: the model given .* is not the architecture"):
        fednorm.analyze(run_dir, model=nn.Sequential(nn.Flatten(), nn.Linear(64, 3)), data=data, plots=False)


@pytest.mark.parametrize("command", [["evaluate", "--test-file", "t.npz"], ["diagnose"], ["analyze"]])
def test_the_commands_name_the_python_route(runs, command, capsys):
    from fednorm.cli.main import main

    run_dir: Path = runs["fedavg"][3]
    code = main([command[0], str(run_dir), *command[1:]])
    err = capsys.readouterr().err
    assert code == 2
    assert f"fednorm.{command[0]}('{run_dir}', model=..., data=...)" in err, err
    assert "resume" not in err
