"""Batched image transforms on tensors.

Federated simulations run many small clients, so per-sample PIL pipelines would dominate
the run time. These functions act on a whole batch at once with vectorized tensor ops (no
Python loop over samples) and take an explicit ``torch.Generator``, so augmentation is
reproducible per client and never touches the global RNG.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["normalize", "pixel_value", "random_crop_flip", "draw_crop_flip", "apply_crop_flip", "CropFlip",
           "draw_crop_flip_rows", "pad_for_crop", "gather_client_batch"]


def normalize(
    x: np.ndarray | Tensor, mean: Sequence[float], std: Sequence[float]
) -> Tensor:
    """Turn uint8 ``N×H×W×C`` images into float32 ``N×C×H×W``, standardized per channel.

    Computes ``(x / 255 - mean[c]) / std[c]``, the convention of torchvision's
    ``ToTensor`` followed by ``Normalize``, in one pass over the batch.

    Args:
        x: uint8 images, ``N×H×W×C`` (numpy array or tensor; a tensor keeps its device).
        mean: per-channel mean in [0, 1] units, length ``C``.
        std: per-channel standard deviation in [0, 1] units, length ``C``, all positive.

    Returns:
        A new contiguous float32 tensor of shape ``N×C×H×W``.

    Raises:
        TypeError: if ``x`` is not uint8.
        ValueError: if ``x`` is not 4-D or ``mean``/``std`` do not have ``C`` entries.
    """
    t = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x
    if not isinstance(t, Tensor):
        raise TypeError(f"normalize expects a numpy array or a tensor, got {type(x).__name__}")
    if t.dtype != torch.uint8:
        raise TypeError(f"normalize expects uint8 images, got dtype {t.dtype}")
    if t.dim() != 4:
        raise ValueError(f"normalize expects N×H×W×C input (4D), got {t.dim()}D input")
    channels = t.shape[-1]
    if len(mean) != channels or len(std) != channels:
        raise ValueError(
            f"mean and std need one value per channel ({channels}), got {len(mean)} and {len(std)}"
        )
    if any(s <= 0 for s in std):
        raise ValueError(f"std must be positive, got {tuple(std)}")
    std_t = torch.tensor(std, dtype=torch.float64)
    # Fold /255, -mean and /std into one scale and one shift (computed in float64) so the
    # float32 batch is touched by only two in-place ops.
    scale = (1.0 / (255.0 * std_t)).to(torch.float32).view(1, channels, 1, 1).to(t.device)
    shift = (torch.tensor(mean, dtype=torch.float64) / std_t).to(torch.float32)
    shift = shift.view(1, channels, 1, 1).to(t.device)
    n, h, w, _ = t.shape
    # One strided copy converts dtype and layout together, then two in-place passes.
    out = torch.empty((n, channels, h, w), dtype=torch.float32, device=t.device)
    out.copy_(t.permute(0, 3, 1, 2))
    return out.mul_(scale).sub_(shift)


def pixel_value(value: int, mean: Sequence[float], std: Sequence[float]) -> tuple[float, ...]:
    """What a pixel of ``value`` (0-255) in every channel becomes under :func:`normalize`,
    computed by it: ``pixel_value(0, mean, std)`` is black in the normalised tensors, the fill
    of a crop padded before normalisation (torchvision's ``RandomCrop`` ahead of ``Normalize``)."""
    pixel = torch.full((1, 1, 1, len(mean)), value, dtype=torch.uint8)
    return tuple(float(v) for v in normalize(pixel, mean, std).flatten())


def random_crop_flip(
    x: Tensor,
    *,
    padding: int = 4,
    flip: bool = True,
    generator: torch.Generator | None = None,
    fill: Sequence[float] | None = None,
) -> Tensor:
    """Pad, crop back to size at a random offset, and mirror half of the samples.

    The standard CIFAR training augmentation (torchvision's ``RandomCrop(H, padding)``
    plus ``RandomHorizontalFlip()``), applied to a whole batch with one gather: each
    sample gets its own crop offset in ``[0, 2·padding]²`` and its own flip with
    probability 0.5.

    Random numbers are drawn from ``generator`` (on its device) in a fixed order: the
    row offsets (``B`` draws), the column offsets (``B``), then, when ``flip``, ``B``
    uniforms. The same generator state therefore always gives the same output.

    Args:
        x: batch ``B×C×H×W`` of any floating or integer dtype.
        padding: padding added on every side before cropping (default: 4).
        flip: whether to flip horizontally with probability 0.5 (default: True).
        generator: source of randomness (default: the global generator).
        fill: the padding's value per channel (default: zero, which in standardised
            tensors is the normalisation's mean colour; ``pixel_value(0, mean, std)`` gives black).

    Returns:
        A new tensor with the shape, dtype and device of ``x``.

    Raises:
        ValueError: if ``x`` is not 4-D or ``padding`` is negative.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"random_crop_flip expects a tensor, got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"random_crop_flip expects B×C×H×W input (4D), got {x.dim()}D input")
    if padding < 0:
        raise ValueError(f"padding must be >= 0, got {padding}")
    b = x.shape[0]
    top, left, flipped = draw_crop_flip(b, padding=padding, flip=flip, generator=generator, device=x.device)
    return apply_crop_flip(x, top, left, flipped, padding=padding, fill=fill)


def draw_crop_flip(
    batch_size: int,
    *,
    padding: int = 4,
    flip: bool = True,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> tuple[Tensor, Tensor, Tensor]:
    """The random part of :func:`random_crop_flip`: row offsets, column offsets, flip flags.

    Split out so that a vectorized executor can draw each client's numbers from that
    client's own generator (the same numbers the sequential executor draws) and then apply
    all clients' crops in one gather.
    """
    rng_device = generator.device if generator is not None else torch.device(device)
    top = torch.randint(0, 2 * padding + 1, (batch_size,), generator=generator, device=rng_device)
    left = torch.randint(0, 2 * padding + 1, (batch_size,), generator=generator, device=rng_device)
    if flip:
        flipped = torch.rand(batch_size, generator=generator, device=rng_device) < 0.5
    else:
        flipped = torch.zeros(batch_size, dtype=torch.bool, device=rng_device)
    return top.to(device), left.to(device), flipped.to(device)


def apply_crop_flip(x: Tensor, top: Tensor, left: Tensor, flipped: Tensor, *, padding: int = 4,
                    fill: Sequence[float] | None = None) -> Tensor:
    """Crop each sample of ``x`` (``B×C×H×W``) at its offsets after padding (with zeros, or
    ``fill`` per channel), flipping where asked."""
    b, c, h, w = x.shape
    padded = pad_for_crop(x, padding, fill)
    wp = w + 2 * padding
    rows = top[:, None] + torch.arange(h, device=x.device)  # B×H
    col_steps = torch.arange(w, device=x.device)
    # A flipped sample reads its crop's columns right to left.
    cols = left[:, None] + torch.where(flipped[:, None], (w - 1) - col_steps, col_steps)  # B×W
    flat_index = (rows[:, :, None] * wp + cols[:, None, :]).view(b, 1, h * w)
    out = padded.reshape(b, c, (h + 2 * padding) * wp).gather(2, flat_index.expand(b, c, h * w))
    return out.view(b, c, h, w)


def draw_crop_flip_rows(sizes: Sequence[int], generators: Sequence[torch.Generator], *, padding: int = 4,
                        flip: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`draw_crop_flip` for several clients at once, on the host: client ``i`` draws its
    ``sizes[i]`` rows' offsets and flips from ``generators[i]`` (CPU generators) exactly as
    ``draw_crop_flip(sizes[i], padding=padding, flip=flip, generator=generators[i])`` does (the
    same calls on the same streams, in the same order), written into one buffer per quantity
    rather than concatenated: the row offsets, column offsets and flip flags of all rows, client
    after client."""
    n = sum(sizes)
    top = torch.empty(n, dtype=torch.int64)
    left = torch.empty(n, dtype=torch.int64)
    flipped = torch.zeros(n, dtype=torch.bool)
    uniform = torch.empty(n) if flip else None
    hi, start = 2 * padding + 1, 0
    for size, g in zip(sizes, generators):
        end = start + size
        torch.randint(0, hi, (size,), generator=g, out=top[start:end])
        torch.randint(0, hi, (size,), generator=g, out=left[start:end])
        if uniform is not None:
            torch.rand(size, generator=g, out=uniform[start:end])
        start = end
    if uniform is not None:
        torch.lt(uniform, 0.5, out=flipped)
    return top, left, flipped


def pad_for_crop(x: Tensor, padding: int, fill: Sequence[float] | None = None) -> Tensor:
    """``x`` (``N×C×H×W``) padded by ``padding`` on every side with zeros, or ``fill`` per channel:
    the source :func:`gather_client_batch` crops from, built once and kept beside the data (the
    padding :func:`apply_crop_flip` builds for every batch)."""
    if not padding:
        return x.contiguous()
    c = x.shape[1]
    padded = F.pad(x, (padding, padding, padding, padding))
    if fill is not None:
        if len(fill) != c:
            raise ValueError(f"fill needs one value per channel ({c}), got {len(fill)}")
        value = torch.tensor(list(fill), dtype=x.dtype, device=x.device).view(1, c, 1, 1)
        # the border only: the image inside is copied untouched
        padded[:, :, :padding, :] = value
        padded[:, :, -padding:, :] = value
        padded[:, :, :, :padding] = value
        padded[:, :, :, -padding:] = value
    return padded


@functools.lru_cache(maxsize=32)
def _line_offsets(device: torch.device, c: int, h: int, w: int, hp: int, wp: int, channels_last: bool
                  ) -> tuple[Tensor, Tensor]:
    """:func:`gather_client_batch`'s constants: each output line's offset from its sample's first
    line (channel·Hp·Wp + row·Wp), shaped ``[1, H, 1, C]`` (channels-last) or ``[1, 1, C, H]``, and
    the columns of a line read left to right and right to left, ``[2, W]``."""
    channel = torch.arange(c, device=device) * (hp * wp)
    row = torch.arange(h, device=device) * wp
    if channels_last:
        offsets = (channel.view(1, 1, 1, c) + row.view(1, h, 1, 1))
    else:
        offsets = (channel.view(1, 1, c, 1) + row.view(1, 1, 1, h))
    ar = torch.arange(w, device=device)
    return offsets, torch.stack([ar, (w - 1) - ar])


def gather_client_batch(source: Tensor, rows: Tensor, clients: int, *, padding: int = 0, top: Tensor | None = None,
                        left: Tensor | None = None, flipped: Tensor | None = None, channels_last: bool = False) -> Tensor:
    """One step's batch of ``clients`` clients in the stacked model's client layout.

    ``rows`` (``K·B``, client after client) are samples of ``source``, the training images padded
    by ``padding`` (:func:`pad_for_crop`; unpadded with ``padding=0``). With ``top``/``left``/
    ``flipped`` (one per row, from :func:`draw_crop_flip`), each row is cropped and flipped as
    :func:`apply_crop_flip` crops it; without them it is taken whole. The result is
    ``[B, K·C, H, W]``, what ``to_client_layout(x.view(K, B, C, H, W))`` gives for the per-row
    path's ``x`` (``channels_last``: in that memory format), with the same values bit for bit:
    every element is a copy. The indices are computed on ``source``'s device from the per-row
    numbers, so a step moves no image through the host.

    Each output line (one sample's channel's cropped row) is ``W`` consecutive elements of
    ``source`` starting at its crop's column, so the crop is one gather of whole lines from the
    windows of ``source`` (``unfold``: a view), then one gather along each line that reverses the
    flipped samples' lines, instead of an index per element. The lines are gathered in the order
    of the output's memory format, ``[B, K, C, H]`` (NCHW) or ``[B, H, K, C]`` (channels-last, then
    one transpose of each ``K·C × W`` block into ``[B, H, W, K·C]``). On one CPU thread, R = 10's
    400 CIFAR crops took about 3.6 ms channels-last and 1.9 ms NCHW this way, against 5.7 and 3.1 ms
    by an index per element (one run's 40: 0.37 and 0.25 ms, against 0.52 and 0.30)."""
    n, c, hp, wp = source.shape
    h, w = hp - 2 * padding, wp - 2 * padding
    b = len(rows) // clients
    dev = source.device
    r = rows.view(clients, b).t()  # [B, K]
    if top is None and not padding and not channels_last:  # whole rows, batch-major: already the client layout
        return source.index_select(0, r.reshape(-1)).view(b, clients * c, h, w)
    if channels_last and torch.empty(b, clients * c, h, w, device="meta").is_contiguous(memory_format=torch.channels_last):
        # one channel in all (or one pixel): the batch-major layout already counts as channels-last,
        # and ``contiguous(memory_format=torch.channels_last)`` keeps its strides, which the model's
        # kernels choose by; so must this path
        channels_last = False
    if not source.is_contiguous():  # the step's samples first, whole, so that their lines are windows of one buffer
        source, r = source.index_select(0, r.reshape(-1)), torch.arange(b * clients, device=dev).view(b, clients)
    if top is None:
        row0 = torch.full((b, clients), padding, dtype=torch.long, device=dev)
        col0 = row0
    else:
        assert left is not None and flipped is not None
        row0, col0 = top.view(clients, b).t(), left.view(clients, b).t()  # [B, K]
    # each line's first element in source: ((sample·C + channel)·Hp + row)·Wp + column
    first = (r * (c * hp) + row0) * wp + col0  # [B, K]: channel 0, the crop's first row
    offsets, columns = _line_offsets(dev, c, h, w, hp, wp, channels_last)
    if channels_last:  # lines ordered [B, H, K, C]
        starts = first.view(b, 1, clients, 1) + offsets
    else:  # lines ordered [B, K, C, H]
        starts = first.view(b, clients, 1, 1) + offsets
    windows = source.reshape(-1).unfold(0, w, 1)  # [numel - W + 1, W]: every run of W elements, a view
    lines = windows.index_select(0, starts.reshape(-1))  # one copy of W elements per line
    if top is not None:  # a flipped sample's lines read right to left
        cols = torch.where(flipped.view(clients, b).t().unsqueeze(-1), columns[1], columns[0])  # [B, K, W]
        if channels_last:
            lines = lines.view(b, h, clients, c, w).gather(4, cols.view(b, 1, clients, 1, w).expand(b, h, clients, c, w))
        else:
            lines = lines.view(b * clients, c * h, w).gather(2, cols.reshape(b * clients, 1, w).expand(b * clients, c * h, w))
    if not channels_last:
        return lines.view(b, clients * c, h, w)
    out = torch.empty(b, h, w, clients * c, dtype=source.dtype, device=dev)
    out.copy_(lines.view(b, h, clients * c, w).transpose(2, 3))
    return out.permute(0, 3, 1, 2)


@dataclass(frozen=True)
class CropFlip:
    """A run's training augmentation (random crop and flip), for passes a method makes over the
    training data that should see what training sees (HBN's reference-code statistics)."""

    padding: int = 4
    fill: tuple[float, ...] | None = None  # None: zero padding

    def __call__(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return random_crop_flip(x, padding=self.padding, generator=generator, fill=self.fill)
