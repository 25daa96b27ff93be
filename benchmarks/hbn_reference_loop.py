"""Reference FedAvg+BN loop for HBN Table 1 (CIFAR-10, Simple-CNN, B = 4, phi = 0.6), in plain PyTorch.

The loop is written from the spec (shared/spec/000_hbn.md, sections 1.11, 1.12, 2 and 5). It imports
nothing from ``fednorm``, so it gives an independent baseline to compare fednorm's FedAvg+BN with.
In particular it measures how often a run ends up predicting a single class.

Setting: K = 100 clients with a per-class Dirichlet(phi) split in dataset order, 10 clients per round,
E = 1 local epoch, a new SGD each round (momentum 0.9, no weight decay), lr_t = 0.01 * 0.998**t,
gradient-norm clipping at 10, black-border RandomCrop(32, 4) and horizontal flip, then Normalize. The
server averages every state_dict entry (weights, BN running statistics, num_batches_tracked), weighted
by each client's sample count.

Choices where the spec leaves room:
* Rounds: t = 0 is the first training round, so it trains at lr 0.01 (spec 1.12: lr *= 0.998 after
  each round). Round numbers in the output count finished rounds: "round 40" means after t = 39.
* Sampling stream: np.random.seed(seed) and then np.random.dirichlet for the partition. The same global
  numpy stream then supplies np.random.choice(K, 10, replace=False) each round. torch.manual_seed(seed)
  is set before the model is built, and torch's global stream drives shuffling, crops and flips.
* Small clients: the 10 are sampled from all K clients, so the numpy stream matches the code's. A
  sampled client with N_k < B (zero batches under drop_last) does not train and is left out of the
  average. The count of such clients is recorded; at phi = 0.6 it is normally 0.

Definition: at an evaluated round, ``top_class_share`` is the share of the 10,000 test predictions that
fall in the most-predicted class. The run is ``stuck`` when top_class_share >= 0.99, i.e. the global
model predicts essentially one class.

    python benchmarks/hbn_reference_loop.py --seeds 42-73 --rounds 40 --out runs.jsonl [--phi 0.6]
        [--norm bn|gn] [--eval-rounds 20,40] [--data-dir ../shared/data]
    python benchmarks/hbn_reference_loop.py --summary runs.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
STD = torch.tensor([0.2023, 0.1994, 0.2010]).view(1, 3, 1, 1)
STUCK_SHARE = 0.99


def dirichlet_partition(labels: np.ndarray, n_clients: int, phi: float, seed: int) -> list[np.ndarray]:
    """Client index arrays from a per-class Dirichlet(phi) cut of each class's indices, in dataset order.

    Reseeds numpy's global stream (np.random.seed), as the spec describes. The round sampling then
    continues from that stream, so the result depends only on (labels, n_clients, phi, seed)."""
    np.random.seed(seed)
    n_classes = int(labels.max()) + 1
    label_distribution = np.random.dirichlet([phi] * n_clients, n_classes)  # (classes, clients)
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for c in range(n_classes):
        idx = np.flatnonzero(labels == c)
        cuts = (np.cumsum(label_distribution[c])[:-1] * len(idx)).astype(int)
        for k, piece in enumerate(np.split(idx, cuts)):
            parts[k].append(piece)
    return [np.concatenate(p).astype(np.int64) for p in parts]


def prediction_stats(pred: torch.Tensor, n_classes: int = 10) -> dict[str, float | int | bool]:
    """Share of the most-predicted class, number of classes predicted, and the stuck flag."""
    counts = torch.bincount(pred, minlength=n_classes)
    share = counts.max().item() / len(pred)
    return {"top_class_share": share, "n_pred_classes": int((counts > 0).sum()), "stuck": share >= STUCK_SHARE}


def simple_cnn(norm: str) -> nn.Module:
    """Spec 2.2 Simple-CNN: three conv-norm-ReLU-maxpool blocks, then 1024-128-10."""
    def n(c: int) -> nn.Module:
        return nn.BatchNorm2d(c, momentum=0.1) if norm == "bn" else nn.GroupNorm(2, c)

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 1, 1), n(16), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Conv2d(16, 32, 3, 1, 1), n(32), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Conv2d(32, 64, 3, 1, 1), n(64), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Flatten(), nn.Linear(1024, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def normalize(x: torch.Tensor) -> torch.Tensor:
    """uint8 N×3×H×W to the normalised floats the model sees."""
    return (x.float() / 255 - MEAN) / STD


def crop_flip(x: torch.Tensor) -> torch.Tensor:
    """RandomCrop(32, padding=4) with a black border (uint8 zeros, before Normalize) + horizontal flip."""
    b = len(x)
    padded = F.pad(x, (4, 4, 4, 4))
    dy, dx = torch.randint(0, 9, (2, b))
    ar = torch.arange(32)
    rows, cols = (dy[:, None] + ar)[:, None, :, None], (dx[:, None] + ar)[:, None, None, :]
    out = padded[torch.arange(b)[:, None, None, None], torch.arange(3)[None, :, None, None], rows, cols]
    flip = (torch.rand(b) < 0.5)[:, None, None, None]
    return torch.where(flip, out.flip(3), out)


def load_cifar10(data_dir: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train (uint8 N×3×32×32, original order) and test (normalised floats) tensors with labels."""
    parts = [np.load(data_dir / f"cifar10_train_part{i}.npz") for i in (0, 1)]
    test = np.load(data_dir / "cifar10_test_jpeg.npz")
    x = torch.from_numpy(np.concatenate([p["x"] for p in parts])).permute(0, 3, 1, 2).contiguous()
    y = torch.from_numpy(np.concatenate([p["y"] for p in parts]).astype(np.int64))
    xt = normalize(torch.from_numpy(test["x"]).permute(0, 3, 1, 2))
    return x, y, xt, torch.from_numpy(test["y"].astype(np.int64))


def client_update(model: nn.Module, x: torch.Tensor, y: torch.Tensor, idx: np.ndarray, lr: float,
                  batch: int) -> list[float]:
    """One local epoch from the weights already loaded in ``model``; returns the step losses."""
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=0)  # new every round
    losses = []
    for ib in torch.utils.data.DataLoader(torch.from_numpy(idx), batch_size=batch, shuffle=True, drop_last=True):
        loss = F.cross_entropy(model(normalize(crop_flip(x[ib]))), y[ib])
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 10)
        opt.step()
        losses.append(loss.item())
    return losses


@torch.no_grad()
def evaluate(model: nn.Module, xt: torch.Tensor, yt: torch.Tensor) -> tuple[float, torch.Tensor]:
    model.eval()
    pred = torch.cat([model(xt[i:i + 1000]).argmax(1) for i in range(0, len(xt), 1000)])
    return 100 * (pred == yt).sum().item() / len(yt), pred


def run_seed(seed: int, args: argparse.Namespace, data: tuple[torch.Tensor, ...], t0: float) -> dict:
    x, y, xt, yt = data
    start = time.time()
    clients = dirichlet_partition(y.numpy(), args.clients, args.phi, seed)  # seeds numpy's global stream
    sizes = np.array([len(c) for c in clients])
    torch.manual_seed(seed)
    model = simple_cnn(args.norm)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    evals = []
    for t in range(args.rounds):
        lr = args.lr * 0.998 ** t
        chosen = np.random.choice(args.clients, args.per_round, replace=False)
        total: dict[str, torch.Tensor] = {}
        n_sum, losses = 0, []
        for k in chosen:
            if sizes[k] < args.batch:  # see the module docstring: sampled, but not trained or averaged
                continue
            model.load_state_dict(global_state)
            losses += client_update(model, x, y, clients[k], lr, args.batch)
            for name, v in model.state_dict().items():
                total[name] = total.get(name, 0) + int(sizes[k]) * v.double()
            n_sum += int(sizes[k])
        if n_sum:
            global_state = {k: (total[k] / n_sum).round().to(v.dtype) if not v.is_floating_point()
                            else (total[k] / n_sum).to(v.dtype) for k, v in global_state.items()}
        if t + 1 in args.eval_rounds:
            model.load_state_dict(global_state)
            acc, pred = evaluate(model, xt, yt)
            rec = {"round": t + 1, "test_acc": acc, **prediction_stats(pred),
                   "train_loss": sum(losses) / len(losses) if losses else math.nan}
            evals.append(rec)
            print(f"  seed {seed} round {t + 1}: acc {acc:.2f} top-class {rec['top_class_share']:.3f} "
                  f"classes {rec['n_pred_classes']} loss {rec['train_loss']:.4f} stuck {rec['stuck']} "
                  f"({time.time() - start:.0f} s this seed, {time.time() - t0:.0f} s total)", flush=True)
    return {"seed": seed, "phi": args.phi, "norm": args.norm, "rounds": args.rounds, "lr0": args.lr,
            "batch": args.batch, "clients": args.clients, "per_round": args.per_round,
            "small_clients": int((sizes < args.batch).sum()), "evals": evals,
            "wall_s": round(time.time() - start, 1), "torch": torch.__version__, "threads": torch.get_num_threads(),
            **git_info()}


def git_info() -> dict[str, str | bool | None]:
    """The repository's commit and whether tracked files differ from it."""
    def git(*a: str) -> str | None:
        try:
            return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return None
    head, status = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": head.strip() if head else None, "git_dirty": bool(status) if status is not None else None}


def parse_seeds(s: str) -> list[int]:
    out: list[int] = []
    for part in s.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b) + 1)) if b else [int(a)]
    return out


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summary(path: Path) -> None:
    """Stuck count and rate per evaluated round; mean ± std accuracy of the runs that are not stuck."""
    runs = read_jsonl(path)
    by_round: dict[int, list[dict]] = {}
    for r in runs:
        for e in r["evals"]:
            by_round.setdefault(e["round"], []).append(e)
    settings = sorted({f"{r['norm']} phi {r['phi']} rounds {r['rounds']}" for r in runs})
    print(f"{path}: {len(runs)} runs ({'; '.join(settings)})")
    for rnd, es in sorted(by_round.items()):
        stuck = sum(e["stuck"] for e in es)
        ok = [e["test_acc"] for e in es if not e["stuck"]]
        acc = f"{statistics.mean(ok):.2f} ± {statistics.stdev(ok) if len(ok) > 1 else 0:.2f}" if ok else "n/a"
        print(f"round {rnd:4d}: stuck {stuck}/{len(es)} ({100 * stuck / len(es):.1f}%), "
              f"accuracy of the {len(ok)} that trained {acc}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="42")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--eval-rounds", default="20,40,100")
    p.add_argument("--phi", type=float, default=0.6)
    p.add_argument("--norm", choices=["bn", "gn"], default="bn")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--out", type=Path)
    p.add_argument("--summary", type=Path, help="print the summary of a JSONL written by this script and exit")
    args = p.parse_args()
    if args.summary:
        return summary(args.summary)
    if args.out is None:
        p.error("--out is required")
    torch.set_num_threads(args.threads)
    args.eval_rounds = {int(r) for r in args.eval_rounds.split(",") if int(r) <= args.rounds}
    done = {r["seed"] for r in read_jsonl(args.out)
            if r["rounds"] >= args.rounds and r["phi"] == args.phi and r["norm"] == args.norm}
    todo = [s for s in parse_seeds(args.seeds) if s not in done]
    print(f"{len(todo)} seeds to run ({len(done)} already in {args.out}); torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s)", flush=True)
    if not todo:
        return
    t0 = time.time()
    data = load_cifar10(Path(args.data_dir))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for seed in todo:
        rec = run_seed(seed, args, data, t0)
        with args.out.open("a") as f:
            f.write(json.dumps(rec) + "\n")
            f.flush()
        last = rec["evals"][-1] if rec["evals"] else {}
        print(f"seed {seed} done in {rec['wall_s']:.0f} s ({rec['wall_s'] / args.rounds:.1f} s/round), "
              f"final acc {last.get('test_acc', math.nan):.2f} stuck {last.get('stuck')}; "
              f"{time.time() - t0:.0f} s total", flush=True)


if __name__ == "__main__":
    main()
