"""Small fake trees of the image-folder benchmarks (Office-Caltech10, DomainNet) in the layout their
loaders read (fednorm/data/presets.py): ``<base>/<domain>/<class>/<i>.png``, random colours whose
brightness follows the class, so a config for data that is not here trains on files it names."""

from __future__ import annotations

from pathlib import Path

import numpy as np

OFFICE_DOMAINS = ["amazon", "caltech", "dslr", "webcam"]
OFFICE_CLASSES = ["back_pack", "bike", "calculator", "headphones", "keyboard", "laptop_computer", "monitor", "mouse", "mug",
                  "projector"]
DOMAINNET_DOMAINS = ["clipart", "infograph", "painting", "quickdraw", "real", "sketch"]
DOMAINNET_CLASSES = ["bird", "feather", "headphones", "ice_cream", "teapot", "tiger", "whale", "windmill", "wine_glass", "zebra"]


def _folders(base: Path, domains: list[str], classes: list[str], per_class: int, size: int = 12) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for d, domain in enumerate(domains):
        for c, name in enumerate(classes):
            folder = base / domain / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                img = (rng.integers(0, 40, (size, size, 3)) + 20 * c + 10 * d).clip(0, 255).astype(np.uint8)
                Image.fromarray(img).save(folder / f"{i}.png")


def fake_office_caltech10(root: Path) -> None:
    """office_caltech_10/<domain>/<class>/*.png: 5 images per class and domain (a stratified 4/1 train/test split)."""
    _folders(root / "office_caltech_10", OFFICE_DOMAINS, OFFICE_CLASSES, per_class=5)


def fake_domainnet(root: Path) -> None:
    """domainnet/<domain>/<class>/*.png: 5 images per class and domain (no split lists: a stratified 4/1 split)."""
    _folders(root / "domainnet", DOMAINNET_DOMAINS, DOMAINNET_CLASSES, per_class=5)
