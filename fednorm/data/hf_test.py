"""Hugging Face datasets on disk (``hf:<path>``) and Flower's partitioners (``flwr:<Name>``); the hf extra."""

from __future__ import annotations

import numpy as np
import pytest

datasets = pytest.importorskip("datasets")

from fednorm.cli.main import main  # noqa: E402
from fednorm.data.datasets import load_dataset  # noqa: E402
from fednorm.errors import PartitionError  # noqa: E402


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDNORM_CACHE", str(tmp_path / "cache"))
    from fednorm.data import cache

    monkeypatch.setattr(cache, "_MEMO", {})


@pytest.fixture()
def saved(tmp_path):
    """A three-class image dataset built here (no download), saved both ways."""
    from PIL import Image

    rng = np.random.default_rng(0)
    y = np.arange(60) % 3
    pixels = (rng.integers(0, 40, (60, 10, 10, 3)) + 70 * y[:, None, None, None]).astype(np.uint8)
    features = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(names=["ant", "bee", "cow"])})
    ds = datasets.Dataset.from_dict({"img": [Image.fromarray(p) for p in pixels], "label": y}, features=features)
    dd = datasets.DatasetDict({"train": ds.select(range(45)), "test": ds.select(range(45, 60))})
    dd.save_to_disk(str(tmp_path / "disk"))
    (tmp_path / "pq").mkdir()
    dd["train"].to_parquet(str(tmp_path / "pq" / "train-00000-of-00001.parquet"))
    dd["test"].to_parquet(str(tmp_path / "pq" / "test-00000-of-00001.parquet"))
    ds.select(range(45)).to_parquet(str(tmp_path / "pq_train_only.parquet"))
    (tmp_path / "one").mkdir()
    (tmp_path / "pq_train_only.parquet").rename(tmp_path / "one" / "data.parquet")
    return tmp_path, pixels, y


def test_save_to_disk_and_parquet_read_the_same_images(saved):
    root, pixels, y = saved
    for path in ("disk", "pq"):
        tr = load_dataset(f"hf:{root / path}", train=True)
        te = load_dataset(f"hf:{root / path}", train=False)
        assert np.array_equal(tr.data, pixels[:45]) and np.array_equal(tr.targets, y[:45])  # PNG is lossless
        assert np.array_equal(te.data, pixels[45:]) and tr.classes == ["ant", "bee", "cow"] and tr.info.num_classes == 3
    small = load_dataset(f"hf:{root / 'disk'}", image_size=6, channels=1)
    assert small.data.shape == (45, 6, 6, 1) and small.info.in_channels == 1
    one = load_dataset(f"hf:{root / 'one'}", train=False)  # no test split: stratified 80/20 of the 45
    assert len(one) == 9 and np.array_equal(np.bincount(one.targets), [3, 3, 3])


def test_flwr_partitioner_gives_flowers_split(saved):
    pytest.importorskip("flwr_datasets")
    from flwr_datasets.partitioner import DirichletPartitioner

    from fednorm.data.partition import partition

    labels = np.arange(600) % 10
    ours = partition("flwr:DirichletPartitioner", labels, 5, seed=3, alpha=0.3, min_size=1)
    theirs = DirichletPartitioner(num_partitions=5, partition_by="label", alpha=0.3, seed=3)
    theirs.dataset = datasets.Dataset.from_dict({"label": labels, "i": np.arange(600)})
    for i, part in enumerate(ours):
        assert np.array_equal(part, np.sort(theirs.load_partition(i)["i"]))
    assert sorted(np.concatenate(ours).tolist()) == list(range(600))
    assert [len(p) for p in partition("flwr:iid", labels, 4, seed=0)] == [150] * 4  # 'Partitioner' may be left out
    with pytest.raises(PartitionError, match="takes no option 'bogus'"):
        partition("flwr:IidPartitioner", labels, 4, seed=0, bogus=1)


def test_cli_runs_hf_data_with_a_flower_partition(saved, tmp_path, capsys):
    pytest.importorskip("flwr_datasets")
    root, _, _ = saved
    code = main(["run", "--dataset", f"hf:{root / 'disk'}", "--partition", "flwr:DirichletPartitioner",
                 "--partition-args", "{alpha: 1.0, min_partition_size: 2}", "--num-clients", "3", "--rounds", "1",
                 "--model", "simple_cnn", "--threads", "1", "--quiet", "--out", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "3 classes" in out and "flwr:DirichletPartitioner, 3 clients" in out
    code = main(["run", "--dataset", f"hf:{root / 'nowhere'}", "--rounds", "1", "--out", str(tmp_path / "r2")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "nowhere" in err and "save_to_disk" in err
