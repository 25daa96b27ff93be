"""Crash-safe checkpoints of a federated run, so that a long run can be resumed.

A checkpoint is one ``torch.save`` file holding a dict of tensors and plain Python values (ints,
floats, strings, bools, ``None``, lists, tuples and dicts), so it loads with
``torch.load(weights_only=True)`` and never runs code from the file. :func:`save_checkpoint`
writes it to a temporary file in the run directory, forces it to disk (``fsync``), moves the current
``checkpoint.pt`` to ``checkpoint.prev.pt`` and renames the temporary file onto ``checkpoint.pt``,
so a crash (or power loss) at any instant leaves at least one complete checkpoint: the new one,
or the previous one. :func:`load_latest` resumes from ``checkpoint.pt`` and falls back, with a
warning, to ``checkpoint.prev.pt`` when the latest is missing or corrupt. Every failure raises
:class:`CheckpointError`, naming the file and what to do.

Each file records ``version`` (:data:`CHECKPOINT_VERSION`, bumped whenever the layout of the
state changes, as torch's ``_version`` for modules) and the ``fednorm_version`` that wrote it.
"""

from __future__ import annotations

import io
import os
import tempfile
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from .run_dir_watch import check_not_removed

__all__ = [
    "CHECKPOINT_NAME",
    "PREVIOUS_NAME",
    "CHECKPOINT_VERSION",
    "CheckpointError",
    "save_checkpoint",
    "load_checkpoint",
    "load_latest",
    "saved_round",
]

CHECKPOINT_NAME = "checkpoint.pt"
PREVIOUS_NAME = "checkpoint.prev.pt"
CHECKPOINT_VERSION = 1

# Keys written by save_checkpoint itself; a state must not use them.
_RESERVED_KEYS = ("version", "fednorm_version")
# Temporary files are named ".checkpoint.<random>.tmp" and live in the run directory, so the final
# rename never crosses a file system.
_TMP_PREFIX = ".checkpoint."
_TMP_SUFFIX = ".tmp"
# How much of a torch/pickle error message to quote (weights_only errors run to many lines).
_CAUSE_CHARS = 300


class CheckpointError(RuntimeError):
    """Raised when a checkpoint is missing, truncated, corrupt or from an incompatible version.

    The message names the file and says what to do (resume from the previous checkpoint, restart
    the run, or upgrade fednorm). A ``RuntimeError``, as for other missing or corrupt files.
    """


def _fednorm_version() -> str:
    from ..version import __version__  # not the package's __init__, which imports the engine

    return __version__


def _check_state(value: Any, where: str) -> None:
    """Raise TypeError if ``value`` holds anything ``torch.load(weights_only=True)`` would refuse."""
    # Exact types: subclasses such as numpy.float64 (a float) or an IntEnum are refused by
    # weights_only even though isinstance() accepts them.
    if value is None or type(value) in (bool, int, float, str) or isinstance(value, torch.Tensor):
        return
    if type(value) in (dict, OrderedDict):
        for key, item in value.items():
            if type(key) not in (str, int):
                raise TypeError(
                    f"checkpoint state {where} has a key {key!r} of type {type(key).__name__}; "
                    "keys must be str or int"
                )
            _check_state(item, f"{where}[{key!r}]")
        return
    if type(value) in (list, tuple):
        for i, item in enumerate(value):
            _check_state(item, f"{where}[{i}]")
        return
    hint = ""
    if type(value).__module__ == "numpy":
        hint = " (convert numpy values with torch.from_numpy(...) or .item())"
    raise TypeError(
        f"checkpoint state {where} has type {type(value).__module__}.{type(value).__qualname__}, which "
        "torch.load(weights_only=True) cannot read back; store only tensors, int, float, str, bool, None, "
        f"lists, tuples and dicts{hint}"
    )


def _fsync_dir(directory: Path) -> None:
    """Make renames in ``directory`` durable where the OS allows it (POSIX); a no-op elsewhere."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(directory, flags)
    except OSError:  # e.g. Windows cannot open a directory
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def save_checkpoint(run_dir: str | Path, state: dict[str, Any]) -> Path:
    """Atomically write ``state`` as ``run_dir/checkpoint.pt``, keeping the previous one.

    Steps: ``torch.save`` to a temporary file in ``run_dir``, flush and ``fsync`` it; rename the
    current ``checkpoint.pt`` (if any) to ``checkpoint.prev.pt``; ``os.replace`` the temporary
    file onto ``checkpoint.pt``; ``fsync`` the directory (POSIX). A crash before the first rename
    leaves the old ``checkpoint.pt``; a crash between the renames leaves no ``checkpoint.pt`` but
    a complete ``checkpoint.prev.pt``, which :func:`load_latest` falls back to. Callers should
    therefore resume with :func:`load_latest` rather than test whether ``checkpoint.pt`` exists.
    Stale temporary files of an earlier crash are removed after a successful save. One writer per
    run directory is assumed.

    Args:
        run_dir: the run directory (created if missing).
        state: the run state: tensors, int, float, str, bool, None, lists, tuples and dicts keyed
            by str or int, nested freely (e.g. ``{"round": 7, "global": model.state_dict(),
            "bank": {client_id: {...}}, "rng": generator.get_state()}``). The keys ``version`` and
            ``fednorm_version`` are reserved.

    Returns:
        The path of the new ``checkpoint.pt``.

    Raises:
        TypeError: if ``state`` is not a dict or holds a value that cannot be loaded back with
            ``weights_only=True`` (the message gives its location, e.g. ``state['bank'][3]``).
        ValueError: if ``state`` uses a reserved key.
        OSError: if the file cannot be written or renamed. The temporary file is removed, and a
            complete checkpoint is left: the old ``checkpoint.pt`` or, after a failure between the
            two renames, ``checkpoint.prev.pt``.
    """
    if not isinstance(state, dict):
        raise TypeError(f"checkpoint state must be a dict, got {type(state).__name__}")
    reserved = [k for k in _RESERVED_KEYS if k in state]
    if reserved:
        raise ValueError(
            f"checkpoint state must not use the reserved key(s) {', '.join(map(repr, reserved))}; "
            "save_checkpoint writes them itself"
        )
    _check_state(state, "state")

    run_dir = Path(run_dir)
    check_not_removed(run_dir)  # a run directory removed mid-run is not silently re-created (issue 50)
    run_dir.mkdir(parents=True, exist_ok=True)
    payload = {"version": CHECKPOINT_VERSION, "fednorm_version": _fednorm_version(), **state}
    current = run_dir / CHECKPOINT_NAME
    previous = run_dir / PREVIOUS_NAME

    fd, tmp_name = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX, dir=run_dir)
    tmp = Path(tmp_name)
    try:
        # Serialised in memory first: torch.save's writer turns a failed write (a full disk, a
        # file-size limit) into a RuntimeError without the cause; a plain write keeps the OSError.
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        with os.fdopen(fd, "wb") as f:
            f.write(buffer.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        if current.exists():
            os.replace(current, previous)
        os.replace(tmp, current)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a real crash leaves it; the next successful save removes it
        raise
    _fsync_dir(run_dir)

    for stale in run_dir.glob(f"{_TMP_PREFIX}*{_TMP_SUFFIX}"):
        stale.unlink(missing_ok=True)
    return current


def _describe_cause(exc: BaseException, path: Path) -> str:
    """A short, readable cause for a failed ``torch.load``."""
    try:
        if path.is_file() and path.stat().st_size == 0:
            return "the file is empty"
    except OSError:
        pass
    text = str(exc)
    marker = "WeightsUnpickler error:"
    if marker in text:  # torch's weights_only error: keep its specific last part, drop the advice
        detail = text.split(marker, 1)[1].strip().splitlines()[0].split(" Please use", 1)[0].rstrip(". ")
        text = f"it holds objects other than tensors and plain Python values: {detail}"
    else:
        text = text.strip().splitlines()[0] if text.strip() else ""
    if len(text) > _CAUSE_CHARS:
        text = text[:_CAUSE_CHARS] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _damaged_member(path: Path) -> str | None:
    """The first entry of a checkpoint's zip archive whose bytes fail their CRC-32 (a torch file is
    a zip whose entries carry checksums that ``torch.load`` never reads), else None. A file that is
    not a readable zip is left to ``torch.load`` to describe."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip()
    except zipfile.BadZipFile as exc:
        if "CRC" in str(exc) or "Bad magic" in str(exc):
            return str(exc)
        return None
    except (OSError, EOFError, ValueError):
        return None


def _read(path: Path, map_location: Any) -> tuple[dict[str, Any] | None, str]:
    """``(data, "")`` for a good checkpoint, else ``(None, problem)``, the problem naming ``path``."""
    if not path.exists():
        return None, f"checkpoint {path} does not exist"
    if not path.is_file():
        return None, f"checkpoint {path} is not a file"
    damaged = _damaged_member(path)
    if damaged is not None:
        return None, (f"checkpoint {path} is corrupt: its entry '{damaged}' fails its CRC check (bytes changed on disk "
                      "after it was written)")
    try:
        with warnings.catch_warnings():
            # torch warns about unexpected pickle protocols before failing; the error says enough.
            warnings.simplefilter("ignore", UserWarning)
            data = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, EOFError, UnpicklingError, OSError, ...
        return None, (
            f"checkpoint {path} could not be loaded ({_describe_cause(exc, path)}); it is truncated, "
            "corrupt or not a fednorm checkpoint"
        )
    if not isinstance(data, dict):
        return None, (
            f"checkpoint {path} holds a {type(data).__name__}, expected a dict written by "
            "fednorm.engine.checkpoint.save_checkpoint"
        )
    version = data.get("version")
    if version is None:
        return None, (
            f"checkpoint {path} has no 'version' entry, so it was not written by "
            "fednorm.engine.checkpoint.save_checkpoint (a bare state_dict?)"
        )
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        return None, (
            f"checkpoint {path} has an invalid version {version!r}; expected an integer between 1 and "
            f"{CHECKPOINT_VERSION}"
        )
    if version > CHECKPOINT_VERSION:
        written_by = data.get("fednorm_version", "an unknown version")
        return None, (
            f"checkpoint {path} has version {version}, newer than the version {CHECKPOINT_VERSION} that "
            f"fednorm {_fednorm_version()} reads; it was written by fednorm {written_by}. Upgrade fednorm "
            "to resume it"
        )
    return data, ""


def load_checkpoint(path: str | Path, *, map_location: Any = "cpu") -> dict[str, Any]:
    """Load one checkpoint file with ``torch.load(weights_only=True)`` and check its version.

    Args:
        path: the checkpoint file.
        map_location: where tensors are loaded, as for ``torch.load`` (default: ``"cpu"``).

    Returns:
        The saved dict, including the ``version`` and ``fednorm_version`` entries that
        :func:`save_checkpoint` adds to the state.

    Raises:
        CheckpointError: if the file is missing, empty, truncated, not a torch file, holds
            something other than a dict or objects ``weights_only`` refuses, lacks ``version``,
            or was written by a newer checkpoint version. The message names the file and the cause.
    """
    path = Path(path)
    data, problem = _read(path, map_location)
    if data is None:
        advice = (
            f"load_latest() falls back to {PREVIOUS_NAME} when that loads; otherwise restart the run"
            if path.name == CHECKPOINT_NAME
            else "restart the run"
        )
        raise CheckpointError(f"{problem}. To resume, {advice}")
    return data


def load_latest(run_dir: str | Path, *, map_location: Any = "cpu", at_round: int | None = None) -> dict[str, Any]:
    """Load the newest usable checkpoint of ``run_dir``.

    Loads ``checkpoint.pt``; if it is missing or corrupt but ``checkpoint.prev.pt`` loads, warns
    that the previous checkpoint is used (the rounds since it are run again) and returns it. The
    latest checkpoint is missing only after a crash between the two renames of
    :func:`save_checkpoint`.

    Args:
        run_dir: the run directory.
        map_location: where tensors are loaded (default: ``"cpu"``).
        at_round: the checkpoint of this round, the latest or the previous one (a run set resumes
            every run from one round: one run may have written its next checkpoint before a kill).

    Returns:
        The checkpoint dict (see :func:`load_checkpoint`).

    Raises:
        CheckpointError: if the directory holds no checkpoint, or neither checkpoint loads (the
            message gives both causes).
    """
    run_dir = Path(run_dir)
    current = run_dir / CHECKPOINT_NAME
    previous = run_dir / PREVIOUS_NAME
    if not current.exists() and not previous.exists():
        where = "" if run_dir.is_dir() else " (the directory does not exist)"
        raise CheckpointError(
            f"no checkpoint in {run_dir}{where}: neither {CHECKPOINT_NAME} nor {PREVIOUS_NAME} is there. "
            "A run writes checkpoints only when started with checkpoint_every > 0, from its first "
            "checkpoint round on; check the run directory, or start the run afresh"
        )
    data, latest_problem = _read(current, map_location)
    if at_round is not None and data is not None and int(data.get("server_round", 0)) != at_round:
        older, _ = _read(previous, map_location)
        if older is None or int(older.get("server_round", 0)) != at_round:
            raise CheckpointError(f"no checkpoint of round {at_round} in {run_dir}: {CHECKPOINT_NAME} holds round "
                                  f"{int(data.get('server_round', 0))}")
        return older
    if data is not None:
        return data
    data, previous_problem = _read(previous, map_location)
    if data is None:
        raise CheckpointError(
            f"no usable checkpoint in {run_dir}:\n  {latest_problem}\n  {previous_problem}\n"
            "Restart the run, or restore the run directory from a backup"
        )
    warnings.warn(
        f"{latest_problem}; resuming from the previous checkpoint {previous} instead (the rounds saved "
        "since then are run again)",
        stacklevel=2,
    )
    return data


def saved_round(run_dir: str | Path) -> int | None:
    """The round of ``run_dir``'s newest usable checkpoint (None when it has none)."""
    run_dir = Path(run_dir)
    for path in (run_dir / CHECKPOINT_NAME, run_dir / PREVIOUS_NAME):
        data, _ = _read(path, "cpu")
        if data is not None:
            return int(data.get("server_round", 0))
    return None
