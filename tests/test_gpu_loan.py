"""tools/gpu_loan.py: plan parsing, the time cap that ends a step with SIGTERM (then SIGKILL), and
the packing of run directories without what a resume does not need."""

from __future__ import annotations

import importlib.util
import sys
import tarfile
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("gpu_loan", Path(__file__).parents[1] / "tools" / "gpu_loan.py")
gpu_loan = importlib.util.module_from_spec(_spec)
sys.modules["gpu_loan"] = gpu_loan  # dataclasses look their module up while the class is built
_spec.loader.exec_module(gpu_loan)


def test_plan_lines_get_a_default_out_and_bad_caps_are_refused(tmp_path: Path) -> None:
    plan = """
    # LN first
    300 ln --table table10 --columns 1cls --rounds 2000 --jobs 3
    120 fbn --table accuracy --out /x/fbn   # an explicit --out is kept
    """
    steps = gpu_loan.parse_plan(plan, tmp_path)
    assert [s.cap for s in steps] == [300.0, 120.0]
    assert steps[0].args[-2:] == ["--out", str(tmp_path / "ln")] and steps[1].args.count("--out") == 1
    with pytest.raises(SystemExit, match="line 1: the first word must be a cap"):
        gpu_loan.parse_plan("ln --table table10", tmp_path)
    with pytest.raises(SystemExit, match="no fednorm reproduce arguments"):
        gpu_loan.parse_plan("30", tmp_path)


_POLITE = """
import signal, sys, time
def stop(*_):
    open(sys.argv[1], "w").write("checkpoint"); sys.exit(0)
signal.signal(signal.SIGTERM, stop)
time.sleep(60)
"""
_STUBBORN = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n"


def test_a_step_past_its_cap_gets_sigterm_then_sigkill(tmp_path: Path) -> None:
    marker = tmp_path / "checkpoint"
    rc, _ = gpu_loan.run_step([sys.executable, "-c", _POLITE, str(marker)], cap=1.0, grace=20.0, log=tmp_path / "log")
    assert rc == 0 and marker.read_text() == "checkpoint"  # stopped at the cap by SIGTERM (its handler wrote the marker)
    rc, _ = gpu_loan.run_step([sys.executable, "-c", _STUBBORN], cap=0.5, grace=1.0, log=tmp_path / "log")
    assert rc == -9  # ignored SIGTERM: killed after the grace
    rc, _ = gpu_loan.run_step([sys.executable, "-c", "pass"], cap=30, grace=1.0, log=tmp_path / "log")
    assert rc == 0


def test_runs_are_packed_one_file_each_without_the_previous_checkpoint(tmp_path: Path) -> None:
    work = tmp_path / "work"
    for run in ("ln/table10/fedln__1cls/seed0", "ln/table10/fedfn__1cls/seed0"):
        d = work / run
        d.mkdir(parents=True)
        for name in ("reproduce.json", "metrics.jsonl", "checkpoint.pt", "checkpoint.prev.pt", ".fednorm.lock"):
            (d / name).write_text(name)
    (work / "ln" / "report.md").write_text("not a run")
    packed = gpu_loan.pack_runs(work, tmp_path / "out")
    assert [p.name for p in packed] == ["ln__table10__fedfn__1cls__seed0.tgz", "ln__table10__fedln__1cls__seed0.tgz"]
    with tarfile.open(packed[1]) as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"reproduce.json", "metrics.jsonl", "checkpoint.pt"} <= names
    assert not names & {"checkpoint.prev.pt", ".fednorm.lock"}


_ORPHANING = """
import subprocess, sys
child = "import signal, sys, time\\nsignal.signal(signal.SIGTERM, lambda *a: None)\\ntime.sleep(1.5)\\nopen(sys.argv[1], 'w').write('record')\\n"
subprocess.Popen([sys.executable, "-c", child, sys.argv[1]])
"""


def test_a_step_returns_only_when_its_whole_process_group_is_gone(tmp_path: Path) -> None:
    """A leader that exits while its worker still writes (a killed ``--jobs`` suite did, and the
    packed run lost its ``reproduce.json``): the step waits for the worker before packing."""
    record = tmp_path / "record"
    rc, took = gpu_loan.run_step([sys.executable, "-c", _ORPHANING, str(record)], cap=30, grace=20.0, log=tmp_path / "log")
    assert rc == 0 and record.read_text() == "record"
