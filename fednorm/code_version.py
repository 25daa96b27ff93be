"""Which code made a run: the commit of the checkout fednorm runs from (and whether its package or
configs had uncommitted changes), so that a record names its code even when a run was resumed
under another commit. In a module of its own, below the engine, because every run records it
(``summary.json``'s ``code``) and the reproduce records (``reproduce.json``) do too."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

from .version import __version__

__all__ = ["CODE_PATHS", "git_info", "code_record"]

#: What decides a run's numbers: the package and the table configs (not the records or docs).
CODE_PATHS = ("fednorm", "configs")


def _git(repo: Path, *args: str, timeout: float = 10) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=timeout)


def git_info(repo: Path | None = None) -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None}`` of the repository holding fednorm, plus,
    when :data:`CODE_PATHS` hold uncommitted changes, ``changed`` (the files) and ``diff_sha256``
    (of ``git diff HEAD`` over them), so a record names the exact code even then.

    Only a checkout whose top level holds the package counts: an installed fednorm inside some
    other repository (a virtual environment in a project's tree) has no commit of its own.
    ``$FEDNORM_COMMIT``, when set, is taken as stated (cleanliness unknown): a copy of the tree
    sent to another machine may carry no git metadata, or stale metadata from an older checkout."""
    repo = Path(__file__).resolve().parents[1] if repo is None else Path(repo)
    if os.environ.get("FEDNORM_COMMIT"):
        return {"commit": os.environ["FEDNORM_COMMIT"], "dirty": None}
    try:
        top = _git(repo, "rev-parse", "--show-toplevel")
        if top.returncode != 0 or Path(top.stdout.decode().strip()).resolve() != repo.resolve():
            return {"commit": None, "dirty": None}
        sha = _git(repo, "rev-parse", "HEAD")
        if sha.returncode != 0:
            return {"commit": None, "dirty": None}
        commit = sha.stdout.decode().strip()
        status = _git(repo, "status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS)
        if status.returncode != 0:
            return {"commit": commit, "dirty": None}
        changed = [line[3:] for line in status.stdout.decode().splitlines() if line.strip()]
        info: dict[str, Any] = {"commit": commit, "dirty": bool(changed)}
        if changed:
            diff = _git(repo, "diff", "HEAD", "--", *CODE_PATHS, timeout=30)
            info.update(changed=changed, diff_sha256=hashlib.sha256(diff.stdout).hexdigest())
        return info
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


@functools.lru_cache(maxsize=1)
def _process_code() -> tuple[tuple[str, Any], ...]:
    # once per process: the code a process runs is the code it imported when it started
    info = git_info()
    return tuple({"fednorm_version": __version__, "commit": info["commit"], "dirty": info["dirty"],
                  **({"diff_sha256": info["diff_sha256"]} if "diff_sha256" in info else {})}.items())


def code_record(from_round: int) -> dict[str, Any]:
    """One entry of a run's ``code`` list: the code that trained it from ``from_round`` on (0 for
    a new run, the checkpoint's round for a resumed one)."""
    return {"from_round": int(from_round), **dict(_process_code())}
