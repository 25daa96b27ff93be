"""benchmarks/hbn_reference_loop.py: its Dirichlet partition and its stuck detector, on synthetic labels
(no CIFAR data needed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "hbn_reference_loop.py"
_spec = importlib.util.spec_from_file_location("hbn_reference_loop", PATH)
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

# class-sorted and shuffled blocks of uneven class sizes, like a real label vector
LABELS = np.random.default_rng(0).integers(0, 10, 3000)


def test_partition_covers_every_index_once() -> None:
    for phi in (0.6, 0.1):
        parts = ref.dirichlet_partition(LABELS, 100, phi, seed=42)
        assert len(parts) == 100
        allidx = np.concatenate(parts)
        assert len(allidx) == len(LABELS)
        assert np.array_equal(np.sort(allidx), np.arange(len(LABELS)))


def test_partition_keeps_dataset_order_within_each_class() -> None:
    parts = ref.dirichlet_partition(LABELS, 100, 0.6, seed=7)
    for c in range(10):
        pieces = [p[LABELS[p] == c] for p in parts]
        assert all(np.all(np.diff(q) > 0) for q in pieces)  # each client's share is a contiguous cut ...
        assert np.array_equal(np.concatenate(pieces), np.flatnonzero(LABELS == c))  # ... in client order


def test_partition_is_a_function_of_the_seed() -> None:
    a = ref.dirichlet_partition(LABELS, 100, 0.6, seed=42)
    np.random.seed(12345)  # whatever state the global stream was in before
    np.random.random(17)
    b = ref.dirichlet_partition(LABELS, 100, 0.6, seed=42)
    c = ref.dirichlet_partition(LABELS, 100, 0.6, seed=43)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    # the round sampling continues from the reseeded global stream, so it repeats too
    ref.dirichlet_partition(LABELS, 100, 0.6, seed=42)
    s1 = np.random.choice(100, 10, replace=False)
    ref.dirichlet_partition(LABELS, 100, 0.6, seed=42)
    assert np.array_equal(s1, np.random.choice(100, 10, replace=False))


def test_stuck_detector() -> None:
    constant = torch.full((10000,), 3)
    s = ref.prediction_stats(constant)
    assert s["stuck"] and s["top_class_share"] == 1.0 and s["n_pred_classes"] == 1
    varied = torch.arange(10000) % 10
    s = ref.prediction_stats(varied)
    assert not s["stuck"] and s["n_pred_classes"] == 10 and abs(s["top_class_share"] - 0.1) < 1e-12
    # 99% in one class is stuck by definition; 98% is not
    almost = torch.cat([torch.zeros(9900, dtype=torch.long), torch.arange(100) % 9 + 1])
    assert ref.prediction_stats(almost)["stuck"]
    less = torch.cat([torch.zeros(9800, dtype=torch.long), torch.arange(200) % 9 + 1])
    assert not ref.prediction_stats(less)["stuck"]


def test_crop_flip_gives_a_black_bordered_crop() -> None:
    torch.manual_seed(0)
    x = torch.randint(1, 256, (16, 3, 32, 32), dtype=torch.uint8)  # no zero pixels of its own
    out = ref.crop_flip(x)
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    for i in range(len(x)):
        crops = [padded[i, :, dy:dy + 32, dx:dx + 32] for dy in range(9) for dx in range(9)]
        assert any(torch.equal(out[i], c) or torch.equal(out[i], c.flip(2)) for c in crops)
