"""``fednorm evaluate``: a run's model on another test set, with a Wilson interval."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fednorm import api
from fednorm.cli.main import main
from fednorm.data.datasets import load_dataset
from fednorm.evaluation import evaluate_run_on, wilson_interval


def _wilson_by_bisection(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The interval as its definition: every p0 whose score test does not reject, found numerically."""
    p_hat = k / n

    def inside(p0: float) -> bool:
        return abs(p_hat - p0) <= z * math.sqrt(p0 * (1 - p0) / n)

    def edge(lo: float, hi: float, want_inside_at_hi: bool) -> float:
        for _ in range(200):
            mid = (lo + hi) / 2
            if inside(mid) == want_inside_at_hi:
                hi = mid
            else:
                lo = mid
        return (lo + hi) / 2

    return edge(1e-12, p_hat, True), edge(p_hat, 1 - 1e-12, False)


@pytest.mark.parametrize("k, n", [(466, 1000), (777, 1000), (3, 50), (995, 1000)])
def test_the_wilson_interval_is_the_set_the_score_test_keeps(k, n):
    low, high = wilson_interval(k, n)
    ref = _wilson_by_bisection(k, n)
    assert low == pytest.approx(ref[0], abs=1e-9) and high == pytest.approx(ref[1], abs=1e-9)


def test_a_run_scored_on_a_file_of_its_own_test_images_gives_its_own_accuracy(tmp_path, capsys):
    run = tmp_path / "run"
    result = api.run(dataset="digits", num_clients=3, model="mlp", rounds=2, batch_size=64, seed=1, out=str(run), progress=False)
    test = load_dataset("digits", train=False)
    np.savez(tmp_path / "same.npz", x=test.data, y=np.asarray(test.targets))
    entry = evaluate_run_on(run, tmp_path / "same.npz")
    assert entry["accuracy"] == pytest.approx(result.summary["final_test_accuracy"], abs=1e-12)
    assert entry["own_test_accuracy"] == pytest.approx(entry["accuracy"], abs=1e-12)
    assert entry["n"] == len(test.targets) and entry["interval95"][0] < entry["accuracy"] < entry["interval95"][1]
    assert json.loads((run / "evaluation.json").read_text())["same.npz"]["round"] == 2
    half = test.data[: len(test.data) // 2]
    np.savez(tmp_path / "half.npz", x=half, y=np.asarray(test.targets)[: len(half)])
    assert main(["evaluate", str(run), "--test-file", str(tmp_path / "half.npz")]) == 0
    out = capsys.readouterr().out
    assert "half.npz" in out and f"({len(half)}" not in out and f"/{len(half)}; 95% interval" in out
    assert set(json.loads((run / "evaluation.json").read_text())) == {"same.npz", "half.npz"}


def test_images_of_another_size_are_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    api.run(dataset="digits", num_clients=3, model="mlp", rounds=1, seed=1, out=str(run), progress=False)
    np.savez(tmp_path / "big.npz", x=np.zeros((4, 32, 32, 3), np.uint8), y=np.zeros(4, np.int64))
    assert main(["evaluate", str(run), "--test-file", str(tmp_path / "big.npz")]) == 2
    assert "holds 32×32×3 images; the run trained on 8×8×1" in capsys.readouterr().err


def test_a_truncated_test_file_is_one_line(tmp_path, capsys):
    # A copy cut short (an interrupted transfer) is a zip whose members are missing: BadZipFile, not OSError.
    run = tmp_path / "run"
    api.run(dataset="digits", num_clients=3, model="mlp", rounds=1, seed=1, out=str(run), progress=False)
    whole = tmp_path / "whole.npz"
    np.savez(whole, x=np.zeros((4, 8, 8, 1), np.uint8), y=np.zeros(4, np.int64))
    (tmp_path / "cut.npz").write_bytes(whole.read_bytes()[:200])
    assert main(["evaluate", str(run), "--test-file", str(tmp_path / "cut.npz")]) == 2
    assert "cut.npz is not an .npz with arrays x" in capsys.readouterr().err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks a GPU run scored where there is no GPU")
def test_a_run_made_on_a_gpu_is_scored_on_the_cpu(tmp_path):
    """The FedTAN and LN runs trained on a lent GPU; scoring them here failed inside torch's CUDA
    init. A run whose config says cuda is rebuilt on the CPU and scores what it recorded."""
    run = tmp_path / "run"
    result = api.run(dataset="digits", num_clients=3, model="mlp", rounds=2, batch_size=64, seed=1, out=str(run), progress=False)
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("device: cpu", "device: cuda"))
    assert "device: cuda" in config.read_text()
    test = load_dataset("digits", train=False)
    np.savez(tmp_path / "same.npz", x=test.data, y=np.asarray(test.targets))
    entry = evaluate_run_on(run, tmp_path / "same.npz")
    assert entry["own_test_accuracy"] == pytest.approx(result.summary["final_test_accuracy"], abs=1e-12)
