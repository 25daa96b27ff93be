"""The benchmarks' shared harness (benchmarks/harness.py), on a fake clock: no test times anything.

A variant advances the fake clock by scripted wall and CPU seconds, so every record, median and
ratio is known in advance. The times are chosen so that the median of the per-repeat ratios and
the ratio of the medians differ: the harness must report the first.
"""

from __future__ import annotations

import datetime
import importlib
import json
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's benchmarks package, not opacus's of the same name
harness = importlib.import_module("benchmarks.harness")
assert Path(harness.__file__).resolve().is_relative_to(ROOT), harness.__file__

# wall seconds per repeat (repeats 0, 1, 2); per-repeat a/b: 0.5, 2, 10/3 -> median 2, while
# median(a) / median(b) = 2 / 2 = 1
WALL = {"a": [1.0, 2.0, 10.0], "b": [2.0, 1.0, 3.0]}
CPU = {"a": [0.5, 1.5, 9.0], "b": [1.0, 0.25, 2.0]}
SAMPLES = 100
WARMUP_SECONDS = 1000.0  # a warm-up call's time: must appear in no record


class FakeClock:
    def __init__(self) -> None:
        self.wall, self.cpu = 0.0, 0.0
        self.calls: list[str] = []

    def __call__(self) -> tuple[float, float]:
        return self.wall, self.cpu

    def variant(self, name: str, warmup: int):
        """A callable that advances the clock by ``name``'s scripted times, call by call."""
        def run() -> int:
            i = sum(c == name for c in self.calls) - warmup
            self.calls.append(name)
            self.wall += WARMUP_SECONDS if i < 0 else WALL[name][i]
            self.cpu += WARMUP_SECONDS if i < 0 else CPU[name][i]
            return SAMPLES
        return run


def _timed(warmup: int = 1, **kw):
    clock = FakeClock()
    variants = {n: clock.variant(n, warmup) for n in ("a", "b")}
    return harness.interleaved(variants, 3, warmup=warmup, clock=clock, **kw), clock


def test_paired_ratio_is_the_median_of_per_repeat_ratios_not_the_ratio_of_medians():
    timing, _ = _timed(baseline="b")
    per_repeat = [x / y for x, y in zip(WALL["a"], WALL["b"])]
    expected = sorted(per_repeat)[1]
    ratio_of_medians = statistics.median(WALL["a"]) / statistics.median(WALL["b"])
    assert expected != pytest.approx(ratio_of_medians)  # the construction tells the two apart
    assert timing.ratio("a", "b") == pytest.approx(expected)
    # samples per second: each repeat's rates are SAMPLES / wall, so their ratio is b's wall over a's
    rate_ratios = [y / x for x, y in zip(WALL["a"], WALL["b"])]
    assert timing.ratio("a", "b", "rate") == pytest.approx(sorted(rate_ratios)[1])
    summary = timing.summary()
    assert summary["a"]["wall_vs_baseline"] == pytest.approx(expected)
    assert summary["a"]["rate_vs_baseline"] == pytest.approx(sorted(rate_ratios)[1])
    assert summary["b"]["wall_vs_baseline"] == 1.0


def test_medians_records_and_cpu_time_per_variant():
    timing, _ = _timed(baseline="a")
    for name in ("a", "b"):
        assert timing.values(name) == pytest.approx(WALL[name])
        assert timing.values(name, "cpu") == pytest.approx(CPU[name])
        assert [r["samples"] for r in timing.runs[name]] == [SAMPLES] * 3
        row = timing.summary()[name]
        assert row["wall_s"] == pytest.approx(sorted(WALL[name])[1])
        assert row["cpu_s"] == pytest.approx(sorted(CPU[name])[1])
        assert row["samples_per_s"] == pytest.approx(sorted(SAMPLES / w for w in WALL[name])[1])
        assert row["samples_per_cpu_s"] == pytest.approx(sorted(SAMPLES / c for c in CPU[name])[1])
    assert WARMUP_SECONDS not in [r["wall"] for rs in timing.runs.values() for r in rs]


@pytest.mark.parametrize("warmup", [0, 1, 2])
def test_variants_run_in_turn_every_repeat_after_the_warmup(warmup):
    seen: list[tuple[int, list[str]]] = []
    timing, clock = _timed(warmup=warmup, on_repeat=lambda rep, records: seen.append((rep, list(records))))
    assert clock.calls == ["a", "b"] * (warmup + 3)
    assert seen == [(0, ["a", "b"]), (1, ["a", "b"]), (2, ["a", "b"])]
    assert timing.repeats == 3


def test_a_variant_that_returns_nothing_has_times_only():
    clock = FakeClock()

    def tick() -> None:
        clock.wall += 2.0
        clock.cpu += 1.0

    timing = harness.interleaved({"t": tick}, 2, warmup=0, clock=clock)
    assert timing.runs["t"] == [{"wall": 2.0, "cpu": 1.0}, {"wall": 2.0, "cpu": 1.0}]
    assert "samples_per_s" not in timing.summary()["t"]


def test_bad_arguments_name_the_fix():
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        harness.interleaved({"a": lambda: 0}, 0)
    with pytest.raises(ValueError, match="baseline 'c' is not a variant"):
        harness.interleaved({"a": lambda: 0}, 1, baseline="c")
    with pytest.raises(ValueError, match="no variants"):
        harness.interleaved({}, 1)


def test_result_file_carries_machine_command_commit_date_and_raw_times(tmp_path, capsys):
    timing, _ = _timed(baseline="b")
    argv = [str(ROOT / "benchmarks" / "methods.py"), "--only", "HBN (paper preset),FBN", "--repeats", "3"]
    path = tmp_path / "out" / "result.json"
    harness.write_result(path, {"benchmark": "fake", "timing": timing.to_json()}, argv=argv)
    written = json.loads(path.read_text())
    assert written["benchmark"] == "fake"
    m = written["machine"]
    assert m["cpu_count"] >= 1 and m["threads"] == torch.get_num_threads() == written["threads"]
    assert m["torch"] == torch.__version__ and isinstance(m["cpu_model"], str)
    assert written["machine_label"].startswith(f"{m['cpu_count']} cores, {m['threads']} thread")
    assert written["argv"] == argv
    assert shlex.split(written["command"]) == ["python", "benchmarks/methods.py", *argv[1:]]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:
        assert written["commit"] == head.stdout.strip() and isinstance(written["dirty"], bool)
    else:
        assert written["commit"] is None
    assert datetime.datetime.fromisoformat(written["date"]).tzinfo is not None
    raw = written["timing"]["raw"]
    assert [r["wall"] for r in raw["a"]] == pytest.approx(WALL["a"])
    assert [r["cpu"] for r in raw["b"]] == pytest.approx(CPU["b"])
    assert written["timing"]["baseline"] == "b" and written["timing"]["repeats"] == 3
    assert str(path) in capsys.readouterr().out


def test_a_row_names_the_thread_count_and_the_machine(capsys):
    harness.print_row("setting", "1.23x")
    out = capsys.readouterr().out.strip()
    t = torch.get_num_threads()
    assert re.fullmatch(rf"setting \[\d+ cores, {t} threads?, torch {re.escape(torch.__version__)}\] 1\.23x", out)
    assert harness.machine_label({"cpu_count": 2, "threads": 1, "torch": "x"}) == "2 cores, 1 thread, torch x"
    assert harness.machine_label({"cpu_count": 2, "threads": 2, "torch": "x"}) == "2 cores, 2 threads, torch x"
