"""Issue 49: the step's batch gathered on the data's device by one index, no host reads inside a
round's steps, and the stacked step under torch.compile.

The batched path (fednorm/engine/feed.py, ``gather_client_batch``) must give the per-row path's
batches bit for bit: the per-sample reference here is ``random_crop_flip`` client by client (the
sequential executor's augmentation) and, for whole runs, the vectorized executor's per-row gather
(``_gather``, kept: ``device_feed = False``)."""

from __future__ import annotations

import math

import pytest
import torch

from fednorm import api
from fednorm.api.run_set import run_stacked
from fednorm.config import ExperimentConfig
from fednorm.data.transforms import (
    draw_crop_flip,
    draw_crop_flip_rows,
    gather_client_batch,
    pad_for_crop,
    pixel_value,
    random_crop_flip,
)
from fednorm.engine import vectorized
from fednorm.nn.stacked import to_client_layout

BASE = dict(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=6, clients_per_round=4, batch_size=8, lr=0.05,
            momentum=0.9, model="simple_cnn", rounds=2, augment=True, threads=1, eval_every=1)


def _per_sample(x: torch.Tensor, rows: torch.Tensor, clients: int, seeds: list[int], padding: int, fill,
                channels_last: bool) -> torch.Tensor:
    """The reference: each client's rows cropped by ``random_crop_flip`` from its own stream, then
    the stacked model's client layout, as the per-row executor builds it."""
    b = len(rows) // clients
    parts = [random_crop_flip(x.index_select(0, rows[i * b:(i + 1) * b]), padding=padding, fill=fill,
                              generator=torch.Generator().manual_seed(s)) for i, s in enumerate(seeds)]
    out = to_client_layout(torch.cat(parts).view(clients, b, *x.shape[1:]))
    return out.contiguous(memory_format=torch.channels_last) if channels_last else out


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("padding", [0, 2, 4])
@pytest.mark.parametrize("fill", ["zero", "values", "black"])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_batched_crop_equals_the_per_sample_path_bit_for_bit(channels, padding, fill, channels_last, dtype):
    g = torch.Generator().manual_seed(channels * 100 + padding)
    x = torch.randn(40, channels, 7, 5, generator=g, dtype=dtype)
    fills = {"zero": None, "values": tuple(float(v) for v in torch.randn(channels, generator=g)),
             "black": pixel_value(0, [0.4] * channels, [0.2] * channels)}[fill]
    for clients, b in ((5, 3), (1, 4), (1, 1), (3, 1)):  # one client of one channel: its own memory format
        rows = torch.randint(0, len(x), (clients * b,), generator=g)
        seeds = [int(s) for s in torch.randint(0, 10**6, (clients,), generator=g)]
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        top, left, flipped = draw_crop_flip_rows([b] * clients, gens, padding=padding)
        out = gather_client_batch(pad_for_crop(x, padding, fills), rows, clients, padding=padding, top=top, left=left,
                                  flipped=flipped, channels_last=channels_last)
        ref = _per_sample(x, rows, clients, seeds, padding, fills, channels_last)
        # channels-last strides as the per-row path's (the kernels choose by them); otherwise
        # contiguous (the per-row reshape may leave a one-channel view, which a kernel copies first)
        assert out.shape == ref.shape and out.dtype == ref.dtype
        assert out.stride() == ref.stride() if channels_last else out.is_contiguous()
        assert torch.equal(out, ref)
        whole = gather_client_batch(x, rows, clients, channels_last=channels_last)  # no augmentation
        ref = to_client_layout(x.index_select(0, rows).view(clients, b, *x.shape[1:]))
        ref = ref.contiguous(memory_format=torch.channels_last) if channels_last else ref
        assert torch.equal(whole, ref)
        assert whole.stride() == ref.stride() if channels_last else whole.is_contiguous()


def test_the_rows_draws_are_draw_crop_flips_calls_on_each_stream():
    sizes = [3, 1, 4, 2]
    mine = [torch.Generator().manual_seed(10 + i) for i in range(4)]
    theirs = [torch.Generator().manual_seed(10 + i) for i in range(4)]
    for _ in range(3):  # step after step: each stream moves on as it does today
        top, left, flipped = draw_crop_flip_rows(sizes, mine, padding=3)
        ref = [draw_crop_flip(n, padding=3, generator=g) for n, g in zip(sizes, theirs)]
        assert torch.equal(top, torch.cat([r[0] for r in ref])) and torch.equal(left, torch.cat([r[1] for r in ref]))
        assert torch.equal(flipped, torch.cat([r[2] for r in ref]))
    for a, b in zip(mine, theirs):
        assert torch.equal(a.get_state(), b.get_state())


def _final(results) -> list[dict]:
    out = []
    for r in results:
        if isinstance(r, BaseException):
            raise r
        out.append({"state": r.simulation.global_state, "history": r.simulation.history})
    return out


def _same(a: list[dict], b: list[dict]) -> None:
    for x, y in zip(a, b, strict=True):
        for key, value in x["state"].items():
            assert torch.equal(value, y["state"][key]), key
        for hx, hy in zip(x["history"], y["history"], strict=True):
            for key in ("train_loss", "test_loss", "test_accuracy"):
                vx, vy = hx.get(key), hy.get(key)
                assert vx == vy or (isinstance(vx, float) and math.isnan(vx) and math.isnan(vy)), key


def _without_feed(monkeypatch) -> None:
    real = vectorized.VectorizedExecutor.__init__

    def init(self, *args, **kwargs):
        real(self, *args, **kwargs)
        self.device_feed = False  # the per-row gather and augmentation (the reference)

    monkeypatch.setattr(vectorized.VectorizedExecutor, "__init__", init)


@pytest.mark.parametrize("case", [
    dict(crop_fill="black"),
    dict(channels_last=False),
    dict(augment=False),
    dict(method="hbn", norm="hbn", method_args={"stats_augment": True}),
])
def test_a_stacked_set_and_a_run_alone_train_the_bits_of_the_per_row_gather(case, monkeypatch):
    configs = [ExperimentConfig(**{**BASE, **case, "seed": s, "lr": 0.05 * (1 + s % 2)}) for s in range(3)]
    alone = ExperimentConfig(**{**BASE, **case, "seed": 7, "executor": "vectorized"})
    fed = _final(run_stacked(configs, write=False)[0]) + _final([api.run(alone, write=False, progress=False)])
    _without_feed(monkeypatch)
    ref = _final(run_stacked(configs, write=False)[0]) + _final([api.run(alone, write=False, progress=False)])
    _same(fed, ref)


class _HostReads:
    """Counts the tensor reads that make a host wait for a device (item, bool, int, float, tolist,
    cpu) while ``active``."""

    NAMES = ("item", "__bool__", "__int__", "__float__", "tolist", "cpu")

    def __init__(self, monkeypatch) -> None:
        self.count = 0
        self.active = False
        for name in self.NAMES:
            real = getattr(torch.Tensor, name)

            def spy(t, *args, _real=real, **kwargs):
                if self.active:
                    self.count += 1
                return _real(t, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, spy)


@pytest.mark.parametrize("case", [dict(), dict(method="hbn", norm="hbn"), dict(dsgd=True, method="fbn", norm="fbn")])
def test_a_rounds_local_steps_read_nothing_back_from_the_device(case, monkeypatch):
    """The reads of a round's training do not grow with its local steps: none is made per step (the
    chunk's divergence check and its loss read once, at its end)."""
    reads = _HostReads(monkeypatch)
    real = vectorized.VectorizedExecutor.run_round
    counts: dict[int, list[int]] = {}

    def counted(self, *args, **kwargs):
        reads.count, reads.active = 0, True
        try:
            return real(self, *args, **kwargs)
        finally:
            reads.active = False
            counts.setdefault(self.spec.steps, []).append(reads.count)

    monkeypatch.setattr(vectorized.VectorizedExecutor, "run_round", counted)
    for steps in (2, 7):
        cfg = ExperimentConfig(**{**BASE, **case, "local_steps": steps, "executor": "vectorized", "seed": 1})
        api.run(cfg, write=False, progress=False)
    assert counts[2] == counts[7], counts
    assert max(counts[7]) <= 8, counts


@pytest.mark.slow
def test_the_compiled_step_equals_eager_training():
    """``train_compile``: the stacked step under torch.compile trains what eager training does, to
    float rounding (a stacked set, so the compiled model is the stacked runs' one)."""
    cfg = dict(BASE, rounds=2, clients_per_round=3, dtype="float64", crop_fill="black")
    eager = _final(run_stacked([ExperimentConfig(**cfg, seed=s) for s in range(2)], write=False)[0])
    compiled = _final(run_stacked([ExperimentConfig(**cfg, seed=s, train_compile=True) for s in range(2)], write=False)[0])
    for a, b in zip(eager, compiled):
        for key, value in a["state"].items():
            torch.testing.assert_close(b["state"][key], value, rtol=1e-9, atol=1e-11)
