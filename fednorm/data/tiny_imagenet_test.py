"""Tiny-ImageNet's release layout on a small generated tree: labels, val annotations, errors, download."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from fednorm.data.datasets import load_dataset
from fednorm.data.tiny_imagenet import TinyImageNet
from fednorm.errors import DatasetError


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDNORM_CACHE", str(tmp_path / "cache"))
    from fednorm.data import cache

    monkeypatch.setattr(cache, "_MEMO", {})


def level(label: int) -> int:
    """The grey level the fake tree paints class ``label`` with: 40 apart, so JPEG's error cannot blur two."""
    return 20 + 40 * label


def write_fake_tiny_imagenet(root: Path, wnids: list[str], train_per_class: int, val_per_class: int, *,
                             encode: bool = True, seed: int = 0) -> Path:
    """The release layout under ``root/tiny-imagenet-200`` with 64×64 JPEGs.

    ``wnids.txt`` lists ``wnids`` as given (the release's order is not sorted); with ``encode``
    each image is one flat colour whose level is its class's index in ``sorted(wnids)``
    (:func:`level`; needs at most 6 classes), else random pixels. The val images ``val_<k>``
    hold the classes in a seeded random order, and ``val_annotations.txt`` labels them.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    base = root / "tiny-imagenet-200"
    (base / "val" / "images").mkdir(parents=True)
    (base / "wnids.txt").write_text("".join(f"{w}\n" for w in wnids))
    label = {w: i for i, w in enumerate(sorted(wnids))}

    def image(w: str) -> Image.Image:
        if encode:
            return Image.fromarray(np.full((64, 64, 3), level(label[w]), np.uint8))
        return Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))

    for w in wnids:
        folder = base / "train" / w / "images"
        folder.mkdir(parents=True)
        (base / "train" / w / f"{w}_boxes.txt").write_text("")
        for k in range(train_per_class):
            image(w).save(folder / f"{w}_{k}.JPEG", format="JPEG", quality=95)
    lines = []
    order = np.random.default_rng(seed + 1).permutation(np.repeat(wnids, val_per_class))
    for k, w in enumerate(order):
        image(w).save(base / "val" / "images" / f"val_{k}.JPEG", format="JPEG", quality=95)
        lines.append(f"val_{k}.JPEG\t{w}\t0\t0\t63\t63\n")
    (base / "val" / "val_annotations.txt").write_text("".join(lines))
    return base


WNIDS = ["n09999999", "n01443537", "n04067472"]  # not sorted, as in the release


def decoded_label(images: np.ndarray) -> np.ndarray:
    """The class each flat-colour image encodes (its mean level, inverted :func:`level`)."""
    return np.rint((images.reshape(len(images), -1).mean(axis=1) - 20) / 40).astype(np.int64)


def test_labels_follow_sorted_wnids_and_match_each_image(tmp_path: Path) -> None:
    write_fake_tiny_imagenet(tmp_path, WNIDS, train_per_class=4, val_per_class=2)
    train = load_dataset("tiny_imagenet", tmp_path, train=True)
    assert train.data.shape == (12, 64, 64, 3) and train.data.dtype == np.uint8
    assert train.targets.dtype == np.int64
    np.testing.assert_array_equal(np.bincount(train.targets), [4, 4, 4])
    # every image's painted class is its label: the label is its wnid's index in sorted(wnids.txt)
    np.testing.assert_array_equal(decoded_label(train.data), train.targets)
    assert train.classes == sorted(WNIDS) and train.source.layout == "folder"


def test_val_split_is_labelled_by_the_annotations(tmp_path: Path) -> None:
    base = write_fake_tiny_imagenet(tmp_path, WNIDS, train_per_class=1, val_per_class=3)
    test = TinyImageNet(tmp_path, train=False)
    assert len(test) == 9
    np.testing.assert_array_equal(decoded_label(test.data), test.targets)
    lines = (base / "val" / "val_annotations.txt").read_text().splitlines()
    expected = [sorted(WNIDS).index(line.split("\t")[1]) for line in lines]
    np.testing.assert_array_equal(test.targets, expected)  # in the annotations' order
    # an image in val/images that no annotation names is not read
    shutil.copy(base / "val" / "images" / "val_0.JPEG", base / "val" / "images" / "stray.JPEG")
    assert len(TinyImageNet(tmp_path, train=False)) == 9


def test_relabelling_an_annotation_changes_that_label(tmp_path: Path) -> None:
    """The annotation, not the image, decides a val label."""
    base = write_fake_tiny_imagenet(tmp_path, WNIDS, train_per_class=1, val_per_class=1)
    ann = base / "val" / "val_annotations.txt"
    first, *rest = ann.read_text().splitlines(keepends=True)
    name, wnid, *box = first.rstrip("\n").split("\t")
    other = next(w for w in WNIDS if w != wnid)
    ann.write_text("\t".join([name, other, *box]) + "\n" + "".join(rest))
    test = TinyImageNet(tmp_path, train=False)
    assert test.targets[0] == sorted(WNIDS).index(other) != decoded_label(test.data[:1])[0]
    np.testing.assert_array_equal(decoded_label(test.data[1:]), test.targets[1:])


def test_greyscale_jpegs_become_rgb(tmp_path: Path) -> None:
    from PIL import Image

    base = write_fake_tiny_imagenet(tmp_path, WNIDS, train_per_class=2, val_per_class=1)
    grey = base / "train" / WNIDS[1] / "images" / f"{WNIDS[1]}_0.JPEG"
    Image.fromarray(np.full((64, 64), level(0), np.uint8), mode="L").save(grey, format="JPEG")
    train = TinyImageNet(tmp_path)
    assert train.data.shape == (6, 64, 64, 3)
    np.testing.assert_array_equal(decoded_label(train.data), train.targets)


def test_inconsistent_files_name_the_problem(tmp_path: Path) -> None:
    base = write_fake_tiny_imagenet(tmp_path, WNIDS, train_per_class=1, val_per_class=1)
    ann = base / "val" / "val_annotations.txt"
    ann.write_text(ann.read_text() + "val_99.JPEG\tn01443537\t0\t0\t1\t1\n")
    with pytest.raises(DatasetError, match="val_99.JPEG"):
        TinyImageNet(tmp_path, train=False)
    ann.write_text("val_0.JPEG\tn00000001\t0\t0\t1\t1\n")
    with pytest.raises(DatasetError, match="n00000001"):
        TinyImageNet(tmp_path, train=False)
    (base / "train" / "n12345678").mkdir()
    with pytest.raises(DatasetError, match="n12345678"):
        TinyImageNet(tmp_path)


def test_missing_files_say_where_to_put_them(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="wnids.txt") as info:
        load_dataset("tiny_imagenet", tmp_path, train=False)
    assert "val_annotations.txt" in str(info.value) and "tiny_imagenet_test" in str(info.value)


def test_npz_layout_is_read_when_the_release_is_absent(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (6, 64, 64, 3), dtype=np.uint8)
    y = np.array([0, 199, 5, 5, 1, 2])
    np.savez(tmp_path / "tiny_imagenet_train.npz", x=x, y=y)
    ds = TinyImageNet(tmp_path)
    assert ds.source.layout == "npz_split"
    np.testing.assert_array_equal(ds.data, x)
    np.testing.assert_array_equal(ds.targets, y)


def test_download_unpacks_the_zip_after_its_md5_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """download() against a local mirror serving a zip of the fake tree; a changed byte is refused."""
    src = tmp_path / "src"
    write_fake_tiny_imagenet(src, WNIDS, train_per_class=2, val_per_class=1)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    archive = Path(shutil.make_archive(str(mirror / "tiny-imagenet-200"), "zip", src))
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    monkeypatch.setattr(TinyImageNet, "mirrors", [mirror.as_uri() + "/"])
    monkeypatch.setattr(TinyImageNet, "resources", [("tiny-imagenet-200.zip", md5)])
    root = tmp_path / "data"
    ds = TinyImageNet(root, train=False, download=True)
    assert len(ds) == 3 and (root / "tiny-imagenet-200" / "wnids.txt").is_file()
    np.testing.assert_array_equal(decoded_label(ds.data), ds.targets)
    # a corrupted archive fails its md5 check and nothing is unpacked
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive.write_bytes(bytes(data))
    with pytest.raises(DatasetError):
        TinyImageNet(tmp_path / "other", train=True, download=True)
    assert not (tmp_path / "other" / "tiny-imagenet-200").exists()
