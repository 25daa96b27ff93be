"""Feature-shifted digit domains generated from MNIST, USPS and CIFAR-10 (an offline Digits-5).

FedBN's Digits benchmark (Li et al., 2021, Sec. 5.1) has five sources of the same ten digits:
MNIST, SVHN, USPS, SynthDigits and MNIST-M, all as 28×28×3. Only MNIST, USPS and CIFAR-10 are
available offline, so this module builds five domains that reproduce the *kinds* of shift in
Digits-5 — same P(y|x), different P(x):

========== ==================================================================================
``mnist``  MNIST, grey copied to 3 channels (as FedBN's code).
``usps``   USPS, 16×16 resized to 28×28 (bilinear), grey to 3 channels.
``synth``  SynthDigits-style: digits printed with the machine's TrueType fonts (or PIL's
           bitmap font), random size, stroke, rotation, offset, colours and distracting
           neighbour digits, light noise.
``mnistm`` MNIST-M-style (Ganin & Lempitsky 2015): ``|patch − digit|`` per channel, with the
           patch a random 28×28 crop of a CIFAR-10 image.
``colour`` colour / contrast / inversion shift of MNIST: random foreground and background
           colours at reduced contrast, half of the images inverted, a random gamma.
========== ==================================================================================

Every domain has the same number of samples, as the paper equalises them: 7,438 train (the
paper's 100 %, USPS's 80 % split) and 1,860 test. Train images of ``mnistm``/``colour``/``mnist``
come from disjoint subsets of MNIST's training set (test images from MNIST's test set), and
MNIST-M training patches from CIFAR-10 train (test patches from CIFAR-10 test), so no image is
shared between splits or domains. Generation is seeded, takes a few seconds and is cached as an
``.npz`` (see :func:`generate_digits_domains`).
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import DatasetError
from .base import _stratified_split

__all__ = ["DOMAIN_NAMES", "GENERATOR_VERSION", "generate_digits_domains", "render_digits", "to_rgb28", "find_fonts"]

DOMAIN_NAMES = ("mnist", "usps", "synth", "mnistm", "colour")
GENERATOR_VERSION = 1
TRAIN_PER_DOMAIN = 7438  # FedBN: 80 % of USPS (9,298) = the smallest domain's train set
TEST_PER_DOMAIN = 1860  # FedBN: USPS's 20 % hold-out


def to_rgb28(images: np.ndarray) -> np.ndarray:
    """uint8 ``N×H×W×1`` or ``N×H×W×3`` images as ``N×28×28×3`` (bilinear resize, grey replicated)."""
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).to(torch.float32)
    if x.shape[-2:] != (28, 28):
        x = F.interpolate(x, size=(28, 28), mode="bilinear", align_corners=False, antialias=x.shape[-1] > 28)
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()


def find_fonts(folders: tuple[str, ...] = ("/usr/share/fonts", "/usr/local/share/fonts", "~/.fonts")) -> list[str]:
    """TrueType/OpenType font files on this machine, sorted (empty when there are none)."""
    found: list[str] = []
    for folder in folders:
        root = Path(folder).expanduser()
        if root.is_dir():
            found += [str(p) for p in root.rglob("*") if p.suffix.lower() in (".ttf", ".otf")]
    return sorted(found)


def _contrasting_colours(rng: np.random.Generator, n: int, min_gap: float) -> tuple[np.ndarray, np.ndarray]:
    """Foreground/background RGB pairs (floats in [0, 255]) whose luminance differs by ``min_gap``."""
    fg = rng.uniform(0, 255, size=(n, 3))
    bg = rng.uniform(0, 255, size=(n, 3))
    lum = np.array([0.299, 0.587, 0.114])
    for _ in range(20):  # bounded: a failing pair gets a redrawn background, then is forced
        bad = np.abs((fg - bg) @ lum) < min_gap
        if not bad.any():
            break
        bg[bad] = rng.uniform(0, 255, size=(int(bad.sum()), 3))
    bad = np.abs((fg - bg) @ lum) < min_gap
    bg[bad] = np.where((fg[bad] @ lum)[:, None] > 127, 0.0, 255.0)
    return fg, bg


def render_digits(labels: np.ndarray, seed: int, fonts: list[str] | None = None) -> np.ndarray:
    """SynthDigits-style images of ``labels``: ``N×28×28×3`` uint8.

    Each image is a 40×40 canvas with the label digit at the centre and, often, parts of other
    digits beside it (SynthDigits and SVHN crops show neighbours), rendered in a random font,
    size, stroke and rotation, then cropped to 32×32 around a jittered centre and resized to 28.
    Colours are a random foreground/background pair of distinct luminance; Gaussian noise is
    added. Uses PIL's default bitmap font when the machine has no TrueType font.
    """
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    fonts = find_fonts() if fonts is None else fonts
    n = len(labels)
    fg, bg = _contrasting_colours(rng, n, min_gap=60.0)
    cache: dict[tuple[str, int], object] = {}

    def font(path: str | None, size: int):  # noqa: ANN202 - PIL font types vary
        key = (path or "", size)
        if key not in cache:
            cache[key] = ImageFont.truetype(path, size) if path else ImageFont.load_default()
        return cache[key]

    out = np.empty((n, 32, 32, 3), dtype=np.uint8)
    for i in range(n):
        path = fonts[rng.integers(len(fonts))] if fonts else None
        size = int(rng.integers(18, 27))
        stroke = int(rng.integers(0, 2))
        canvas = Image.new("L", (48, 40), 0)
        draw = ImageDraw.Draw(canvas)
        f = font(path, size)
        text = str(int(labels[i]))
        neighbours = rng.random() < 0.6
        if neighbours:
            text = f"{rng.integers(10)}{text}{rng.integers(10)}"
        box = draw.textbbox((0, 0), text, font=f, stroke_width=stroke)
        w, h = box[2] - box[0], box[3] - box[1]
        draw.text(((48 - w) / 2 - box[0], (40 - h) / 2 - box[1]), text, fill=255, font=f, stroke_width=stroke)
        if not path:  # the bitmap font is tiny: scale it up to a digit-sized glyph
            canvas = canvas.resize((96, 80), Image.BILINEAR).crop((24, 20, 72, 60))
        canvas = canvas.rotate(float(rng.uniform(-15, 15)), resample=Image.BILINEAR)
        dx, dy = rng.integers(-3, 4, size=2)
        left, top = 8 + int(dx), 4 + int(dy)
        mask = np.asarray(canvas.crop((left, top, left + 32, top + 32)), dtype=np.float32) / 255.0
        img = bg[i] * (1 - mask[..., None]) + fg[i] * mask[..., None]
        img += rng.normal(0, 6.0, size=img.shape)
        out[i] = np.clip(np.round(img), 0, 255).astype(np.uint8)
    return to_rgb28(out)


def blend_mnistm(digits: np.ndarray, backgrounds: np.ndarray, seed: int) -> np.ndarray:
    """MNIST-M-style images: ``|patch − digit|`` per channel, with ``patch`` a random 28×28 crop
    of a random ``backgrounds`` image (Ganin & Lempitsky 2015, §5). ``digits``: ``N×28×28×1``."""
    rng = np.random.default_rng(seed)
    n = len(digits)
    src = rng.integers(len(backgrounds), size=n)
    hb, wb = backgrounds.shape[1:3]
    oy = rng.integers(hb - 28 + 1, size=n)
    ox = rng.integers(wb - 28 + 1, size=n)
    rows = oy[:, None] + np.arange(28)[None, :]
    cols = ox[:, None] + np.arange(28)[None, :]
    patches = backgrounds[src[:, None, None], rows[:, :, None], cols[:, None, :]].astype(np.int16)
    d = digits.astype(np.int16)
    return np.abs(patches - d).astype(np.uint8)


def colour_shift(digits: np.ndarray, seed: int) -> np.ndarray:
    """Colour, contrast and inversion shift of grey ``N×28×28×1`` digits: a random
    foreground/background pair of reduced contrast, half the images inverted, gamma in [0.5, 2]."""
    rng = np.random.default_rng(seed)
    n = len(digits)
    fg, bg = _contrasting_colours(rng, n, min_gap=40.0)
    contrast = rng.uniform(0.35, 0.8, size=(n, 1))
    mid = (fg + bg) / 2
    fg, bg = mid + (fg - mid) * contrast, mid + (bg - mid) * contrast
    m = digits.astype(np.float32) / 255.0
    invert = rng.random(n) < 0.5
    m[invert] = 1.0 - m[invert]
    gamma = np.exp(rng.uniform(math.log(0.5), math.log(2.0), size=n)).astype(np.float32)
    m = m ** gamma[:, None, None, None]
    img = bg[:, None, None, :] * (1 - m) + fg[:, None, None, :] * m
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def _take(rng: np.random.Generator, pool: np.ndarray, n: int, used: np.ndarray | None = None) -> np.ndarray:
    """``n`` indices of ``pool`` drawn without replacement, avoiding ``used``; sorted."""
    candidates = np.arange(len(pool)) if used is None else np.setdiff1d(np.arange(len(pool)), used)
    if n > len(candidates):
        raise DatasetError(f"need {n} source images, only {len(candidates)} available")
    return np.sort(rng.choice(candidates, size=n, replace=False))


def _stratified_8020(targets: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    return _stratified_split(targets, 0.2, seed)


def generate_digits_domains(
    load: Callable[[str, bool], tuple[np.ndarray, np.ndarray]],
    *,
    seed: int = 0,
    train_per_domain: int = TRAIN_PER_DOMAIN,
    test_per_domain: int = TEST_PER_DOMAIN,
    fonts: list[str] | None = None,
) -> dict[str, np.ndarray]:
    """Build the five domains.

    Args:
        load: ``load(name, train) -> (x uint8 N×H×W×C, y int64)`` for ``"mnist"``, ``"usps"``
            and ``"cifar10"`` (the registry loaders, or arrays in tests).
        seed: seed of every draw (sample choice, colours, fonts, crops).
        train_per_domain, test_per_domain: samples per domain and split.
        fonts: font files for ``synth`` (default: :func:`find_fonts`).

    Returns:
        ``x_train`` (``5·n×28×28×3`` uint8), ``y_train``, ``d_train`` (domain index per sample,
        in :data:`DOMAIN_NAMES` order), the same for ``test``, and ``domain_names``.
    """
    rng = np.random.default_rng(seed)
    mx_tr, my_tr = load("mnist", True)
    mx_te, my_te = load("mnist", False)
    ux = np.concatenate([load("usps", True)[0], load("usps", False)[0]])
    uy = np.concatenate([load("usps", True)[1], load("usps", False)[1]])
    cx_tr, _ = load("cifar10", True)
    cx_te, _ = load("cifar10", False)
    ntr, nte = train_per_domain, test_per_domain

    # MNIST-derived domains use disjoint MNIST images.
    used_tr = np.empty(0, np.int64)
    used_te = np.empty(0, np.int64)
    mnist_tr, mnist_te = {}, {}
    for name in ("mnist", "mnistm", "colour"):
        mnist_tr[name] = _take(rng, mx_tr, ntr, used_tr)
        mnist_te[name] = _take(rng, mx_te, nte, used_te)
        used_tr = np.concatenate([used_tr, mnist_tr[name]])
        used_te = np.concatenate([used_te, mnist_te[name]])

    # USPS: pool train+test and split 80/20 stratified, as FedBN's preprocessing does.
    u_tr, u_te = _stratified_8020(uy, seed)
    u_tr = np.sort(rng.choice(u_tr, size=min(ntr, len(u_tr)), replace=False))
    u_te = np.sort(rng.choice(u_te, size=min(nte, len(u_te)), replace=False))
    if len(u_tr) < ntr or len(u_te) < nte:
        raise DatasetError(f"USPS has {len(uy)} images; need {ntr} train + {nte} test for equal domains")

    # Synth: balanced labels drawn at random.
    syn_y_tr = rng.integers(0, 10, size=ntr)
    syn_y_te = rng.integers(0, 10, size=nte)
    sub = lambda: int(rng.integers(2**31))  # noqa: E731 - one derived seed per generator call

    x_train = [
        to_rgb28(mx_tr[mnist_tr["mnist"]]),
        to_rgb28(ux[u_tr]),
        render_digits(syn_y_tr, sub(), fonts),
        blend_mnistm(mx_tr[mnist_tr["mnistm"]], cx_tr, sub()),
        colour_shift(mx_tr[mnist_tr["colour"]], sub()),
    ]
    y_train = [my_tr[mnist_tr["mnist"]], uy[u_tr], syn_y_tr, my_tr[mnist_tr["mnistm"]], my_tr[mnist_tr["colour"]]]
    x_test = [
        to_rgb28(mx_te[mnist_te["mnist"]]),
        to_rgb28(ux[u_te]),
        render_digits(syn_y_te, sub(), fonts),
        blend_mnistm(mx_te[mnist_te["mnistm"]], cx_te, sub()),
        colour_shift(mx_te[mnist_te["colour"]], sub()),
    ]
    y_test = [my_te[mnist_te["mnist"]], uy[u_te], syn_y_te, my_te[mnist_te["mnistm"]], my_te[mnist_te["colour"]]]
    return {
        "x_train": np.concatenate(x_train),
        "y_train": np.concatenate(y_train).astype(np.int64),
        "d_train": np.repeat(np.arange(len(DOMAIN_NAMES)), [len(y) for y in y_train]).astype(np.int64),
        "x_test": np.concatenate(x_test),
        "y_test": np.concatenate(y_test).astype(np.int64),
        "d_test": np.repeat(np.arange(len(DOMAIN_NAMES)), [len(y) for y in y_test]).astype(np.int64),
        "domain_names": np.array(DOMAIN_NAMES),
    }


def cache_key(seed: int, fonts: list[str]) -> str:
    """Names the cached file after everything that changes its content."""
    h = hashlib.sha256(f"v{GENERATOR_VERSION}|{seed}|{TRAIN_PER_DOMAIN}|{TEST_PER_DOMAIN}|{'|'.join(os.path.basename(f) for f in fonts)}".encode())
    return f"digits_domains_v{GENERATOR_VERSION}_s{seed}_{h.hexdigest()[:10]}.npz"
