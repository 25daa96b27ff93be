"""A user's model and data that cannot train give one line before round 1 (issue 47.3), not a
traceback from inside the stacked model or PyTorch's BatchNorm in the middle of a run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fednorm import api
from fednorm.data.federated import FederatedData
from fednorm.errors import ConfigError


def _data(sizes=(20, 20, 20)):
    g = torch.Generator().manual_seed(0)
    clients = [(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)) for n in sizes]
    return FederatedData.from_tensors(clients, test=(torch.randn(9, 6, generator=g), torch.arange(9) % 3))


class TupleNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc(x), x  # logits and features, as many research models return


class DictNet(TupleNet):
    def forward(self, x):
        return {"logits": self.fc(x)}


class BN1dHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU())
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.body(x))


@pytest.mark.parametrize("net, shown", [(TupleNet, "tuple"), (DictNet, "dict")])
def test_a_forward_that_returns_a_tuple_or_dict_is_one_line(tmp_path, net, shown):
    with pytest.raises(ConfigError) as err:
        api.run(model=net(), data=_data(), rounds=1, out=str(tmp_path / "r"), progress=False, threads=1)
    assert "\n" not in str(err.value) and shown in str(err.value) and "logits" in str(err.value)
    assert not (tmp_path / "r" / "metrics.jsonl").exists()  # nothing trained, nothing half-written


def test_a_one_sample_client_under_a_batchnorm1d_head_is_one_line_before_round_1(tmp_path):
    with pytest.raises(ConfigError, match=r"client 1 holds one training sample.*at least two samples") as err:
        api.run(model=BN1dHead(), data=_data((20, 1, 20)), method="fedbn", rounds=1, out=str(tmp_path / "r"),
                progress=False, threads=1)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


class Untracked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4, track_running_stats=False), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.body(x))


@pytest.mark.parametrize("method", ["hbn", "fbn"])
def test_track_running_stats_false_under_hbn_or_fbn_is_said(method):
    """Before: the converted layers silently kept global statistics the user had switched off."""
    g = torch.Generator().manual_seed(0)
    clients = [(torch.randn(8, 1, 6, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(2)]
    data = FederatedData.from_tensors(clients, test=(torch.randn(6, 1, 6, 6, generator=g), torch.arange(6) % 3))
    with pytest.warns(UserWarning, match="track_running_stats=False.*the converted layers track them"):
        api.run(model=Untracked(), data=data, method=method, rounds=1, write=False, progress=False, threads=1)


def test_run_seeds_takes_the_configs_fednorm_run_takes(tmp_path):
    """Before: run_seeds(None, ...) raised TypeError: 'NoneType' object is not iterable."""
    from fednorm.seeds import run_seeds

    result = run_seeds(None, [0, 1], tmp_path / "s", plot=False, progress=False, rounds=1, model="mlp", partition="iid",
                       threads=1)
    assert sorted(result.summaries) == [0, 1] and all(s["status"] == "completed" for s in result.summaries.values())


def test_a_plugin_module_beside_the_user_loads_by_name_and_fednorm_seeds_is_an_attribute(tmp_path, monkeypatch):
    """Before: `--plugin my_methods` (and FEDNORM_PLUGINS=my_methods) said "No module named 'my_methods'"
    from the console script, whose sys.path lacks the current directory; `fednorm.seeds` after
    `import fednorm` was an AttributeError."""
    import subprocess
    import sys

    (tmp_path / "my_probe_plugin.py").write_text(
        "from fednorm.methods import FedAvg, register_method\n\n"
        "@register_method('my_probe_method')\nclass Mine(FedAvg):\n    name = 'my_probe_method'\n")
    script = ("import sys, os; sys.path[:] = [p for p in sys.path if p not in ('', os.getcwd())]\n"
              "from fednorm.cli.main import main; raise SystemExit(main(['--plugin', 'my_probe_plugin', 'list', 'methods']))")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "my_probe_method" in done.stdout, done.stderr
    import fednorm

    assert callable(fednorm.seeds.run_seeds)
