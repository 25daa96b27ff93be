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
from fednorm.engine import executor, local, lockstep, simulator, vectorized
from fednorm.engine import feed as feed_module
from fednorm.engine.feed import crop_rows, draw_crop_flip_packed
from fednorm.errors import DivergenceError
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


def _slice_crop(image: torch.Tensor, padding: int, fill, top: int, left: int, flipped: bool) -> torch.Tensor:
    """One sample's crop by hand: a canvas of the fill (zero: ``None``) with the image pasted in its
    middle, the ``H×W`` window at ``(top, left)``, mirrored by ``torch.flip``."""
    c, h, w = image.shape
    canvas = torch.zeros(c, h + 2 * padding, w + 2 * padding, dtype=image.dtype)
    if fill is not None:
        canvas[:] = torch.tensor(fill, dtype=image.dtype).view(c, 1, 1)
    canvas[:, padding:padding + h, padding:padding + w] = image
    crop = canvas[:, top:top + h, left:left + w]
    return crop.flip(-1) if flipped else crop


@pytest.mark.parametrize("crop_fill", ["zero", "black"])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("contiguous", [True, False])
def test_the_batched_crop_is_each_samples_window_of_its_padded_image(crop_fill, channels_last, contiguous):
    """``gather_client_batch`` against slicing, in float64: every crop offset in ``[0, 2p]`` on both
    axes with and without a flip, for both fills of ``crop_fill``, the output's client ``k``, batch
    slot ``j`` and channel ``c`` at ``[j, k·C + c]``; without offsets each row whole, from the padded
    source. Non-square images, so a swapped axis, a wrong offset or a wrong flip shows."""
    padding, clients, b = 2, 5, 5
    g = torch.Generator().manual_seed(11 + channels_last)
    x = torch.randn(23, 3, 6, 7, generator=g, dtype=torch.float64)
    fill = None if crop_fill == "zero" else pixel_value(0, [0.49, 0.48, 0.45], [0.25, 0.24, 0.26])
    source = pad_for_crop(x, padding, fill)
    if not contiguous:  # a view of a wider tensor: the per-step copy of the samples first
        wide = torch.zeros(*source.shape[:3], source.shape[3] + 3, dtype=source.dtype)
        wide[..., 1:-2] = source
        source = wide[..., 1:-2]
        assert not source.is_contiguous()
    n = clients * b
    rows = torch.randint(0, len(x), (n,), generator=g)
    grid = torch.arange(2 * padding + 1)
    top = grid.repeat_interleave(2 * padding + 1)[:n]  # every (top, left) pair once
    left = grid.repeat(2 * padding + 1)[:n]
    flipped = torch.arange(n) % 2 == 1
    flipped[torch.randperm(n, generator=g)[:3]] ^= True  # not aligned with the grid
    out = gather_client_batch(source, rows, clients, padding=padding, top=top, left=left, flipped=flipped,
                              channels_last=channels_last)
    whole = gather_client_batch(source, rows, clients, padding=padding, channels_last=channels_last)
    ref = torch.empty(b, clients * 3, 6, 7, dtype=torch.float64)
    ref_whole = torch.empty_like(ref)
    for k in range(clients):
        for j in range(b):
            i = k * b + j
            ref[j, 3 * k:3 * k + 3] = _slice_crop(x[rows[i]], padding, fill, int(top[i]), int(left[i]), bool(flipped[i]))
            ref_whole[j, 3 * k:3 * k + 3] = x[rows[i]]
    assert torch.equal(out, ref) and torch.equal(whole, ref_whole)
    for got in (out, whole):
        if channels_last:
            assert got.stride() == ref.contiguous(memory_format=torch.channels_last).stride()
        else:
            assert got.is_contiguous()


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


@pytest.mark.parametrize("padding", range(10))  # 8 and 9: over the one-call range, the three calls
@pytest.mark.parametrize("sizes", [[4] * 6, [1], [17, 17], [3, 5, 1]])
def test_the_packed_draws_are_draw_crop_flips_numbers_from_each_stream(padding, sizes, monkeypatch):
    """Issue 49, host CPU per step: one call per client (where it qualifies) draws the numbers of
    ``draw_crop_flip``'s three, from the same stream, which it leaves where they leave it; the
    rows ride along unchanged."""
    if len(set(sizes)) == 1 and padding <= 7:  # the one-call path must be the one that runs
        monkeypatch.setattr(feed_module, "draw_crop_flip_rows", None)
    mine = [torch.Generator().manual_seed(100 * padding + i) for i in range(len(sizes))]
    theirs = [torch.Generator().manual_seed(100 * padding + i) for i in range(len(sizes))]
    for step in range(3):
        rows = torch.arange(sum(sizes)) * 3 + step
        packed = draw_crop_flip_packed(rows, sizes, mine, padding=padding)
        ref = [draw_crop_flip(n, padding=padding, generator=g) for n, g in zip(sizes, theirs)]
        assert packed.dtype == torch.int64 and packed.shape == (4, sum(sizes))
        assert torch.equal(packed[0], rows)
        for j in range(3):
            assert torch.equal(packed[j + 1], torch.cat([r[j] for r in ref]).long()), j
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


@pytest.mark.parametrize("padding", [0, 3])
@pytest.mark.parametrize("fill", [None, (0.25, -1.5)])
def test_crop_rows_crops_each_clients_rows_as_random_crop_flip_does(padding, fill):
    """A method's own augmented pass (HBN's statistics): each client's rows, of any number (none
    too), cropped by one gather equal bit for bit to ``random_crop_flip`` on that client's samples
    from its own stream, and the streams left where it leaves them."""
    g = torch.Generator().manual_seed(padding)
    x = torch.randn(30, 2, 6, 5, generator=g, dtype=torch.float64)
    rows = [torch.randint(0, 30, (n,), generator=g) for n in (7, 0, 1, 12)]
    mine = [torch.Generator().manual_seed(40 + i) for i in range(len(rows))]
    theirs = [torch.Generator().manual_seed(40 + i) for i in range(len(rows))]
    out = crop_rows(x, rows, mine, padding=padding, fill=fill)
    assert out is not None and [len(o) for o in out] == [len(r) for r in rows]
    for got, r, gen in zip(out, rows, theirs):
        assert torch.equal(got, random_crop_flip(x.index_select(0, r), padding=padding, fill=fill, generator=gen))
    assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(mine, theirs))


@pytest.mark.parametrize("method_args", [
    {"preset": "reference-code"},  # first_by_class, 64 samples, hybrid uploads, own alphas
    {"stats_augment": True, "stats_samples": "random", "stats_max_samples": 12, "eval_resync": "all", "final_sync": True},
    {"stats_augment": True, "sync_pass": "layerwise", "crop_fill": "black"},
])
def test_hbns_augmented_statistics_pass_is_the_per_client_paths_bit_for_bit(method_args, monkeypatch):
    """Issue 49.2: HBN's augmented statistics pass (the round's and the server's queries) crops its
    samples by one gather on the data's device (``crop_rows``); in float64 a stacked set and a run
    alone end with the states and records of the per-client pad and crop (``device_feed`` off)."""
    args = dict(method_args)
    fill = args.pop("crop_fill", "zero")
    case = dict(method="hbn", norm="hbn", method_args=args, dtype="float64", crop_fill=fill)
    configs = [ExperimentConfig(**{**BASE, **case, "seed": s}) for s in range(2)]
    alone = ExperimentConfig(**{**BASE, **case, "seed": 5, "executor": "vectorized"})
    calls: list[int] = []
    real = vectorized.VectorizedExecutor._crop_rows

    def counted(self, rows, *rest):
        calls.append(len(rows))
        return real(self, rows, *rest)

    monkeypatch.setattr(vectorized.VectorizedExecutor, "_crop_rows", counted)
    fed = _final(run_stacked(configs, write=False)[0]) + _final([api.run(alone, write=False, progress=False)])
    assert calls and sum(calls) > 0  # the one-gather path ran
    _without_feed(monkeypatch)
    calls.clear()
    ref = _final(run_stacked(configs, write=False)[0]) + _final([api.run(alone, write=False, progress=False)])
    assert not calls  # the reference is the per-client path
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


class _NoReads:
    """Makes every tensor read that waits for a device (item, bool, int, index, float, tolist, cpu,
    numpy) raise while ``active``."""

    NAMES = _HostReads.NAMES + ("__index__", "numpy")

    def __init__(self, monkeypatch) -> None:
        self.active = False
        for name in self.NAMES:
            real = getattr(torch.Tensor, name)

            def guard(t, *args, _real=real, _name=name, **kwargs):
                if self.active:
                    raise AssertionError(f"Tensor.{_name} read inside a round's steps")
                return _real(t, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, guard)

    def around(self, monkeypatch, owner, start: str | None, end: str) -> None:
        """Active from each call of ``owner.start`` (if given) until the next call of ``owner.end``."""
        for name, on in ((start, True), (end, False)) if start else ((end, False),):
            real = getattr(owner, name)

            def switch(*args, _real=real, _on=on, **kwargs):
                self.active = _on
                return _real(*args, **kwargs)

            monkeypatch.setattr(owner, name, switch)


@pytest.mark.parametrize("case", [
    dict(),  # FedAvg + BN, crop and flip, unequal clients
    dict(method="hbn", norm="hbn", method_args={"preset": "reference-code"}),
    dict(method="fbn", norm="fbn", dsgd=True),
    dict(method="fedtan", norm="bn", local_steps=3),
])
def test_no_stacked_step_reads_the_device(case, monkeypatch):
    """Issue 49.3: from a chunk's first step to its end no tensor is read back (the chunk reads its
    divergence marks and losses once, then); a stacked set and a run alone keep the records and
    states of a run that was never watched."""
    configs = [ExperimentConfig(**{**BASE, **case, "seed": s}) for s in range(2)]
    alone = ExperimentConfig(**{**BASE, **case, "seed": 5, "executor": "vectorized"})
    free = _final(run_stacked(configs, write=False)[0]) + _final([api.run(alone, write=False, progress=False)])
    guard = _NoReads(monkeypatch)
    guard.around(monkeypatch, vectorized.VectorizedExecutor, "_train_forward", "_read_chunk")
    watched = _final(run_stacked(configs, write=False)[0]) + _final([api.run(alone, write=False, progress=False)])
    _same(watched, free)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_ragged_synchronised_step_reads_nothing_and_equals_the_layer_that_read_its_total(dtype, monkeypatch):
    """FedTAN's synchronised step with unequal batches, clients in one process: each BatchNorm
    layer's ``ΣB`` comes from the batch sizes the host knows (``set_row_mask(row_sizes=...)``), not
    from a read of the row mask's sums, and the losses, gradients and running statistics are
    those of the layer that read it, bit for bit."""
    from fednorm.models import get_model
    from fednorm.nn import comm as comm_module
    from fednorm.nn.stacked import set_client_comm, stack_model

    torch.manual_seed(0)
    model = get_model("simple_cnn", num_classes=4, in_channels=3, input_size=8, norm="bn").to(dtype)
    g = torch.Generator().manual_seed(1)
    sizes = [5, 3, 8]
    xs = [torch.randn(n, 3, 8, 8, generator=g, dtype=dtype) * (1 + i) for i, n in enumerate(sizes)]
    ys = [torch.randint(0, 4, (n,), generator=g) for n in sizes]
    real = comm_module.LocalClientComm.row_totals
    told: list[bool] = []

    def counted(self, rows, sizes=None):
        told.append(sizes is not None)
        return real(self, rows, sizes)

    monkeypatch.setattr(comm_module.LocalClientComm, "row_totals", counted)
    guard = _NoReads(monkeypatch)

    def step(watch: bool) -> list[torch.Tensor]:
        stacked = stack_model(model, len(xs), verify=False)
        stacked.train()
        set_client_comm(stacked, comm_module.LocalClientComm())
        guard.active = watch
        losses, total, _ = lockstep.synced_loss(stacked, stacked, xs, ys)
        total.backward()
        guard.active = False
        return [losses.detach(), *(t.grad for t in stacked.parameters()), *stacked.buffers()]

    got = step(watch=True)
    assert told and all(told)  # every synchronised layer was told the sizes
    real_mask = lockstep.set_row_mask

    def without_sizes(net, mask, *, total_rows=None, row_sizes=None):  # the layer reads rows.sum()
        return real_mask(net, mask, total_rows=total_rows)

    monkeypatch.setattr(lockstep, "set_row_mask", without_sizes)
    told.clear()
    ref = step(watch=False)
    assert told and not any(told)
    assert len(got) == len(ref) and all(torch.equal(a, b) for a, b in zip(got, ref))


def test_a_sequential_rounds_steps_read_nothing_and_its_loss_is_the_per_step_sum(monkeypatch):
    """Issue 49.3, one client at a time: no read from the round's first step to the end of its
    last client's training, one read of the losses per round, and the round's training loss is
    what summing each step's loss on the host gave: per client ``sum(float(loss_t) * B_t) / seen``,
    weighted by the clients' sizes."""
    steps: list[list[tuple[torch.Tensor, int]]] = []  # per client trained: (step loss, batch size)
    real_ce = torch.nn.functional.cross_entropy

    class F:  # local's torch.nn.functional, recording the training losses
        def __getattr__(self, name):
            return getattr(torch.nn.functional, name)

        @staticmethod
        def cross_entropy(logits, y, *args, **kwargs):
            loss = real_ce(logits, y, *args, **kwargs)
            steps[-1].append((loss.detach().clone(), len(y)))
            return loss

    guard = _NoReads(monkeypatch)
    real_train, real_read = executor.train_local, executor.read_losses
    reads: list[int] = []

    def train(*args, **kwargs):
        steps.append([])
        guard.active = True  # until the round's read_losses
        return real_train(*args, **kwargs)

    def read(results):
        guard.active = False
        reads.append(len(results))
        return real_read(results)

    monkeypatch.setattr(local, "F", F())
    monkeypatch.setattr(executor, "train_local", train)
    monkeypatch.setattr(executor, "read_losses", read)
    sizes: list[torch.Tensor] = []
    real_update = simulator.Simulation.server_update

    def update(self, plan, updates):
        sizes.append(updates.num_examples.clone())
        return real_update(self, plan, updates)

    monkeypatch.setattr(simulator.Simulation, "server_update", update)
    cfg = ExperimentConfig(**{**BASE, "executor": "sequential", "seed": 2})
    history = api.run(cfg, write=False, progress=False).simulation.history
    assert len(steps) == cfg.rounds * cfg.clients_per_round and len(history) == len(sizes) == cfg.rounds
    assert reads == [cfg.clients_per_round] * cfg.rounds  # once per round, every client's losses
    per_client = []
    for client in steps:
        total = 0.0
        for loss, size in client:
            total += float(loss) * size
        per_client.append(total / sum(size for _, size in client))
    k = cfg.clients_per_round
    for r, w in enumerate(sizes):
        means = torch.tensor(per_client[r * k:(r + 1) * k], dtype=torch.float64)
        expected = float((means * w).sum() / w.sum())
        assert history[r]["train_loss"] == expected


@pytest.mark.parametrize("crash_later", [False, True])
def test_a_sequential_rounds_divergence_is_the_one_a_read_per_client_raised(crash_later, monkeypatch):
    """The round's one read raises the DivergenceError (round, client, step, value) that reading
    each client's losses after its training raised: the first diverged client's (the second
    trained, its weights NaN), also when a later client raises a DivergenceError of its own
    (``crash_later``: the third) before the round's read."""
    from fednorm.methods import FedAvg, register_method

    begun: list[int] = []

    @register_method("_test_nan_second_client", force=True)
    class NanSecond(FedAvg):
        name = "_test_nan_second_client"

        def client_begin(self, ctx):
            begun.append(ctx.client_id)
            if len(begun) == 2:
                with torch.no_grad():
                    for p in ctx.model.parameters():
                        p.fill_(float("nan"))
            if crash_later and len(begun) == 3:
                raise DivergenceError("a later client's own divergence")

    cfg = ExperimentConfig(**{**BASE, "executor": "sequential", "method": "_test_nan_second_client", "seed": 3})
    with pytest.raises(DivergenceError) as deferred:
        api.run(cfg, write=False, progress=False)
    assert len(begun) == (3 if crash_later else cfg.clients_per_round)  # the round went on after the NaN client
    real_train = executor.train_local

    def per_client(*args, **kwargs):
        return real_train(*args, **{**kwargs, "read": True})

    monkeypatch.setattr(executor, "train_local", per_client)
    begun.clear()
    with pytest.raises(DivergenceError) as each:
        api.run(cfg, write=False, progress=False)
    assert len(begun) == 2  # reading per client stopped at the NaN client
    assert "non-finite training loss (nan) at round 1" in str(each.value) and "step 1" in str(each.value)
    assert str(deferred.value) == str(each.value)


def test_a_rounds_bookkeeping_reads_do_not_grow_with_its_clients(monkeypatch):
    """Issue 49.3: the server's screening of a round's updates (non-finite rows, the aggregate)
    reads the device a fixed number of times, not once per client and tensor."""
    reads = _HostReads(monkeypatch)
    real = simulator.Simulation.server_update
    counts: dict[int, list[int]] = {}

    def counted(self, plan, updates):
        reads.count, reads.active = 0, True
        try:
            return real(self, plan, updates)
        finally:
            reads.active = False
            counts.setdefault(len(plan.clients), []).append(reads.count)

    monkeypatch.setattr(simulator.Simulation, "server_update", counted)
    for k in (2, 6):
        api.run(ExperimentConfig(**{**BASE, "clients_per_round": k, "executor": "vectorized", "seed": 1}), write=False,
                progress=False)
    assert counts[2] == counts[6], counts


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
