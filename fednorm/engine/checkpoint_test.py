"""Tests of fednorm.engine.checkpoint: a realistic run state round-trips through weights_only
loading (int keys included), the previous checkpoint is kept, every kind of damaged file raises
CheckpointError naming it, load_latest falls back to the previous checkpoint with a warning, and
a crash at each step of a save leaves a loadable checkpoint and no partial checkpoint.pt."""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import fednorm
from fednorm.engine import checkpoint as ckpt
from fednorm.engine.checkpoint import (
    CHECKPOINT_NAME,
    CHECKPOINT_VERSION,
    PREVIOUS_NAME,
    CheckpointError,
    load_checkpoint,
    load_latest,
    save_checkpoint,
)


def _state(round_: int = 7, seed: int = 0) -> dict[str, Any]:
    """A run state as the simulator would save it: model, per-client bank keyed by int ids, RNG."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    model(torch.randn(5, 1, 8, 8))  # moves running stats and num_batches_tracked (int64)
    gen = torch.Generator().manual_seed(seed)
    return {
        "round": round_,
        "global_state": model.state_dict(),  # an OrderedDict of float32 and int64 tensors
        "bank": {  # per-client state, keyed by int client id
            0: {"bn.running_mean": torch.randn(4), "momentum": torch.zeros(3, dtype=torch.float64)},
            17: {"bn.running_mean": torch.randn(4), "momentum": None},
        },
        "rng": gen.get_state(),  # uint8 tensor
        "lr": 0.05 * 0.998**round_,
        "best": {"round": 5, "test_accuracy": 0.8125, "improved": True},
        "history": [{"round": r, "train_loss": 1.0 / r, "client_ids": [r % 3, 4]} for r in range(1, round_ + 1)],
        "config_yaml": "dataset: digits\nrounds: 30\n",
        "method_state": None,
        "shape": (2, 3),
        "huge_int": 2**70,
        "nan": float("nan"),
        "empty": {},
    }


def _assert_same(a: Any, b: Any, where: str = "state") -> None:
    """Deep equality with exact types: tensors by dtype and value, NaN equal to NaN, dict key types kept."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            _assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and a != a:
        assert b != b, where
    else:
        assert a == b, where


def _without_meta(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in ("version", "fednorm_version")}


def _tmp_files(run_dir: Path) -> list[Path]:
    return [p for p in run_dir.iterdir() if p.name not in (CHECKPOINT_NAME, PREVIOUS_NAME)]


# ------------------------------------------------------------------ saving and loading


def test_realistic_state_round_trips_with_weights_only_and_int_keys(tmp_path: Path) -> None:
    state = _state()
    path = save_checkpoint(tmp_path, state)
    assert path == tmp_path / CHECKPOINT_NAME
    data = load_checkpoint(path)
    assert data["version"] == CHECKPOINT_VERSION and data["fednorm_version"] == fednorm.__version__
    _assert_same(_without_meta(data), state)
    assert sorted(data["bank"]) == [0, 17] and all(type(k) is int for k in data["bank"])  # not "0", "17"
    # the file really is weights_only-loadable by plain torch, with no fednorm code involved
    raw = torch.load(path, weights_only=True)
    _assert_same(_without_meta(raw), state)


def test_loaded_model_state_restores_the_model(tmp_path: Path) -> None:
    state = _state()
    save_checkpoint(tmp_path, state)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    model.load_state_dict(load_latest(tmp_path)["global_state"])
    _assert_same(dict(model.state_dict()), dict(state["global_state"]))


def test_second_save_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    first, second = _state(round_=3, seed=1), _state(round_=4, seed=2)
    save_checkpoint(tmp_path, first)
    assert not (tmp_path / PREVIOUS_NAME).exists()
    save_checkpoint(tmp_path, second)
    _assert_same(_without_meta(load_checkpoint(tmp_path / CHECKPOINT_NAME)), second)
    _assert_same(_without_meta(load_checkpoint(tmp_path / PREVIOUS_NAME)), first)
    save_checkpoint(tmp_path, _state(round_=5))
    assert load_checkpoint(tmp_path / PREVIOUS_NAME)["round"] == 4  # the prev always trails by one save
    assert _tmp_files(tmp_path) == []


def test_save_creates_the_run_dir_and_removes_stale_temp_files(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "a"
    save_checkpoint(run_dir, {"round": 1})
    stale = run_dir / ".checkpoint.crashed.tmp"  # as left by a crash during torch.save
    stale.write_bytes(b"half a checkpoint")
    save_checkpoint(run_dir, {"round": 2})
    assert _tmp_files(run_dir) == []
    assert load_latest(run_dir)["round"] == 2


@pytest.mark.parametrize(
    "state, needle",
    [
        ({"x": np.zeros(3)}, "state['x']"),
        ({"bank": {3: {"m": np.float64(1.0)}}}, "state['bank'][3]['m']"),
        ({"h": [1, object()]}, "state['h'][1]"),
        ({"k": {(1, 2): 0}}, "key (1, 2)"),
        ({"p": Path("x")}, "state['p']"),
    ],
)
def test_state_that_weights_only_cannot_load_is_rejected_at_save(tmp_path: Path, state, needle) -> None:
    with pytest.raises(TypeError) as info:
        save_checkpoint(tmp_path, state)
    assert needle in str(info.value)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_reserved_keys_and_non_dict_state_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'version'"):
        save_checkpoint(tmp_path, {"version": 3})
    with pytest.raises(TypeError, match="must be a dict"):
        save_checkpoint(tmp_path, [1, 2])  # type: ignore[arg-type]


# ------------------------------------------------------------------ damaged files


def _write_truncated(path: Path) -> None:
    save_checkpoint(path.parent, _state())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _write_random(path: Path) -> None:
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())


def _write_empty(path: Path) -> None:
    path.write_bytes(b"")


def _write_torch_list(path: Path) -> None:
    torch.save([torch.ones(2), 3], path)


def _write_pickled_list(path: Path) -> None:
    path.write_bytes(pickle.dumps([1, 2, 3]))


def _write_pickled_object(path: Path) -> None:
    torch.save({"version": 1, "model": nn.Linear(2, 2)}, path)  # a whole module: refused by weights_only


def _write_no_version(path: Path) -> None:
    torch.save(nn.Linear(2, 2).state_dict(), path)  # a bare state_dict


def _write_newer_version(path: Path) -> None:
    torch.save({"version": CHECKPOINT_VERSION + 1, "fednorm_version": "9.0", "round": 1}, path)


def _write_bad_version(path: Path) -> None:
    torch.save({"version": "1", "round": 1}, path)


def _write_directory(path: Path) -> None:
    path.mkdir()


DAMAGE = {
    "truncated": (_write_truncated, "truncated"),
    "random_bytes": (_write_random, "could not be loaded"),
    "empty": (_write_empty, "empty"),
    "torch_list": (_write_torch_list, "holds a list"),
    "pickled_list": (_write_pickled_list, "could not be loaded"),
    "module_object": (_write_pickled_object, "objects other than tensors"),
    "no_version": (_write_no_version, "no 'version'"),
    "newer_version": (_write_newer_version, "Upgrade fednorm"),
    "bad_version": (_write_bad_version, "invalid version"),
    "directory": (_write_directory, "not a file"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_file_raises_checkpoint_error_naming_it(tmp_path: Path, kind: str) -> None:
    path = tmp_path / CHECKPOINT_NAME
    write, needle = DAMAGE[kind]
    write(path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert str(path) in message and needle in message, message
    assert len(message) < 800, "torch's multi-paragraph advice should not be quoted whole"


def test_missing_file_raises_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist") as info:
        load_checkpoint(tmp_path / "nope.pt")
    assert str(tmp_path / "nope.pt") in str(info.value)
    assert isinstance(info.value, RuntimeError)


# ------------------------------------------------------------------ load_latest


@pytest.mark.parametrize("kind", ["truncated", "random_bytes", "empty", "newer_version"])
def test_load_latest_falls_back_to_previous_with_warning(tmp_path: Path, kind: str) -> None:
    save_checkpoint(tmp_path, _state(round_=3))
    save_checkpoint(tmp_path, _state(round_=4))
    latest = tmp_path / CHECKPOINT_NAME
    latest.unlink()
    DAMAGE[kind][0](latest)
    with pytest.warns(UserWarning, match="previous checkpoint") as record:
        data = load_latest(tmp_path)
    assert data["round"] == 3
    assert str(latest) in str(record[0].message) and str(tmp_path / PREVIOUS_NAME) in str(record[0].message)
    assert record[0].filename == __file__  # stacklevel=2 points at the caller


def test_load_latest_uses_latest_without_warning(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _state(round_=3))
    save_checkpoint(tmp_path, _state(round_=4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_latest(tmp_path)["round"] == 4


def test_load_latest_with_only_previous_present_falls_back(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, {"round": 1})
    os.replace(tmp_path / CHECKPOINT_NAME, tmp_path / PREVIOUS_NAME)  # the crash window between renames
    with pytest.warns(UserWarning, match="does not exist"):
        assert load_latest(tmp_path)["round"] == 1


def test_load_latest_lists_both_problems_when_neither_loads(tmp_path: Path) -> None:
    _write_random(tmp_path / CHECKPOINT_NAME)
    _write_empty(tmp_path / PREVIOUS_NAME)
    with pytest.raises(CheckpointError) as info:
        load_latest(tmp_path)
    message = str(info.value)
    assert str(tmp_path / CHECKPOINT_NAME) in message and str(tmp_path / PREVIOUS_NAME) in message
    assert "empty" in message and "Restart the run" in message


@pytest.mark.parametrize("exists", [True, False])
def test_load_latest_without_any_checkpoint_explains(tmp_path: Path, exists: bool) -> None:
    run_dir = tmp_path if exists else tmp_path / "missing"
    with pytest.raises(CheckpointError) as info:
        load_latest(run_dir)
    message = str(info.value)
    assert f"no checkpoint in {run_dir}" in message and "checkpoint_every > 0" in message
    assert ("does not exist" in message) is not exists


# ------------------------------------------------------------------ crashes during a save


@pytest.mark.parametrize("fail_on_call", [1, 2])
def test_crash_at_either_rename_leaves_old_checkpoint_loadable(tmp_path: Path, monkeypatch, fail_on_call: int) -> None:
    """Call 1 moves checkpoint.pt to checkpoint.prev.pt, call 2 moves the new file onto checkpoint.pt."""
    old = _state(round_=3)
    save_checkpoint(tmp_path, old)
    real_replace = os.replace
    calls = []

    def crashing_replace(src, dst):
        calls.append((Path(src), Path(dst)))
        temps = [p for p in _tmp_files(tmp_path)]
        assert len(temps) == 1 and load_checkpoint(temps[0])["round"] == 4  # the new file is complete
        if len(calls) == fail_on_call:
            raise OSError("simulated crash")
        real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", crashing_replace)
    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(tmp_path, _state(round_=4))
    monkeypatch.setattr(ckpt.os, "replace", real_replace)

    latest = tmp_path / CHECKPOINT_NAME
    if fail_on_call == 1:  # nothing moved yet: checkpoint.pt is the old, complete file
        _assert_same(_without_meta(load_checkpoint(latest)), old)
    else:  # checkpoint.pt was moved away and never replaced: no partial file under its name
        assert not latest.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _assert_same(_without_meta(load_latest(tmp_path)), old)
    assert _tmp_files(tmp_path) == []  # the failed save cleaned up its temp file

    save_checkpoint(tmp_path, _state(round_=5))  # and the next save works normally
    assert load_latest(tmp_path)["round"] == 5


def test_crash_while_writing_leaves_old_checkpoint_untouched(tmp_path: Path, monkeypatch) -> None:
    save_checkpoint(tmp_path, {"round": 1})
    before = (tmp_path / CHECKPOINT_NAME).read_bytes()
    real_save = torch.save

    def half_save(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.torch, "save", half_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, {"round": 2})
    monkeypatch.setattr(ckpt.torch, "save", real_save)
    assert (tmp_path / CHECKPOINT_NAME).read_bytes() == before
    assert not (tmp_path / PREVIOUS_NAME).exists() and _tmp_files(tmp_path) == []
    assert load_latest(tmp_path)["round"] == 1


def test_new_file_is_fsynced_before_it_is_renamed(tmp_path: Path, monkeypatch) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(ckpt.os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(ckpt.os, "replace", lambda s, d: (events.append(f"replace->{Path(d).name}"), real_replace(s, d))[1])
    save_checkpoint(tmp_path, {"round": 1})
    save_checkpoint(tmp_path, {"round": 2})
    i = events.index(f"replace->{PREVIOUS_NAME}")  # second save: file fsync, both renames, then the dir
    assert events[i - 1 : i + 2] == ["fsync", f"replace->{PREVIOUS_NAME}", f"replace->{CHECKPOINT_NAME}"]
    if os.name == "posix":
        assert events[i + 2] == "fsync"
