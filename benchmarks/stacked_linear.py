"""How the vectorized executor's stacked ``Linear`` is computed: ``X W^T`` against ``(W X^T)^T``.

Both give the same numbers; they differ in the layout of the weight's gradient. With ``X W^T``
the weight enters the product transposed, its gradient comes out as a transposed view, and
autograd copies it into the parameter's layout every step; with ``W X^T`` the gradient is
contiguous as computed. The layers timed are the models' own (Simple-CNN at B = 4 and 16, the
FedBN digits CNN at B = 32, 100 clients of Simple-CNN's first layer); forward + backward,
interleaved, one thread:

    python benchmarks/stacked_linear.py --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks.harness import interleaved, print_row, write_result  # noqa: E402

#: (label, clients K, batch B, in, out)
LAYERS = [
    ("Simple-CNN fc1, B=4", 10, 4, 400, 120),
    ("Simple-CNN fc2, B=4", 10, 4, 120, 84),
    ("Simple-CNN fc1, B=16", 10, 16, 400, 120),
    ("Simple-CNN fc1, 100 clients, B=4", 100, 4, 400, 120),
    ("FedBN CNN fc1, B=32", 5, 32, 6272, 2048),
    ("FedBN CNN fc2, B=32", 5, 32, 2048, 512),
]


def x_wt(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The former form: [K, B, in] (contiguous) times W^T."""
    k, out, inp = w.shape
    bsz = x.shape[0]
    xk = x.reshape(bsz, k, inp).transpose(0, 1).contiguous()
    return torch.baddbmm(b.unsqueeze(1), xk, w.transpose(1, 2)).transpose(0, 1).reshape(bsz, k * out)


def w_xt(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fednorm's form (:class:`fednorm.nn.stacked.StackedLinear`): W times X^T, transposed back."""
    k, out, inp = w.shape
    bsz = x.shape[0]
    yt = torch.baddbmm(b.unsqueeze(2), w, x.reshape(bsz, k, inp).permute(1, 2, 0))
    return yt.permute(2, 0, 1).reshape(bsz, k * out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "stacked_linear.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = []
    print_row(f"{args.repeats} repeats", "forward + backward, medians:")
    print(f"{'layer':36s} {'X W^T (ms)':>11s} {'W X^T (ms)':>11s} {'speed-up':>9s}")
    for label, k, bsz, inp, out in LAYERS:
        w = torch.randn(k, out, inp, requires_grad=True)
        b = torch.randn(k, out, requires_grad=True)
        x = torch.randn(bsz, k * inp, requires_grad=True)
        with torch.no_grad():  # the same layer: equal in float64 to rounding
            torch.testing.assert_close(x_wt(x.double(), w.double(), b.double()), w_xt(x.double(), w.double(), b.double()))
        inner = max(1, min(200, int(3e7 / (k * bsz * inp * out))))  # about 0.1 s a sample on this CPU

        def forward_backward(fn: Callable[..., torch.Tensor]) -> None:
            for _ in range(inner):
                w.grad = b.grad = x.grad = None
                fn(x, w, b).square().sum().backward()

        timing = interleaved({"X W^T": lambda: forward_backward(x_wt), "W X^T": lambda: forward_backward(w_xt)},
                             args.repeats, warmup=0, baseline="X W^T")
        times = {name: [t / inner for t in timing.values(name)] for name in timing.runs}
        old, new = statistics.median(times["X W^T"]), statistics.median(times["W X^T"])
        # speedup: the ratio of the medians, as docs/performance.md quotes it; the paired ratio beside it
        rows.append({"layer": label, "clients": k, "batch": bsz, "in": inp, "out": out,
                     "x_wt_s": old, "w_xt_s": new, "speedup": old / new,
                     "speedup_paired": timing.ratio("X W^T", "W X^T"), "samples": times, "raw": timing.runs})
        print(f"{label:36s} {old * 1e3:11.3f} {new * 1e3:11.3f} {old / new:8.2f}x")
    write_result(args.out, {"repeats": args.repeats, "rows": rows})


if __name__ == "__main__":
    main()
