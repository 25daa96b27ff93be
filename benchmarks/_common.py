"""Shared helpers for the benchmark scripts: timing, medians, JSON results, data location."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

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


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }


def write_result(path: str | Path, result: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"result written to {path}")


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
