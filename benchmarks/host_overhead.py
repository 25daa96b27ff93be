"""The host's share of a stacked round: the engine against the feed bound, with a nearly free model.

On a GPU, HBN Table 1's stacked rounds stop scaling at about 8,000 samples/s (docs/performance.md):
the host, not the device, bounds them. This benchmark measures that ceiling on any machine by
taking the model's compute away: R stacked runs × 10 clients × B = 4 on CIFAR-10-sized images
(3×32×32, crop-and-flip augmentation) train a model that costs almost nothing (global average
pooling, then a 1×1 convolution to the classes), so what is left is the engine's host work per
step: batch gathering, augmentation, the stacked step's bookkeeping, the round's aggregation.

Beside it, in the same process with interleaved repeats, a plain loop feeds the same free model
batches of R × 10 × 4 rows gathered from the same resident tensors with the same crop and flip,
one SGD step each: the *feed bound*, the least host work a step can cost. The last line prints the
engine's samples/s as a fraction of the feed bound (the median of per-repeat paired ratios) and
the engine's host CPU seconds per step. The engine is timed from the end of its first round to
the end of its last (build and first-round costs excluded), the feed loop over the same number of
steps.

    python benchmarks/host_overhead.py --runs 10 --rounds 3 --repeats 3
    python benchmarks/host_overhead.py --runs 10 --rounds 3 --repeats 3 --no-channels-last  # the feed loop's layout
    python benchmarks/host_overhead.py --runs 10 --rounds 3 --repeats 3 --steady-malloc     # no page-fault swings
    python benchmarks/host_overhead.py --runs 10 --rounds 3 --repeats 3 --device cuda       # the GPU's feed bound

On a GPU (``--device cuda``) both loops keep the images on the device and draw the crops on the
host, as the engine does; each timing ends with a synchronisation, so queued kernels are counted.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks.harness import machine, print_row, write_result  # noqa: E402

from fednorm.api.run_set import run_stacked  # noqa: E402
from fednorm.config import ExperimentConfig  # noqa: E402
from fednorm.data.federated import FederatedData  # noqa: E402
from fednorm.data.transforms import apply_crop_flip, draw_crop_flip  # noqa: E402

CLIENTS, PER_ROUND, CLASSES = 100, 10, 10


class FreeModel(nn.Module):
    """Global average pooling, then a 1×1 convolution to the classes: a forward and backward
    pass that cost almost nothing, so the step's time is the host's."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Conv2d(3, CLASSES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(x)).flatten(1)


def federation(samples_per_client: int, seed: int = 0) -> FederatedData:
    g = torch.Generator().manual_seed(seed)
    clients = [(torch.randn(samples_per_client, 3, 32, 32, generator=g),
                torch.randint(0, CLASSES, (samples_per_client,), generator=g)) for _ in range(CLIENTS)]
    test = (torch.randn(100, 3, 32, 32, generator=g), torch.arange(100) % CLASSES)
    return FederatedData.from_tensors(clients, test, name="host_overhead", num_classes=CLASSES, augment=True)


def sync(device: str) -> None:
    """Wait for the device's queued work, so that a timing mark counts it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def engine(data: FederatedData, runs: int, rounds: int, batch: int, threads: int,
           channels_last: bool = True, device: str = "cpu") -> tuple[float, float, int, int]:
    """R stacked runs of FedAvg on the free model: (wall s, CPU s, samples, steps) from the end of
    round 1 to the end of the last round. ``channels_last``: the engine's default input layout
    (off: the feed loop's NCHW, which a CPU gathers about twice as fast)."""
    configs = [ExperimentConfig(seed=s, rounds=rounds, num_clients=CLIENTS, clients_per_round=PER_ROUND, batch_size=batch,
                                lr=0.01, momentum=0.9, eval_every=10**6, eval_last_rounds=0, checkpoint_every=0,
                                threads=threads, drop_last=True, norm="none", channels_last=channels_last,
                               device=device)
               for s in range(runs)]
    marks: dict[int, tuple[float, float]] = {}

    def on_round(record, sim) -> None:
        if sim.config.seed == runs - 1:  # the set's round is over once its last run has aggregated
            sync(device)
            marks[record.server_round] = (time.perf_counter(), time.process_time())

    results, info = run_stacked(configs, data=[data] * runs, write=False, model=FreeModel(), on_round=on_round)
    bad = [r for r in results if isinstance(r, BaseException)]
    if bad:
        raise bad[0]
    if info["joint_rounds"] != rounds:
        raise RuntimeError(f"the runs did not stack: {info}")
    (w0, c0), (w1, c1) = marks[1], marks[rounds]
    steps = (rounds - 1) * (len(data.client_train[0]) // batch)
    return w1 - w0, c1 - c0, (rounds - 1) * runs * PER_ROUND * len(data.client_train[0]), steps


def feed(data: FederatedData, runs: int, steps: int, batch: int, seed: int = 0,
         device: str = "cpu") -> tuple[float, float, int]:
    """The feed bound: ``steps`` SGD steps of the free model on R × 10 × B rows gathered from the
    resident tensors with crop and flip: (wall s, CPU s, samples). Rows and crops are drawn on the
    host and copied over, as the engine draws them."""
    model = FreeModel().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(seed)
    x_all, y_all = data.train_x.to(device), data.train_y.to(device)
    rows = runs * PER_ROUND * batch
    padding = data.info.crop_padding or 4
    sync(device)
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        idx = torch.randint(0, len(x_all), (rows,), generator=g).to(device, non_blocking=True)
        x = x_all.index_select(0, idx)
        top, left, flipped = (t.to(device, non_blocking=True) for t in draw_crop_flip(rows, padding=padding, generator=g))
        x = apply_crop_flip(x, top, left, flipped, padding=padding)
        loss = F.cross_entropy(model(x), y_all.index_select(0, idx))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    sync(device)
    return time.perf_counter() - w0, time.process_time() - c0, steps * rows


def steady_malloc() -> bool:
    """glibc's malloc set to keep freed buffers (no mmap below 32 MiB, no trimming), so that neither
    loop pays page faults for the buffers it allocates every step; ``False`` where that is not glibc.
    Without it the feed loop's CPU per step on the 2-core machine ranged 3.7-12.6 ms from process
    to process (steady within one), which made the wall-time fraction a draw."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt"):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 32 << 20)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10, help="stacked runs R")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per engine repeat (the first is not timed)")
    ap.add_argument("--samples-per-client", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True,
                    help="the engine's input layout (default: channels-last, the engine's default; the feed loop is NCHW)")
    ap.add_argument("--steady-malloc", action="store_true",
                    help="keep freed buffers in glibc's heap (mallopt), so that page faults do not swing either loop")
    ap.add_argument("--device", default="cpu", help="torch device of both loops, e.g. cuda")
    ap.add_argument("--out", default="benchmarks/results/host_overhead.json")
    args = ap.parse_args()
    if args.steady_malloc and not steady_malloc():
        ap.error("--steady-malloc needs glibc's mallopt")
    torch.set_num_threads(args.threads)
    data = federation(args.samples_per_client)
    label = f"R = {args.runs} stacked runs × {PER_ROUND} clients × B = {args.batch_size}, free model"
    if not args.channels_last:
        label += ", NCHW input (channels_last off)"
    if args.steady_malloc:
        label += ", steady malloc"
    if args.device != "cpu":
        label += f", on {args.device}"
    records = []
    for rep in range(args.repeats + 1):  # repeat 0 warms both up and is not kept
        e_wall, e_cpu, e_samples, steps = engine(data, args.runs, args.rounds, args.batch_size, args.threads,
                                                 args.channels_last, args.device)
        f_wall, f_cpu, f_samples = feed(data, args.runs, steps, args.batch_size, seed=rep, device=args.device)
        if rep == 0:
            continue
        rec = {"engine_samples_per_s": e_samples / e_wall, "feed_samples_per_s": f_samples / f_wall,
               "engine_cpu_s_per_step": e_cpu / steps, "feed_cpu_s_per_step": f_cpu / steps, "steps": steps}
        rec["fraction"] = rec["engine_samples_per_s"] / rec["feed_samples_per_s"]
        records.append(rec)
        print_row(f"repeat {rep}", f"engine {rec['engine_samples_per_s']:.0f} samples/s, feed bound "
                  f"{rec['feed_samples_per_s']:.0f} samples/s, fraction {rec['fraction']:.3f}, engine host CPU "
                  f"{1000 * rec['engine_cpu_s_per_step']:.2f} ms/step ({label})")
    summary = {key: statistics.median(r[key] for r in records) for key in records[0] if key != "steps"}
    write_result(args.out, {"benchmark": "host_overhead", "args": vars(args), "machine": machine(), "label": label,
                            "summary": summary, "raw": records})
    print_row("result", f"engine at {summary['fraction']:.3f} of the feed bound (median of {len(records)} paired ratios: "
              f"{summary['engine_samples_per_s']:.0f} against {summary['feed_samples_per_s']:.0f} samples/s); engine host "
              f"CPU {1000 * summary['engine_cpu_s_per_step']:.2f} ms per step ({label})")


if __name__ == "__main__":
    main()
