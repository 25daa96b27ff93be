"""What the benchmark scripts share besides timing (:mod:`benchmarks.harness`): where the data is,
and the plain PyTorch loop that fednorm is compared with."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def data_dir(cli_value: str | None) -> str:
    """The data folder: the option, $FEDNORM_DATA, or ../shared/data beside the repository."""
    if cli_value:
        return cli_value
    if os.environ.get("FEDNORM_DATA"):
        return os.environ["FEDNORM_DATA"]
    if SHARED_DATA.is_dir():
        return str(SHARED_DATA)
    raise SystemExit("no data folder: pass --data-dir or set FEDNORM_DATA")


def write_synthetic_cifar10(root: str | Path, seed: int = 0) -> str:
    """Random images and labels in CIFAR-10's npz layout (50,000 train, 10,000 test) under ``root``.

    For timing where the real files cannot travel (a lent GPU machine): a step's compute does not
    depend on pixel values, and uniform labels give a Dirichlet partition the same shape of skew.
    Accuracy on it means nothing."""
    import numpy as np

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    classes = np.array(["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"])
    for split, n in (("train", 50000), ("test", 10000)):
        np.savez(root / f"cifar10_{split}.npz", x=rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
                 y=rng.integers(0, 10, n).astype(np.int64), classes=classes)
    return str(root)


def train_centralized(model, x, y, batches, *, lr: float, generator: torch.Generator, augment: bool,
                      channels_last: bool = False) -> int:
    """Plain PyTorch: SGD (momentum 0.9) over ``batches`` (index tensors into ``x``), the same
    augmentation as fednorm; optionally channels-last batches. Returns the samples trained."""
    from fednorm.data.transforms import random_crop_flip

    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    seen = 0
    for idx in batches:
        xb = x.index_select(0, idx)
        if augment:
            xb = random_crop_flip(xb, padding=4, generator=generator)
        if channels_last:
            xb = xb.contiguous(memory_format=torch.channels_last)
        loss = F.cross_entropy(model(xb), y.index_select(0, idx))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        seen += len(idx)
    return seen
