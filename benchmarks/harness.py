"""The benchmarks' shared harness: interleaved timing, paired ratios, self-describing results.

On a shared machine a timing drifts by 15–30% within minutes. Variants are therefore compared
inside one process, one repeat of each in turn, so that a change of load hits all of them alike.
A ratio is the median over repeats of the two variants' ratio *in the same repeat*: a ratio of
medians would pair a fast repeat of one with a slow repeat of the other. Every result file says
how it was made: the machine, the thread count, the exact command, the commit and the date.

    comparison = interleaved({"a": run_a, "b": run_b}, repeats=5, baseline="b")
    print_row("setting", comparison.describe())
    write_result("benchmarks/results/x.json", {"comparison": comparison.to_json()})
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

__all__ = [
    "Comparison", "interleaved", "measure", "process_clock",
    "machine", "machine_label", "metadata", "command", "git_state", "write_result", "print_row",
]

ROOT = Path(__file__).resolve().parents[1]

#: One repeat of one variant: ``wall`` and ``cpu`` seconds; ``samples`` (the count the variant
#: returned, e.g. samples trained) and ``rate`` (samples per wall second) when it returns a number.
Record = dict[str, float]
#: Returns ``(wall seconds, CPU seconds)`` on two monotonic clocks.
Clock = Callable[[], tuple[float, float]]


def process_clock() -> tuple[float, float]:
    """Wall time and this process's CPU time (all its threads: above the wall time with 2 threads)."""
    return time.perf_counter(), time.process_time()


def measure(fn: Callable[[], Any], clock: Clock = process_clock) -> tuple[Record, Any]:
    """Run ``fn`` once: its :data:`Record` and what it returned."""
    wall0, cpu0 = clock()
    out = fn()
    wall1, cpu1 = clock()
    record: Record = {"wall": wall1 - wall0, "cpu": cpu1 - cpu0}
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        record["samples"] = out
        record["rate"] = out / record["wall"] if record["wall"] > 0 else float("nan")
    return record, out


@dataclass
class Comparison:
    """Per-repeat records of named variants timed in turn (:func:`interleaved`)."""

    runs: dict[str, list[Record]]
    baseline: str | None = None

    @property
    def repeats(self) -> int:
        return len(next(iter(self.runs.values()), []))

    def values(self, name: str, key: str = "wall") -> list[float]:
        return [r[key] for r in self.runs[name]]

    def median(self, name: str, key: str = "wall") -> float:
        return statistics.median(self.values(name, key))

    def ratio(self, a: str, b: str, key: str = "wall") -> float:
        """Median over repeats of ``a``'s ``key`` over ``b``'s in the same repeat."""
        xs, ys = self.values(a, key), self.values(b, key)
        if len(xs) != len(ys):
            raise ValueError(f"cannot pair {a!r} ({len(xs)} repeats) with {b!r} ({len(ys)} repeats)")
        return statistics.median([x / y for x, y in zip(xs, ys)])

    def rate_and_cpu(self, name: str) -> tuple[float, float]:
        """Median samples per wall second and median samples per CPU second."""
        per_cpu = [r["samples"] / r["cpu"] for r in self.runs[name] if r["cpu"] > 0]
        return self.median(name, "rate"), statistics.median(per_cpu) if per_cpu else float("nan")

    def summary(self) -> dict[str, dict[str, float]]:
        """Per variant: median wall and CPU seconds (and samples per wall and CPU second), and,
        with a baseline, the paired ratios of its wall time (and rate) to the baseline's."""
        out: dict[str, dict[str, float]] = {}
        for name, records in self.runs.items():
            row = {"wall_s": self.median(name), "cpu_s": self.median(name, "cpu")}
            counted = all("samples" in r for r in records)
            if counted:
                row["samples_per_s"], row["samples_per_cpu_s"] = self.rate_and_cpu(name)
            if self.baseline is not None:
                row["wall_vs_baseline"] = self.ratio(name, self.baseline)
                if counted and all("samples" in r for r in self.runs[self.baseline]):
                    row["rate_vs_baseline"] = self.ratio(name, self.baseline, "rate")
            out[name] = row
        return out

    def describe(self) -> str:
        """``name 1234 (1210)`` per variant: samples/s (per CPU-s); or ``name 0.53 s (CPU 0.52 s)``."""
        summary = self.summary()
        parts = [f"{name} {row['samples_per_s']:.0f} ({row['samples_per_cpu_s']:.0f})" if "samples_per_s" in row
                 else f"{name} {row['wall_s']:.3g} s (CPU {row['cpu_s']:.3g} s)" for name, row in summary.items()]
        unit = "samples/s (per CPU-s): " if all("samples_per_s" in r for r in summary.values()) else ""
        return unit + "  ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """What a result file keeps: the baseline, the summary and every repeat's record."""
        return {"baseline": self.baseline, "repeats": self.repeats, "summary": self.summary(), "raw": self.runs}


def interleaved(variants: Mapping[str, Callable[[], Any]], repeats: int, *, warmup: int = 1,
                baseline: str | None = None, clock: Clock = process_clock,
                on_repeat: Callable[[int, dict[str, Record]], None] | None = None) -> Comparison:
    """Time every variant once per repeat, in the given order, ``repeats`` times.

    Args:
        variants: name -> a callable doing one unit of work; it may return the samples it
            processed, which adds ``samples`` and ``rate`` to its records.
        repeats: timed repeats (at least 1).
        warmup: untimed calls of every variant, in the same order, before the first repeat
            (first-call costs: allocations, kernel selection, lazy imports).
        baseline: the variant every other is compared with in :meth:`Comparison.summary`.
        clock: ``() -> (wall, cpu)``; tests pass a fake one.
        on_repeat: called after each repeat with its index and records, e.g. to print progress.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if not variants:
        raise ValueError("no variants to time: pass at least one name -> callable")
    if baseline is not None and baseline not in variants:
        raise ValueError(f"baseline {baseline!r} is not a variant; variants: {', '.join(variants)}")
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    runs: dict[str, list[Record]] = {name: [] for name in variants}
    for rep in range(repeats):
        this: dict[str, Record] = {}
        for name, fn in variants.items():
            this[name], _ = measure(fn, clock)
            runs[name].append(this[name])
        if on_repeat is not None:
            on_repeat(rep, this)
    return Comparison(runs, baseline)


@functools.cache
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine() -> dict[str, Any]:
    """The machine a timing belongs to: cores, torch threads, torch version, CPU (and GPU) model, load."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cuda": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def machine_label(m: Mapping[str, Any] | None = None) -> str:
    """``2 cores, 1 thread, torch 2.13.0+cpu`` for a table row."""
    m = machine() if m is None else m
    t = m["threads"]
    return f"{m['cpu_count']} cores, {t} thread{'' if t == 1 else 's'}, torch {m['torch']}"


def command(argv: list[str] | None = None) -> str:
    """The command line that reruns this measurement, script path relative to the repository root."""
    argv = list(sys.argv if argv is None else argv)
    if argv:
        script = Path(argv[0]).resolve()
        if script.is_relative_to(ROOT):
            argv[0] = str(script.relative_to(ROOT))
    return shlex.join(["python", *argv])


def git_state(root: Path = ROOT) -> dict[str, Any]:
    """The commit measured and whether tracked files had uncommitted changes (None without git)."""
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            return None

    head = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if head else None
    return {"commit": head.strip() if head else None, "dirty": bool(status.strip()) if status is not None else None}


def metadata(argv: list[str] | None = None) -> dict[str, Any]:
    """What every result file carries: machine, thread count, command, argv, commit, date."""
    m = machine()
    return {
        "machine": m,
        "machine_label": machine_label(m),
        "threads": m["threads"],
        "command": command(argv),
        "argv": list(sys.argv if argv is None else argv),
        **git_state(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def write_result(path: str | Path, result: Mapping[str, Any], *, argv: list[str] | None = None) -> dict[str, Any]:
    """Write ``result`` plus :func:`metadata` as JSON to ``path`` (the metadata wins a clash) and return it."""
    full = {**result, **metadata(argv)}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(full, indent=2) + "\n")
    print(f"result written to {path}")
    return full


def print_row(label: str, text: str) -> None:
    """One result line, with the thread count and the machine: ``label [2 cores, 1 thread, ...] text``."""
    print(f"{label} [{machine_label()}] {text}", flush=True)
