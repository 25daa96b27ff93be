"""Why FedAvg+BN predicts one class in the HBN paper's CIFAR-10 setting (lr 0.01, momentum 0.9, B = 4).

Two checks, both printed and written to benchmarks/results/hbn_bn_collapse.json:

1. ``plain``: an independent plain PyTorch loop (no fednorm code: the paper code's Simple-CNN,
   normalisation constants, crop + flip and gradient clipping, written out here) trains CIFAR-10
   centrally at B = 4 with the paper's BN hyper-parameters and with one of them changed; test
   accuracy on the 1,000 lossless test images every 1,000 steps.
2. ``federated``: fednorm's FedAvg+BN with ``configs/hbn_cifar10_fedavg_bn.yaml`` for a few
   rounds at several seeds; the global model's accuracy in eval mode, in train mode (batch
   statistics of the test batch), after recomputing its BN statistics on 5,000 training images,
   and the fraction of its 128 FC ReLU units that are dead on the test images.

    python benchmarks/hbn_bn_collapse.py --data-dir ../shared/data [--only plain|federated]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks._common import data_dir  # noqa: E402
from benchmarks.harness import measure, write_result  # noqa: E402

PLAIN = [  # (label, overrides of dict(norm="bn", lr=0.01, momentum=0.9, batch=4, clip=10, augment=True))
    ("paper BN setting", {}),
    ("no clipping", {"clip": 0.0}),
    ("momentum 0", {"momentum": 0.0}),
    ("lr 0.001", {"lr": 0.001}),
    ("GN, lr 0.005 (paper's GN lr)", {"norm": "gn", "lr": 0.005}),
    ("B = 16, lr 0.04 (linear scaling)", {"batch": 16, "lr": 0.04}),
    ("no augmentation", {"augment": False}),
    ("seed 1", {"seed": 1}),
]


def _load(root: Path) -> tuple[torch.Tensor, ...]:
    mean = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
    std = torch.tensor([0.2023, 0.1994, 0.2010]).view(1, 3, 1, 1)  # the released code's constants

    def prep(a: np.ndarray) -> torch.Tensor:
        return (torch.from_numpy(a).permute(0, 3, 1, 2).float() / 255 - mean) / std

    parts = [np.load(root / f"cifar10_train_part{i}.npz") for i in (0, 1)]
    test = np.load(root / "cifar10_test_lossless1000.npz")
    x = prep(np.concatenate([p["x"] for p in parts]))
    y = torch.from_numpy(np.concatenate([p["y"] for p in parts]))
    return x, y, prep(test["x"]), torch.from_numpy(test["y"])


def _simple_cnn(norm: str) -> nn.Module:
    def n(c: int) -> nn.Module:
        return nn.BatchNorm2d(c) if norm == "bn" else nn.GroupNorm(2, c)

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 1, 1), n(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, 1, 1), n(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, 1, 1), n(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(1024, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def _crop_flip(b: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    b = F.pad(b, (4, 4, 4, 4))
    out = torch.empty(len(b), 3, 32, 32)
    for i in range(len(b)):
        dx, dy = torch.randint(0, 9, (2,), generator=g).tolist()
        c = b[i, :, dy : dy + 32, dx : dx + 32]
        out[i] = c.flip(-1) if torch.rand(1, generator=g) < 0.5 else c
    return out


def plain(data: tuple[torch.Tensor, ...], steps: int, norm: str = "bn", lr: float = 0.01, momentum: float = 0.9,
          batch: int = 4, clip: float = 10.0, augment: bool = True, seed: int = 0) -> list[float]:
    x, y, xt, yt = data
    torch.manual_seed(seed)
    model = _simple_cnn(norm)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    perm = torch.randperm(len(x), generator=g)
    acc = []
    for s in range(steps):
        start = (s * batch) % len(x)
        idx = perm[start : start + batch]
        xb = _crop_flip(x[idx], g) if augment else x[idx]
        model.train()
        loss = F.cross_entropy(model(xb), y[idx])
        opt.zero_grad()
        loss.backward()
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if (s + 1) % 1000 == 0:
            model.eval()
            with torch.no_grad():
                acc.append(100 * (model(xt).argmax(1) == yt).float().mean().item())
    return acc


def federated(root: str, rounds: int, seed: int) -> dict[str, float]:
    from fednorm import api

    r = api.run("configs/hbn_cifar10_fedavg_bn.yaml", data_dir=root, rounds=rounds, eval_every=rounds, seed=seed,
                write=False, progress=False, threads=1)
    sim, model = r.simulation, r.model
    xt, yt = sim.data.test_x, sim.data.test_y

    def accuracy(m: nn.Module, train: bool) -> float:
        m.train(train)
        with torch.no_grad():
            return 100 * sum((m(xt[i : i + 500]).argmax(1) == yt[i : i + 500]).sum().item() for i in range(0, len(xt), 500)) / len(xt)

    out = {"eval_mode": accuracy(model, False), "train_mode_batch_statistics": accuracy(copy.deepcopy(model), True)}
    fc_out = {}
    relu = [m for m in model.modules() if isinstance(m, nn.ReLU)][-1]  # after the 1024 -> 128 layer
    handle = relu.register_forward_hook(lambda _m, _i, o: fc_out.__setitem__("x", o.detach()))
    model.eval()
    with torch.no_grad():
        model(xt[:1000])
    handle.remove()
    out["dead_fc_units"] = float((fc_out["x"].amax(0) <= 0).float().mean())
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for b in bns:
        b.reset_running_stats()
        b.momentum = None  # cumulative average
    model.train()
    with torch.no_grad():
        for i in range(0, 5000, 500):
            model(sim.data.train_x[i : i + 500])
    out["recomputed_statistics"] = accuracy(model, False)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seeds", default="1,2,3,42")
    ap.add_argument("--only", choices=["plain", "federated"])
    ap.add_argument("--out", default="benchmarks/results/hbn_bn_collapse.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = data_dir(args.data_dir)
    result: dict = {"benchmark": "hbn_bn_collapse"}
    if args.only in (None, "plain"):
        data = _load(Path(root))
        result["plain"] = []
        for label, kw in PLAIN:
            timing, acc = measure(lambda: plain(data, args.steps, **kw))
            result["plain"].append({"variant": label, "overrides": kw, "test_accuracy_every_1000_steps": acc,
                                    "wall_seconds": timing["wall"], "cpu_seconds": timing["cpu"]})
            print(f"plain loop, {label}: {', '.join(f'{a:.1f}' for a in acc)} ({timing['wall']:.0f} s)", flush=True)
    if args.only in (None, "federated"):
        result["federated"] = []
        for seed in [int(s) for s in args.seeds.split(",")]:
            row = {"seed": seed, "rounds": args.rounds, **federated(root, args.rounds, seed)}
            result["federated"].append(row)
            print("FedAvg+BN " + ", ".join(f"{k} {v:.3g}" for k, v in row.items()), flush=True)
    write_result(args.out, result)


if __name__ == "__main__":
    main()
