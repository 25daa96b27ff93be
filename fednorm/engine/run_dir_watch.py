"""Whether the run directory a run writes is still the one it started in.

A run keeps its ``metrics.jsonl`` open and writes checkpoints by path. After ``rm -rf R`` in the
middle of a run, the metrics went on into the deleted file and the next checkpoint re-created
``R`` holding a checkpoint alone: the run then reported success over a directory with no config
and no metrics (issue 50). :class:`~fednorm.engine.outputs.RunWriter` registers its directory's
identity (device and inode) here when it opens it; every later write of the run
(:meth:`RunWriter.log`, the summary, :func:`~fednorm.engine.checkpoint.save_checkpoint`) first
checks that the directory is still there and still the same, else raises
:class:`~fednorm.errors.RunDirectoryRemovedError`, and the run fails saying so.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import RunDirectoryRemovedError

__all__ = ["watch", "unwatch", "check_not_removed"]

_WATCHED: dict[str, tuple[int, int]] = {}  # resolved run directory -> (st_dev, st_ino) when its run opened it


def _key(path: str | Path) -> str:
    return os.path.abspath(os.fspath(path))


def watch(path: str | Path) -> None:
    """Remember the directory ``path`` (which exists) as the one its run writes."""
    st = os.stat(path)
    _WATCHED[_key(path)] = (st.st_dev, st.st_ino)


def unwatch(path: str | Path) -> None:
    _WATCHED.pop(_key(path), None)


def check_not_removed(path: str | Path) -> None:
    """Raise :class:`RunDirectoryRemovedError` when the run directory ``path`` of a run in this
    process was removed or replaced since the run opened it (nothing for a directory no run watches)."""
    seen = _WATCHED.get(_key(path))
    if seen is None:
        return
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise RunDirectoryRemovedError(path) from None
    except OSError:  # cannot tell (permissions): let the write itself say what is wrong
        return
    if (st.st_dev, st.st_ino) != seen:
        raise RunDirectoryRemovedError(path)
