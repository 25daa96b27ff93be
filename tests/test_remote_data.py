"""tools/remote_data.py: datasets packed into size-bounded parts come back byte-exact, a file is
written only once all its chunks arrived, and a corrupted chunk is refused."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL.WebPImagePlugin")
_spec = importlib.util.spec_from_file_location("remote_data", Path(__file__).parents[1] / "tools" / "remote_data.py")
remote_data = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(remote_data)


def _dataset(src: Path, name: str, n: int, c: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n, 8, 6, c), dtype=np.uint8)
    y = rng.integers(0, 10, n).astype(np.int64)
    np.savez(src / f"{name}.npz", x=x, y=y)
    return x, y


def test_pack_and_unpack_over_several_calls_is_exact(tmp_path: Path) -> None:
    src, pack, out = tmp_path / "src", tmp_path / "pack", tmp_path / "out"
    src.mkdir()
    rgb = _dataset(src, "rgb", 700, 3, 0)   # 7 chunks of 100; random pixels barely compress
    grey = _dataset(src, "grey", 250, 1, 1)  # 3 chunks, the last one partial
    parts = remote_data.pack(src, pack, ["rgb", "grey"], chunk=100, part_mb=0.05, workers=1)
    assert len(parts) >= 3  # the budget forces several parts
    assert all(sum(f.stat().st_size for f in p.iterdir()) < 0.05e6 + 2000 for p in parts)  # + the manifest
    status = remote_data.unpack(out, parts[:1], workers=1)  # the first call
    manifest = json.loads((parts[0] / "manifest.json").read_text())
    for name, man in manifest.items():  # written exactly when every chunk came in that call
        complete = all((parts[0] / f"{c}.webp").exists() for c in man["chunks"])
        assert (status[name] == "written") == complete and (out / f"{name}.npz").exists() == complete
    assert any(s.startswith("waiting") for s in status.values())
    status = remote_data.unpack(out, parts[1:], workers=1)  # the rest
    assert set(status.values()) <= {"written", "present"}
    for name, (x, y) in {"rgb": rgb, "grey": grey}.items():
        with np.load(out / f"{name}.npz") as d:
            assert d["x"].dtype == np.uint8 and np.array_equal(d["x"], x) and np.array_equal(d["y"], y)


def test_a_corrupted_chunk_is_refused(tmp_path: Path) -> None:
    src, pack, out = tmp_path / "src", tmp_path / "pack", tmp_path / "out"
    src.mkdir()
    _dataset(src, "d", 300, 3, 2)
    (part,) = remote_data.pack(src, pack, ["d"], chunk=100, part_mb=10, workers=1)
    label = part / "d__001.y.npy"
    y = np.load(label)
    y[0] += 1
    np.save(label, y)
    assert remote_data.unpack(out, [part], workers=1) == {"d": "CHECKSUM MISMATCH"}
    assert not (out / "d.npz").exists()
    assert json.loads((part / "manifest.json").read_text())["d"]["chunks"] == ["d__000", "d__001", "d__002"]
