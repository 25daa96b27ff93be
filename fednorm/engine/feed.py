"""A chunk's training batches: drawn on the host, gathered on the data's device by one index per step.

The training and test tensors of a run are moved to its device once (``Simulation`` does it); what
a step needs from the host is only *which* samples and *which* crops: each client's batch plan
(its permutations) and its crop offsets and flips, drawn on the CPU from the client's own seeded
stream as before, so every device sees the same batches. :class:`StepFeed` turns them into the
stacked model's input with one host-to-device copy of a few integers per step and one gather on
the device:

- at the start of a round each client's plan is mapped to dataset rows on the host (one index
  operation per client and round, not per step);
- at each step the members' crop offsets and flips are drawn from their streams
  (:func:`~fednorm.data.transforms.draw_crop_flip_rows`: the calls ``draw_crop_flip`` makes, in its
  order), packed with the rows into one ``[4, K·B]`` integer tensor and copied to the device
  (pinned and asynchronous on CUDA: the host does not wait for the device);
- the batch is one gather (:func:`~fednorm.data.transforms.gather_client_batch`) from the training
  images padded once with the crop's fill, written straight into the stacked model's client layout
  (and memory format): no per-batch padding, no layout copies. Every element is a copy of the
  per-row path's, so the batches are bit for bit the same.
"""

from __future__ import annotations

import functools
import weakref
from typing import Sequence

import torch

from ..data.transforms import draw_crop_flip, draw_crop_flip_rows, gather_client_batch, pad_for_crop

__all__ = ["StepFeed", "crop_source", "crop_rows", "draw_crop_flip_packed", "to_device", "PADDED_SOURCE_BUDGET"]

#: The most bytes a padded copy of the training images may take (beyond it the executor gathers
#: and crops each step's rows as before, from the unpadded tensor).
PADDED_SOURCE_BUDGET = 8 << 30

# id(training tensor) -> (a weak reference to it, {(padding, fill): padded copy}); dropped with the
# tensor (keyed by identity: a tensor's == compares values)
_PADDED: dict[int, tuple[weakref.ref, dict[tuple, torch.Tensor]]] = {}


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` (on the host) on ``device`` without making the host wait: a CUDA copy goes from pinned
    memory asynchronously (the caching host allocator keeps the buffer until the copy is done)."""
    if device.type == "cpu":
        return t
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device, non_blocking=True)


def crop_source(train_x: torch.Tensor, padding: int, fill: Sequence[float] | None) -> torch.Tensor | None:
    """The training images padded for the crop (:func:`~fednorm.data.transforms.pad_for_crop`),
    built once per tensor, padding and fill and shared by every executor that trains on them;
    ``None`` when the copy would exceed :data:`PADDED_SOURCE_BUDGET`."""
    n, c, h, w = train_x.shape
    if n * c * (h + 2 * padding) * (w + 2 * padding) * train_x.element_size() > PADDED_SOURCE_BUDGET:
        return None
    key = (padding, None if fill is None else tuple(float(v) for v in fill))
    entry = _PADDED.get(id(train_x))
    if entry is None or entry[0]() is not train_x:
        entry = _PADDED[id(train_x)] = (weakref.ref(train_x), {})
        weakref.finalize(train_x, _PADDED.pop, id(train_x), None)
    cached = entry[1]
    if key not in cached:
        with torch.no_grad():
            cached[key] = pad_for_crop(train_x.detach(), padding, fill)
    return cached[key]


def crop_rows(train_x: torch.Tensor, rows: Sequence[torch.Tensor], generators: Sequence[torch.Generator], *,
              padding: int, fill: Sequence[float] | None) -> list[torch.Tensor] | None:
    """Each client's samples ``train_x[rows[i]]`` cropped and flipped from its own stream
    ``generators[i]``, what ``random_crop_flip(train_x[rows[i]], padding=padding, fill=fill,
    generator=generators[i])`` gives bit for bit, by the training steps' path: the draws on the host
    (:func:`~fednorm.data.transforms.draw_crop_flip_rows`), one copy of the integers to the device and
    one gather from the padded images (:func:`crop_source`) for all clients, instead of a pad and a
    gather per client. For a method's own passes over the training data (HBN's augmented statistics
    pass). ``rows`` on ``train_x``'s device; ``None`` when the padded copy is over its budget."""
    source = crop_source(train_x, padding, fill)
    if source is None:
        return None
    sizes = [len(r) for r in rows]
    top, left, flipped = draw_crop_flip_rows(sizes, generators, padding=padding)
    draws = to_device(torch.stack([top, left, flipped.long()]), source.device)
    x = gather_client_batch(source, torch.cat(list(rows)).to(source.device), 1, padding=padding, top=draws[0], left=draws[1],
                            flipped=draws[2].bool())
    return list(x.split(sizes))


# One draw in [0, (2·padding + 1)·2^24) per number gives draw_crop_flip's three (see
# draw_crop_flip_packed); torch's CPU randint takes one 32-bit number of the stream per value below
# a range of 2^28, so paddings up to 7 qualify.
_FLIP_BITS = 24
_ONE_CALL_RANGE = 1 << 28


@functools.cache
def _one_call_draws_agree() -> bool:
    """Whether this torch's CPU kernels give :func:`draw_crop_flip_packed`'s one-call draws the
    numbers and the stream positions of ``draw_crop_flip`` (checked once per process; the three
    calls are used otherwise)."""
    for padding in (0, 1, 4, 7):
        for size in (1, 3, 8):
            mine, theirs = torch.Generator().manual_seed(7 * size + padding), torch.Generator().manual_seed(7 * size + padding)
            got = _draw_one_call([size], [mine], padding)
            ref = draw_crop_flip(size, padding=padding, generator=theirs)
            if not (all(torch.equal(a.reshape(-1), b.long()) for a, b in zip(got, ref))
                    and torch.equal(mine.get_state(), theirs.get_state())):
                return False
    return True


def _draw_one_call(sizes: Sequence[int], generators: Sequence[torch.Generator], padding: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The one-call draws of equal ``sizes`` (:func:`draw_crop_flip_packed`), as ``[K, B]`` int64
    row offsets, column offsets and flips (0/1)."""
    k, b = len(sizes), sizes[0]
    hi = 2 * padding + 1
    raw = torch.empty(k, 3, b, dtype=torch.int64)
    for out, g in zip(raw.view(k, 3 * b).unbind(0), generators):
        torch.randint(0, hi << _FLIP_BITS, (3 * b,), generator=g, out=out)
    offsets = raw[:, :2].remainder(hi)
    flips = raw[:, 2].bitwise_and((1 << _FLIP_BITS) - 1).lt(1 << (_FLIP_BITS - 1)).long()
    return offsets[:, 0], offsets[:, 1], flips


def draw_crop_flip_packed(rows: torch.Tensor, sizes: Sequence[int], generators: Sequence[torch.Generator], *,
                          padding: int) -> torch.Tensor:
    """``[rows, top, left, flipped]`` as one ``[4, N]`` int64 tensor: the step's rows and the
    crops and flips :func:`~fednorm.data.transforms.draw_crop_flip_rows` draws for them, the same
    numbers from the same streams, left at the same positions.

    Where every client draws ``B`` rows and ``2·padding + 1 ≤ 15``, each client makes one call
    instead of three: ``draw_crop_flip``'s three calls (``randint(0, 2p+1)`` twice, ``rand``) each
    turn one 32-bit number ``v`` of the stream into a value, ``v mod (2p+1)`` and
    ``(v mod 2^24)·2^-24`` (< 0.5 exactly when ``v mod 2^24 < 2^23``), so ``3B`` draws of
    ``v mod ((2p+1)·2^24)`` (one number each, the range being under 2^28) give all three by two
    remainders. ``_one_call_draws_agree`` checks that against ``draw_crop_flip`` once per process."""
    n = len(rows)
    packed = torch.empty(4, n, dtype=torch.int64)
    packed[0] = rows
    equal = len(set(sizes)) == 1 and (2 * padding + 1) << _FLIP_BITS < _ONE_CALL_RANGE
    if equal and n and _one_call_draws_agree():
        top, left, flipped = _draw_one_call(sizes, generators, padding)
        k, b = len(sizes), sizes[0]
        packed[1].view(k, b).copy_(top)
        packed[2].view(k, b).copy_(left)
        packed[3].view(k, b).copy_(flipped)
        return packed
    top, left, flipped = draw_crop_flip_rows(sizes, generators, padding=padding)
    packed[1], packed[2], packed[3] = top, left, flipped
    return packed


class StepFeed:
    """The batches of one chunk's round (module docstring).

    Args:
        source: the training images, padded by ``padding`` when ``augment`` (:func:`crop_source`).
        train_y: the training labels (on the device).
        client_rows: each client's dataset rows (on the host).
        plans: each client's batch plan (positions into its rows, on the host).
        generators: each client's stream, which draws its crops and flips step by step.
        augment, padding, channels_last: the local spec's.
    """

    def __init__(self, source: torch.Tensor, train_y: torch.Tensor, client_rows: Sequence[torch.Tensor],
                 plans: Sequence[Sequence[torch.Tensor]], generators: Sequence[torch.Generator], *, augment: bool,
                 padding: int, channels_last: bool) -> None:
        self.source, self.train_y = source, train_y
        self.device = source.device
        self.generators = list(generators)
        self.augment, self.padding, self.channels_last = augment, padding if augment else 0, channels_last
        # each client's rows of every step, as views of one host tensor per client
        self.rows: list[list[torch.Tensor]] = []
        for ix, plan in zip(client_rows, plans):
            if not plan:
                self.rows.append([])
                continue
            flat = ix.index_select(0, torch.cat(list(plan)))
            self.rows.append(list(flat.split([len(b) for b in plan])))

    def batch(self, members: Sequence[int], t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step ``t``'s input of clients ``members`` (equal batch sizes) in the client layout,
        and their labels client after client."""
        parts = [self.rows[i][t] for i in members]
        rows = torch.cat(parts)
        if self.augment:
            packed = to_device(draw_crop_flip_packed(rows, [len(p) for p in parts], [self.generators[i] for i in members],
                                                     padding=self.padding), self.device)
            rows_d = packed[0]
            x = gather_client_batch(self.source, rows_d, len(members), padding=self.padding, top=packed[1], left=packed[2],
                                    flipped=packed[3].bool(), channels_last=self.channels_last)
        else:
            rows_d = to_device(rows, self.device)
            x = gather_client_batch(self.source, rows_d, len(members), channels_last=self.channels_last)
        return x, self.train_y.index_select(0, rows_d)
