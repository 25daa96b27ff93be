"""Tiny-ImageNet-200 (Le & Yang, 2015) in its release layout, or as npz.

The HBN paper's third benchmark (Chen et al., 2025, Table 1 and Table 10: ResNet-18, B = 64) and
the LN paper's (Zhang et al., 2024, Table 1). The release (``tiny-imagenet-200.zip``) unpacks to::

    tiny-imagenet-200/
      wnids.txt                          # the 200 WordNet ids, one a line
      train/<wnid>/images/<wnid>_<k>.JPEG   # 500 per class, 64×64
      val/val_annotations.txt            # "<file>\\t<wnid>\\t<x0>\\t<y0>\\t<x1>\\t<y1>" per image
      val/images/val_<k>.JPEG            # 10,000 (50 per class)
      test/images/test_<k>.JPEG          # unlabelled: not read

The labelled ``val`` split serves as the test split, as both papers use it. Labels index the
wnids in sorted order, which is what ``torchvision.datasets.ImageFolder`` gives on ``train/``
(the class index of the released FL code that reads it so). Decoded arrays are cached
(:mod:`fednorm.data.cache`), so the 110,000 JPEGs are decoded once.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np

from ..errors import DatasetError
from .base import DatasetInfo, ImageDataset, _Found, register_dataset
from .cache import cached_arrays, fingerprint
from .download import extract_archive
from .readers import IMAGE_SUFFIXES, decode_images

__all__ = ["TinyImageNet", "read_wnids", "read_val_annotations"]


def read_wnids(path: Path) -> list[str]:
    """The class ids of ``wnids.txt`` (one a line, blank lines ignored), sorted; duplicates are an error."""
    try:
        wnids = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"Could not read {path}: {exc}") from exc
    if not wnids:
        raise DatasetError(f"{path} lists no class ids; it should hold the 200 wnids, one a line")
    dup = sorted({w for w in wnids if wnids.count(w) > 1})
    if dup:
        raise DatasetError(f"{path} lists the class id(s) {', '.join(dup)} more than once")
    return sorted(wnids)


def read_val_annotations(path: Path) -> list[tuple[str, str]]:
    """``(file name, wnid)`` of every line of ``val_annotations.txt`` (tab-separated; the box is ignored)."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"Could not read {path}: {exc}") from exc
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        fields = line.split("\t") if "\t" in line else line.split()
        if len(fields) < 2:
            raise DatasetError(f"{path}, line {i}: expected '<file>\\t<wnid>\\t<box>', got {line!r}")
        out.append((fields[0].strip(), fields[1].strip()))
    return out


@register_dataset("tiny_imagenet")
class TinyImageNet(ImageDataset):
    """Tiny-ImageNet-200: 100,000 train / 10,000 val colour images, 64×64, 200 classes.

    Reads the release layout under ``root/tiny-imagenet-200`` (module docstring): the training
    split from ``train/<wnid>/images/*``, the test split from the ``val`` images labelled by
    ``val/val_annotations.txt``; otherwise the npz layout in ``root``
    (``tiny_imagenet_{train,test}*.npz``, ``x`` uint8 N×64×64×3 and ``y``). ``download()``
    fetches and unpacks the release zip (md5-checked). Greyscale JPEGs (a few in the release)
    become RGB. Every ``wnids.txt`` entry is a class; a class folder or annotation outside it is
    an error, since its label would be undefined.

    ``mean``/``std`` are the widely quoted training-set figures (not recomputed here); HBN's
    code normalises with 0.5/0.5 instead (pass ``input_norm``).
    """

    base_folder: ClassVar[str] = "tiny-imagenet-200"
    resources = [("tiny-imagenet-200.zip", "90528d7ca1a48142e341f4ef8d21d0de")]
    mirrors = ["http://cs231n.stanford.edu/"]
    npz_prefix: ClassVar[str] = "tiny_imagenet"
    info = DatasetInfo(
        name="tiny_imagenet",
        num_classes=200,
        in_channels=3,
        image_size=(64, 64),
        mean=(0.4802, 0.4481, 0.3975),
        std=(0.2770, 0.2691, 0.2821),
        augment=False,  # HBN's released code trains Tiny-ImageNet without augmentation (Normalize(0.5, 0.5) only)
    )

    @property
    def folder(self) -> Path:
        assert self.root is not None
        return self.root / self.base_folder

    def _locate(self) -> tuple[_Found | None, list[str]]:
        folder = self.folder
        wnids = folder / "wnids.txt"
        if not wnids.is_file():
            return None, [f"no {wnids}"] if folder.is_dir() else []
        if self.train:
            split = folder / "train"
            return (_Found("folder", (wnids, split)), []) if split.is_dir() else (None, [f"no folder {split}"])
        ann, images = folder / "val" / "val_annotations.txt", folder / "val" / "images"
        missing = [str(p) for p in (ann, images) if not p.exists()]
        return (None, [f"no {' and no '.join(missing)}"]) if missing else (_Found("folder", (wnids, ann, images)), [])

    def _files(self, found: _Found) -> tuple[list[Path], np.ndarray]:
        """This split's image files and labels, in a fixed order (class by class for train)."""
        wnids = read_wnids(found.paths[0])
        index = {w: i for i, w in enumerate(wnids)}
        files: list[Path] = []
        labels: list[int] = []
        if self.train:
            train = found.paths[1]
            unknown = sorted(p.name for p in train.iterdir() if p.is_dir() and p.name not in index)
            if unknown:
                raise DatasetError(f"{train} has class folders not in {found.paths[0]}: {', '.join(unknown[:5])}")
            for w in wnids:
                images = train / w / "images"
                got = sorted(f for f in images.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES) if images.is_dir() else []
                files += got
                labels += [index[w]] * len(got)
        else:
            ann, images = found.paths[1], found.paths[2]
            for name, w in read_val_annotations(ann):
                if w not in index:
                    raise DatasetError(f"{ann} labels {name} with '{w}', which {found.paths[0]} does not list")
                path = images / name
                if not path.is_file():
                    raise DatasetError(f"{ann} names {name}, which is not in {images}")
                files.append(path)
                labels.append(index[w])
        if not files:
            raise DatasetError(f"No images found for the {'train' if self.train else 'val'} split under {self.folder}")
        return files, np.asarray(labels, dtype=np.int64)

    def _load(self, found: _Found) -> tuple[np.ndarray, np.ndarray]:
        self.classes = read_wnids(found.paths[0])  # the class names are the release's wnids, in label order
        files, labels = self._files(found)
        split = "train" if self.train else "val"
        key = fingerprint(found.paths, {"reader": "tiny_imagenet", "split": split})

        def build() -> dict[str, np.ndarray]:
            return {"x": decode_images(files, found.paths[1], mode="RGB", size=None), "y": labels}

        z = cached_arrays(f"tiny_imagenet_{split}", key, build)
        return z["x"], z["y"]

    def _after_download(self) -> None:
        extract_archive(self.download_folder / self.resources[0][0], self.download_folder)

    def _advice(self) -> str:
        return (
            f"You can use download=True to download it, or unpack {self.resources[0][0]} in {self.root} so that "
            f"{self.folder} holds wnids.txt, train/<wnid>/images/*.JPEG and val/val_annotations.txt + val/images/*.JPEG; "
            f"or put {self.npz_prefix}_{'train' if self.train else 'test'}*.npz in {self.root}."
        )
