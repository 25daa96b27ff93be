"""One writer per run directory: an OS-level lock held for the life of every writer.

Two processes writing one run directory corrupt it without an error: one run's ``config.yaml``
beside the other's metrics, a half-written JSON line, an ``--overwrite`` that deletes a live run's
files while it still reports success. Every command that writes into a run directory (``run``,
``--resume``, ``--overwrite``, ``compare``, ``reproduce``'s workers, ``diagnose``, ``analyze``)
therefore holds :func:`run_lock` on it first; a second writer gets :class:`RunLockedError` naming
the holder (pid, host, since when, command).

The lock is ``flock(2)`` on ``DIR/.fednorm.lock``, a file that exists while a writer holds it: the
kernel drops the lock when its process dies, so a lock left by a killed process (``kill -9``, the
OOM killer, a lost session) is stale by construction and the next writer takes it over (the file
still names the dead holder: :attr:`RunLock.took_over`).
Within one process the lock is re-entrant (the CLI takes it before deleting for ``--overwrite`` and
:func:`fednorm.run` takes it again), and a child started by a holder may inherit it through
:data:`INHERITED_ENV` (``fednorm launch``'s rank 0 writes under the launcher's lock).

Where ``fcntl`` does not exist (Windows) the lock is a no-op.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from ..errors import FednormError

__all__ = ["LOCK_NAME", "INHERITED_ENV", "RunLockedError", "RunLock", "run_lock", "lock_holder", "describe_holder", "is_locked",
           "inherit_env", "holding_run_lock"]

LOCK_NAME = ".fednorm.lock"
#: Directories (os.pathsep-separated, resolved) whose lock a parent process holds for this one.
INHERITED_ENV = "FEDNORM_INHERITED_LOCKS"

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


class RunLockedError(FednormError):
    """Another live process is writing the run directory."""

    def __init__(self, message: str, holder: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.holder = holder or {}


def _key(path: str | Path) -> str:
    return str(Path(path).resolve())


def lock_holder(path: str | Path) -> dict[str, Any]:
    """What the lock file of ``path`` says about its (last) holder; ``{}`` when none or unreadable."""
    try:
        text = (Path(path) / LOCK_NAME).read_text()
        value = json.loads(text) if text.strip() else {}
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def describe_holder(holder: dict[str, Any]) -> str:
    """``pid 4242 on node7, since 2026-11-27 10:45:02: fednorm run --out R`` (what is known of it)."""
    parts = [f"pid {holder.get('pid', '?')}"]
    if holder.get("host"):
        parts[0] += f" on {holder['host']}"
    if holder.get("since"):
        parts.append(f"since {holder['since']}")
    text = ", ".join(parts)
    if holder.get("command"):
        command = str(holder["command"])
        text += f": {command if len(command) <= 80 else command[:77] + '...'}"
    return text


def _command_line() -> str:
    argv = list(sys.argv)
    if argv and argv[0].endswith(("fednorm", "__main__.py")):
        argv[0] = "fednorm"
    return " ".join(argv)


class RunLock:
    """The exclusive lock of one run directory (use :func:`run_lock`)."""

    _held: dict[str, "RunLock"] = {}  # this process's locks, by resolved directory

    def __init__(self, path: str | Path, purpose: str, hint: str = "wait for it to finish or stop it, or pass another --out") -> None:
        self.path = Path(path)
        self.purpose = purpose
        self.hint = hint
        self._fd: int | None = None
        self._depth = 0
        self._made: list[Path] = []  # the directories acquire created, innermost first
        self.took_over: dict[str, Any] | None = None
        """The holder a stale lock named when this process took it over, else None."""

    def acquire(self) -> None:
        if fcntl is None:  # pragma: no cover
            return
        q = self.path
        while not q.exists() and q.parent != q:
            self._made.append(q)
            q = q.parent
        self.path.mkdir(parents=True, exist_ok=True)
        file = self.path / LOCK_NAME
        while True:
            fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = lock_holder(self.path)
                raise RunLockedError(
                    f"{self.path} is in use by another fednorm process ({describe_holder(holder)}); {self.hint}",
                    holder) from None
            except OSError:  # a filesystem without flock: run unlocked rather than not at all
                os.close(fd)
                return
            try:  # the file may have been replaced while we waited for it: lock the one at the path
                same = os.fstat(fd).st_ino == os.stat(file).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        previous = lock_holder(self.path)
        if previous.get("pid") and (previous.get("pid"), previous.get("host")) != (os.getpid(), socket.gethostname()):
            self.took_over = previous
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "purpose": self.purpose, "command": _command_line()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Remove the lock file while still holding it, then let go: a writer that opened the old
        file meanwhile finds it unlinked and retries on a new one (:meth:`acquire`)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            (self.path / LOCK_NAME).unlink()
            if self._made and not any(self.path.iterdir()):  # a run that failed before writing leaves no folder
                for d in self._made:
                    d.rmdir()
        except OSError:
            pass
        finally:
            os.close(fd)


def _inherited() -> set[str]:
    return {p for p in os.environ.get(INHERITED_ENV, "").split(os.pathsep) if p}


@contextlib.contextmanager
def run_lock(path: str | Path, purpose: str = "writing", hint: str | None = None) -> Iterator[RunLock | None]:
    """Hold the run directory ``path``'s lock (creating ``path``) for the ``with`` block.

    Re-entrant within a process; a directory a parent process holds for this one
    (:data:`INHERITED_ENV`) is not locked again. Raises :class:`RunLockedError` when another
    live process holds it; its message ends with ``hint`` (what the user can do instead).
    """
    key = _key(path)
    if key in _inherited():
        yield None
        return
    lock = RunLock._held.get(key)
    if lock is None:
        lock = RunLock(path, purpose, *([hint] if hint else []))
        lock.acquire()
        RunLock._held[key] = lock
    lock._depth += 1
    try:
        yield lock
    finally:
        lock._depth -= 1
        if lock._depth == 0:
            RunLock._held.pop(key, None)
            lock.release()


def is_locked(path: str | Path) -> dict[str, Any] | None:
    """The holder's record when another live process holds ``path``'s lock, else None (a reader's
    check: ``fednorm diagnose`` on a run that is still training)."""
    file = Path(path) / LOCK_NAME
    if fcntl is None or not file.is_file() or _key(path) in RunLock._held or _key(path) in _inherited():
        return None
    try:
        fd = os.open(file, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return lock_holder(path) or {"pid": "?"}
    except OSError:
        return None
    finally:
        os.close(fd)
    return None


def inherit_env(paths: list[str | Path], env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with ``paths`` marked as held for a child process."""
    env = dict(os.environ if env is None else env)
    held = _inherited() | {_key(p) for p in paths}
    env[INHERITED_ENV] = os.pathsep.join(sorted(held))
    return env


F = TypeVar("F", bound=Callable[..., Any])


def holding_run_lock(purpose: str, hint: str, unless: str | None = None) -> Callable[[F], F]:
    """Decorate a function whose first argument is a run directory it writes into: it runs
    holding that directory's lock (unless its keyword ``unless`` is passed false, e.g. ``write``)."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(run_dir: str | Path, *args: Any, **kwargs: Any) -> Any:
            if unless is not None and not kwargs.get(unless, True):
                return fn(run_dir, *args, **kwargs)
            with run_lock(run_dir, purpose, hint):
                return fn(run_dir, *args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
