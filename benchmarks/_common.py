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


def measure(fn: Callable[[], Any]) -> dict[str, Any]:
    """Run ``fn`` once: wall seconds, this process's CPU seconds, and what it returned."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    out = fn()
    return {"wall": time.perf_counter() - wall0, "cpu": time.process_time() - cpu0, "out": out}


def interleaved(variants: dict[str, Callable[[], int]], repeats: int, warmup: bool = True) -> dict[str, list[dict[str, float]]]:
    """Time every variant once per repeat, in turn, so that a change in the machine's load hits
    all of them alike. Each variant returns the samples it trained; each record holds ``wall``,
    ``cpu`` (seconds) and ``rate`` (samples per wall second)."""
    if warmup:
        for fn in variants.values():
            fn()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            m = measure(fn)
            runs[name].append({"wall": m["wall"], "cpu": m["cpu"], "samples": m["out"], "rate": m["out"] / m["wall"]})
    return runs


def paired_ratio(runs: dict[str, list[dict[str, float]]], a: str, b: str, key: str = "rate") -> float:
    """The median over repeats of ``a``'s ``key`` divided by ``b``'s in the same repeat (a ratio of
    medians would pair a fast repeat of one with a slow repeat of the other)."""
    return median([x[key] / y[key] for x, y in zip(runs[a], runs[b])])


def rate_and_cpu(runs: list[dict[str, float]]) -> tuple[float, float]:
    """Median samples per wall second and median samples per CPU second."""
    return median([r["rate"] for r in runs]), median([r["samples"] / r["cpu"] for r in runs if r["cpu"] > 0] or [float("nan")])


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
        "load_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def machine_label() -> str:
    """``2 cores, 1 thread, torch 2.13.0`` for a table row."""
    m = machine()
    return f"{m['cpu_count']} cores, {m['threads']} thread{'s' if m['threads'] != 1 else ''}, torch {m['torch']}"


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
