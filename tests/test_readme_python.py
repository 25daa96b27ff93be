"""The README's "Use it from Python" example runs as written (so it can never rot): a user's CNN
with BatchNorm2d and four feature-shifted clients of the embedded digits, each with its own
shifted test split (issue 47), FedAvg and FedBN for ten rounds, in at most 16 lines after the
imports (seven of them the user's model), and FedBN well ahead, as its paper says."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

README = Path(__file__).resolve().parents[1] / "README.md"


def example() -> str:
    text = README.read_text()
    section = text.split("\n## Use it from Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "the README's 'Use it from Python' section has no python block"
    return blocks[0]


def test_the_example_is_at_most_ten_lines_after_its_imports():
    lines = [line for line in example().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    body = [line for line in lines if not line.startswith(("import ", "from "))]
    assert lines[: len(lines) - len(body)] == [line for line in lines if line.startswith(("import ", "from "))]  # imports first
    assert len(body) <= 16, "\n".join(body)


def test_the_example_runs_fedbn_on_the_users_cnn_and_tensors(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # it writes runs/fedavg and runs/fedbn
    scope: dict = {}
    exec(compile(example(), str(README), "exec"), scope)  # noqa: S102 - the README's own code
    results = scope["results"]
    result = results["fedbn"]
    assert result.summary["status"] == "completed" and result.summary["rounds"] == 10
    assert (result.config.method, result.config.model, result.config.dataset) == ("fedbn", "user:cnn", "user:tensors")
    assert result.config.num_clients == 4 and isinstance(scope["CNN"](), nn.Module)
    assert (tmp_path / "runs" / "fedbn" / "summary.json").is_file()
    bn = [m for m in result.model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(bn) == 1  # FedBN kept the BatchNorm ...
    assert torch.equal(bn[0].running_mean, torch.zeros(16)) and torch.equal(bn[0].weight.detach(), torch.ones(16))  # ... local:
    assert len(result.history[-1]["client_accuracies"]) == 4  # the global model's is the initial one, and each client is evaluated
    # each client is scored on its own shifted test split: the split's pixels carry the client's a * x + b
    data = scope["data"]
    for k, (a, b) in enumerate(scope["shifts"]):
        own = data.test_x[data.client_test[k]]
        assert torch.allclose(own.min(), torch.tensor(b)) and len(own) == len(scope["x"][k::4]) - 360
    fedavg, fedbn = (results[m].summary["final_mean_client_accuracy"] for m in ("fedavg", "fedbn"))
    assert fedbn > fedavg + 0.2  # FedBN's point, on honest per-client test data
    assert f"'fedavg': {round(fedavg, 2)}, 'fedbn': {round(fedbn, 2)}" in capsys.readouterr().out
