"""HBN's hybrid normalisation per layer: the native-kernel op against the same algebra in tensor ops
and against plain BatchNorm, forward + backward and the no-grad forward of the statistics pass.

The tensor-op version is the formulation `fednorm.nn.hbn._HybridNorm` used before it moved onto
BatchNorm's native kernels (channel mean, a centred copy, its squares summed, then
``addcmul``; backward from ``Σg`` and ``Σg·x``). Shapes are the stacked layers of the HBN paper's
Simple-CNN with 10 clients at batch 4 (training) and a 512-row pass (the statistics pass), in
channels-last layout as the engine feeds them. Interleaved repeats, medians.

    python benchmarks/hbn_layer.py --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before opacus's `benchmarks`
from benchmarks.harness import interleaved, print_row, write_result  # noqa: E402

from fednorm.nn.hbn import _HybridNorm  # noqa: E402


def _view(t: torch.Tensor, d: int) -> torch.Tensor:
    return t.view([1, -1] + [1] * (d - 2))


class TensorOps(torch.autograd.Function):
    """Eqs. 1, 9, 10 with a closed-form backward, in plain tensor ops (the earlier formulation)."""

    @staticmethod
    def forward(ctx: Any, x, w, gm, gv, weight, bias, eps):  # type: ignore[no-untyped-def]
        dims = [0] + list(range(2, x.dim()))
        n, d = x.numel() // x.shape[1], x.dim()
        bm = x.mean(dim=dims)
        centred = x - _view(bm, d)
        bv = centred.mul_(centred).sum(dim=dims).div_(n)
        mean, var = w * bm + (1 - w) * gm, w * bv + (1 - w) * gv
        rstd = torch.rsqrt(var + eps)
        scale = rstd * weight
        shift = bias - mean * scale
        ctx.save_for_backward(x, w, bm, bv, mean, rstd, gm, gv, weight)
        return torch.addcmul(_view(shift, d), x, _view(scale, d))

    @staticmethod
    def backward(ctx: Any, g):  # type: ignore[no-untyped-def]
        x, w, bm, bv, mean, rstd, gm, gv, weight = ctx.saved_tensors
        d, dims = x.dim(), [0] + list(range(2, x.dim()))
        n = x.numel() // x.shape[1]
        sum_g = g.sum(dim=dims)
        sum_gc = (g * x).sum(dim=dims) - mean * sum_g
        d_mean, d_var = -rstd * weight * sum_g, -0.5 * rstd**3 * weight * sum_gc
        b = 2.0 * d_var * w / n
        c = d_mean * w / n - b * bm
        gx = torch.addcmul(torch.addcmul(_view(c, d), x, _view(b, d)), g, _view(rstd * weight, d))
        return gx, d_mean * (bm - gm) + d_var * (bv - gv), None, None, rstd * sum_gc, sum_g, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20, help="calls per timing")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/hbn_layer.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shapes = {"conv1, training (B=4, 10 clients)": (4, 60, 28, 28), "conv2, training": (4, 160, 10, 10),
              "fc, training": (4, 1200), "conv1, statistics pass (512 rows)": (512, 60, 28, 28)}
    rows = []
    for label, shape in shapes.items():
        gen = torch.Generator().manual_seed(0)
        c = shape[1]
        x = torch.randn(shape, generator=gen)
        g = torch.randn(shape, generator=gen)
        if x.dim() == 4:
            x, g = (t.contiguous(memory_format=torch.channels_last) for t in (x, g))
        x.requires_grad_()
        w = torch.rand(c, generator=gen).requires_grad_()
        gm, gv = torch.randn(c, generator=gen), torch.rand(c, generator=gen) + 0.5
        weight, bias = torch.randn(c, generator=gen).requires_grad_(), torch.randn(c, generator=gen).requires_grad_()
        rm, rv = gm.clone(), gv.clone()
        ops: dict[str, Callable[[], torch.Tensor]] = {
            "native": lambda: _HybridNorm.apply(x, w, gm, gv, weight, bias, 1e-5),
            "tensor ops": lambda: TensorOps.apply(x, w, gm, gv, weight, bias, 1e-5),
            "BatchNorm": lambda: F.batch_norm(x, rm, rv, weight, bias, True, 0.1, 1e-5),
        }

        def train(op: Callable[[], torch.Tensor]) -> None:
            for _ in range(args.calls):
                op().backward(g)

        def forward(op: Callable[[], torch.Tensor]) -> None:
            with torch.no_grad():
                for _ in range(args.calls):
                    op()

        variants = {}
        for name, op in ops.items():  # each op's training calls, then its no-grad calls, op after op
            variants[f"{name} train"] = lambda op=op: train(op)
            variants[f"{name} forward"] = lambda op=op: forward(op)
        timing = interleaved(variants, args.repeats, warmup=0)
        ms = {v: [t / args.calls * 1e3 for t in timing.values(v)] for v in variants}
        row = {"layer": label, "shape": list(shape), **{f"{v} ms": statistics.median(t) for v, t in ms.items()}}
        # ratios of the medians, as docs/performance.md quotes them; the paired ratios beside them
        row["tensor ops / native, train"] = row["tensor ops train ms"] / row["native train ms"]
        row["tensor ops / native, forward"] = row["tensor ops forward ms"] / row["native forward ms"]
        row["native / BatchNorm, train"] = row["native train ms"] / row["BatchNorm train ms"]
        row["tensor ops / native, train (paired)"] = timing.ratio("tensor ops train", "native train")
        row["tensor ops / native, forward (paired)"] = timing.ratio("tensor ops forward", "native forward")
        row["native / BatchNorm, train (paired)"] = timing.ratio("native train", "BatchNorm train")
        row["ms_per_call"] = ms
        row["raw"] = timing.runs
        rows.append(row)
    print_row(f"{args.repeats} repeats of {args.calls} calls", "medians, ms per call:")
    print("| layer | native fwd+bwd (ms) | tensor ops | BatchNorm | tensor ops / native | native / BN "
          "| no-grad forward: native | tensor ops / native |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['layer']} | {r['native train ms']:.3f} | {r['tensor ops train ms']:.3f} | {r['BatchNorm train ms']:.3f} "
              f"| {r['tensor ops / native, train']:.2f}× | {r['native / BatchNorm, train']:.2f}× "
              f"| {r['native forward ms']:.3f} | {r['tensor ops / native, forward']:.2f}× |")
    write_result(args.out, {"repeats": args.repeats, "calls": args.calls, "rows": rows})


if __name__ == "__main__":
    main()
