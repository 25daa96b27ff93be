"""Where ``fednorm run`` and ``fednorm compare`` write, checked before anything trains, from the
command line and from Python (:func:`fednorm.run`, :func:`fednorm.compare`) alike.

A run directory that already holds a run, or a comparison's directory that holds a comparison, is
never overwritten without ``--overwrite`` (``overwrite=True``): the message says how to continue it
(``--resume``), start it again (``--overwrite``) or pick another directory. A run repeated from its
own saved ``RUN/config.yaml`` gets a new directory beside the old one. An ``--out`` that is a file,
lies under a file or cannot be written is one message. This module sits below both the CLI and
:mod:`fednorm.api`, which apply the same rule.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..errors import ConfigError

__all__ = ["RUN_FILES", "shown", "check_existing_run", "holds_run", "describe_run", "check_writable", "check_run_dir", "clear_run", "next_free", "holds_comparison",
           "check_comparison_dir", "clear_comparison"]

# What a run writes into its directory (fednorm.engine.outputs, fednorm.engine.checkpoint, fednorm analyze).
RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json", "checkpoint.pt", "checkpoint.prev.pt", "final_model.pt", "accuracy.png",
             "analysis.json", "partition.json", ".mlflow_run_id", "diagnostics.png")
#: Folders a run's loggers write (``--log tensorboard,wandb``): stale events would mix with new ones.
RUN_FOLDERS = ("tensorboard", "wandb", "report")  # report/: `fednorm report RUN`'s default output, of the earlier run
_EVIDENCE = ("config.yaml", "metrics.jsonl", "summary.json", "checkpoint.pt", "checkpoint.prev.pt")


def holds_run(path: str | Path) -> bool:
    """True when ``path`` is a directory with a run's config, metrics, summary or checkpoint."""
    p = Path(path)
    return p.is_dir() and any((p / name).exists() for name in _EVIDENCE)


def describe_run(path: str | Path) -> str:
    """``"a completed run of 15 rounds"``, from its summary when it has one."""
    try:
        summary = json.loads((Path(path) / "summary.json").read_text())
        return f"a {summary.get('status', 'stopped')} run of {summary.get('rounds')} rounds"
    except (OSError, ValueError, AttributeError):
        return "an unfinished run" if (Path(path) / "checkpoint.pt").exists() else "an earlier run"


def shown(path: str | Path, limit: int = 80) -> str:
    """``path`` for a one-line message: a path longer than ``limit`` characters with its middle cut."""
    text = str(path)
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return f"{text[:head]}…{text[len(text) - (limit - 1 - head):]}"


def check_writable(path: str | Path, option: str = "--out") -> None:
    """Raise :class:`ConfigError` unless ``path`` is a directory we can write or can create."""
    p = Path(path)
    try:
        _check_writable(p, option)
    except OSError as exc:  # a name too long for the file system, a loop of links: one line, exit 2 (issue 50)
        raise ConfigError(f"{option} {shown(p)} cannot be used: {exc.strerror or exc}") from None


def _dangling_link(p: Path) -> Path | None:
    """The first of ``p`` and its parents that is a symbolic link to nothing, else None."""
    for q in (p, *p.parents):
        if q.is_symlink() and not q.exists():
            return q
    return None


def _check_writable(p: Path, option: str) -> None:
    dangling = _dangling_link(p)
    if dangling is not None:  # was blamed on "another process keeps creating and removing it" (issue 50)
        raise ConfigError(f"{option} {shown(p)}: {shown(dangling)} is a symbolic link to {shown(os.readlink(dangling), 60)}, "
                          "which does not exist; create that directory or pass another --out")
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{option} {shown(p)} is a file, not a directory; pass a directory path")
    existing = p
    while not existing.exists():
        parent = existing.parent
        if parent == existing:
            break
        existing = parent
    if existing.exists() and not existing.is_dir():
        raise ConfigError(f"{option} {shown(p)} lies under the file {shown(existing)}, so no directory can be made there")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {shown(p)}: no permission to write in {shown(existing)}")
    for _ in range(3):  # root passes os.access everywhere: try for real, then leave no trace
        made: list[Path] = []
        try:
            missing = []
            q = p
            while not q.exists():
                missing.append(q)
                q = q.parent
            for d in reversed(missing):
                try:
                    d.mkdir()
                    made.append(d)
                except FileExistsError:  # another process (a second run started at once) made it meanwhile
                    pass
            probe = p / f".fednorm-write-test-{os.getpid()}"
            probe.touch()
            probe.unlink()
            return
        except FileNotFoundError:  # a folder another process had made and removed again: try once more
            continue
        except OSError as exc:
            raise ConfigError(f"{option} {shown(p)} cannot be written: {exc.strerror or exc}") from None
        finally:
            for d in reversed(made):
                try:
                    d.rmdir()
                except OSError:  # not empty: another process uses it now
                    pass
    raise ConfigError(f"{option} {shown(p)} cannot be written: another process keeps creating and removing it")


def check_existing_run(path: str | Path, command: str, writes: str, verb: str | None = None) -> None:
    """Before ``fednorm COMMAND RUN_DIR`` reads a run and writes ``writes`` into it: one line for a
    ``RUN_DIR`` that does not exist or holds no run, and for one that cannot be written (a
    read-only file system or mount: the raw ``[Errno 30]`` with exit 1 before issue 50)."""
    p = Path(path)
    verb = verb or command
    try:
        exists = p.is_dir()
        has_config = exists and (p / "config.yaml").is_file()
    except OSError as exc:  # a name too long for the file system
        raise ConfigError(f"cannot {verb} {shown(p)}: {exc.strerror or exc}") from None
    if not has_config:
        why = "is it a fednorm run directory?" if exists else ("it is a file" if p.exists() else "it does not exist")
        raise ConfigError(f"cannot {verb} {shown(p)}: no config.yaml there ({why})")
    probe = p / f".fednorm-write-test-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except OSError as exc:
        raise ConfigError(f"cannot {verb} {shown(p)}: it cannot be written ({exc.strerror or exc}) and fednorm {command} "
                          f"writes {writes} there; copy the run somewhere writable (cp -r {shown(p, 40)} COPY) and "
                          f"{verb} the copy") from None
    try:
        probe.unlink()
    except OSError:
        pass


def check_run_dir(path: str | Path, *, overwrite: bool, command: str = "fednorm run", python: bool = False) -> None:
    """Refuse a directory that holds an earlier run unless ``overwrite``; check it is writable.
    ``python``: the advice in :func:`fednorm.run`'s terms (``resume=``, ``overwrite=True``, ``out``)."""
    p = Path(path)
    option = "out" if python else "--out"
    check_writable(p, option)
    if not holds_run(p) and holds_comparison(p):  # one run's files would mix with a set's (its plot, its report)
        members = sorted(c.name for c in p.iterdir() if c.is_dir() and holds_run(c))
        what = f"runs {', '.join(members[:3])}{', ...' if len(members) > 3 else ''}" if members else "a comparison's table"
        raise ConfigError(f"{p} holds a set of runs ({what}: a comparison or a run per seed); a single run needs a "
                          f"directory of its own: pass another {option}")
    if holds_run(p) and not overwrite:
        if python:
            raise ConfigError(f"{p} already holds {describe_run(p)}; continue it with fednorm.run(resume={str(p)!r}) (with "
                              f"rounds=N to extend it), start it again with overwrite=True, or pass another out")
        raise ConfigError(
            f"{p} already holds {describe_run(p)}; continue it with `{command} --resume {p}` (with --rounds N to "
            f"extend it), start it again with --overwrite, or pass another --out"
        )


def clear_run(path: str | Path) -> list[str]:
    """Delete the files an earlier run wrote into ``path`` (nothing else); the names removed."""
    p = Path(path)
    removed = []
    for name in RUN_FILES:
        f = p / name
        if f.is_file():
            f.unlink()
            removed.append(name)
    for name in RUN_FOLDERS:
        if (p / name).is_dir():
            shutil.rmtree(p / name)
            removed.append(name + "/")
    temporary = [p / f".{name}.tmp" for name in ("config.yaml", "metrics.jsonl", "summary.json")]
    for f in sorted(p.glob("analysis_*.png")) + sorted(p.glob(".checkpoint.*.tmp")) + [t for t in temporary if t.is_file()]:
        f.unlink()
        removed.append(f.name)
    return removed


def next_free(path: str | Path) -> Path:
    """``RUN-2``, ``RUN-3``, ...: the first sibling of ``path`` that does not exist."""
    p = Path(path)
    i = 2
    while Path(f"{p}-{i}").exists():
        i += 1
    return Path(f"{p}-{i}")


def holds_comparison(path: str | Path) -> bool:
    """True when ``path`` holds a ``fednorm compare`` table or a variant's run directory."""
    p = Path(path)
    if not p.is_dir():
        return False
    if any((p / name).exists() for name in ("results.md", "results.csv", "compare.json")):
        return True
    return any(holds_run(child) for child in p.iterdir() if child.is_dir())


#: The files a comparison writes beside its variants' run directories (fednorm.api.comparison).
COMPARISON_FILES = ("results.md", "results.csv", "accuracy.png", "compare.json")


def check_comparison_dir(path: str | Path, *, overwrite: bool, python: bool = False) -> bool:
    """Refuse a directory that holds an earlier comparison unless ``overwrite``, and one that holds
    a single run (a comparison's files would mix with it); check it is writable. Returns whether
    an earlier comparison is there (to be cleared with :func:`clear_comparison` once every variant
    is known to be valid). ``python``: the advice in :func:`fednorm.compare`'s terms."""
    p = Path(path)
    option = "out" if python else "--out"
    check_writable(p, option)
    if holds_run(p) and not holds_comparison(p):
        raise ConfigError(f"{p} already holds {describe_run(p)}; a comparison needs a directory of its own: pass another {option}")
    earlier = holds_comparison(p)
    if earlier and not overwrite:
        if python:
            raise ConfigError(f"{p} already holds a comparison; continue it with fednorm.compare(resume={str(p)!r}), start it "
                              f"again with overwrite=True, or pass another out")
        raise ConfigError(f"{p} already holds a comparison; continue it with `fednorm compare --resume {p}`, start "
                          "it again with --overwrite, or pass another --out")
    return earlier


def clear_comparison(path: str | Path) -> None:
    """Delete an earlier comparison in ``path``: its variants' run files and its table, plan and
    plot (nothing else), so that nothing of it is left beside the new one."""
    p = Path(path)
    for child in [p, *sorted(c for c in p.iterdir() if c.is_dir())]:
        if holds_run(child):
            clear_run(child)
    for name in COMPARISON_FILES:
        (p / name).unlink(missing_ok=True)
