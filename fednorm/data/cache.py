"""A cache of decoded arrays, so image folders are decoded and resized once, not at every run.

An entry is one ``.npz`` under :func:`generated_cache_dir`\\ ``/decoded``, named after a hash
of everything that changes its content: the reader's version, the source files' paths, sizes
and modification times, and the decoding options (image size, channels, classes, split). A
changed file therefore misses the cache instead of serving stale arrays. Writes are atomic
(a temporary file renamed), so concurrent runs never read half a file. Within one process the
entries are memoised too: a run loads the train and the test split from the same decode.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

__all__ = ["generated_cache_dir", "fingerprint", "cached_arrays", "CACHE_VERSION"]

CACHE_VERSION = 1
_MEMO: dict[str, dict[str, np.ndarray]] = {}
_MEMO_MAX = 8
_MEMO_BYTES = 512 * 2**20  # entries memoised in the process only up to this size


def generated_cache_dir() -> Path:
    """Folder for generated data: ``$FEDNORM_CACHE``, else ``~/.cache/fednorm/generated``.

    Never the data folder itself, which may be a shared, read-only copy.
    """
    env = os.environ.get("FEDNORM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fednorm" / "generated"


def fingerprint(paths: Iterable[Path], options: dict[str, Any]) -> str:
    """Hash of the files and folders under ``paths`` (path, size, mtime of each) and of ``options``."""
    entries = []
    for root in paths:
        root = Path(root).resolve()
        files = [root] if root.is_file() else sorted(root.rglob("*"))
        for f in files:
            if f.is_dir():  # an added (even empty) folder changes what the reader finds
                entries.append((str(f), "dir", 0))
                continue
            st = f.stat()
            entries.append((str(f), st.st_size, st.st_mtime_ns))
    blob = json.dumps({"v": CACHE_VERSION, "files": entries, "options": options}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def cached_arrays(name: str, key: str, build: Callable[[], dict[str, np.ndarray]], *, use_disk: bool = True) -> dict[str, np.ndarray]:
    """The arrays cached under ``key``, else ``build()`` stored there (on disk when ``use_disk``
    and the cache folder is writable; a read-only cache is skipped silently)."""
    if key in _MEMO:
        return _MEMO[key]
    folder = generated_cache_dir() / "decoded"
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)[:40]
    path = folder / f"{safe}-{key}.npz"
    arrays: dict[str, np.ndarray] | None = None
    if use_disk and path.is_file():
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError, EOFError):
            arrays = None  # a damaged entry is rebuilt
    if arrays is None:
        arrays = build()
        if use_disk:
            try:
                folder.mkdir(parents=True, exist_ok=True)
                tmp = folder / f"{safe}-{key}.{os.getpid()}.part.npz"
                np.savez(tmp, **arrays)
                os.replace(tmp, path)
            except OSError:
                pass
    if sum(a.nbytes for a in arrays.values()) <= _MEMO_BYTES:  # large data is read from disk again instead
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.pop(next(iter(_MEMO)))
        _MEMO[key] = arrays
    return arrays
