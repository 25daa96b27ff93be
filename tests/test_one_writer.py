"""One writer per run directory (issue 35.1), with real processes: a second ``run``, an
``--overwrite``, a ``--resume``, a ``compare``, ``diagnose`` and ``analyze`` on a directory a live run
is writing are refused with exit 2 naming the holder, and the lock of a killed process is taken over."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fednorm.cli.main import main
from fednorm.engine.checkpoint import load_latest
from fednorm.engine.runlock import LOCK_NAME, RunLockedError, is_locked, run_lock

TINY = ["--num-clients", "3", "--model", "mlp", "--batch-size", "64", "--seed", "1", "--threads", "1", "--quiet"]


def _start(out: Path, rounds: int = 100000) -> subprocess.Popen:
    """A ``fednorm run`` that trains until killed, once it has written its first round."""
    proc = subprocess.Popen([sys.executable, "-m", "fednorm", "run", "--rounds", str(rounds), *TINY, "--out", str(out),
                             "--eval-every", "1", "--checkpoint-every", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not ((out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").read_text().count("\n") >= 1):
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() < deadline, "the run wrote no round in 120 s"
        time.sleep(0.05)
    return proc


def _refused(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    return err


def test_a_live_run_has_one_writer_and_a_killed_ones_lock_is_taken_over(tmp_path, capsys):
    out = tmp_path / "r"
    proc = _start(out)
    try:
        holder = is_locked(out)
        assert holder is not None and holder["pid"] == proc.pid and holder["host"] == socket.gethostname()
        config = (out / "config.yaml").read_text()
        for argv in (["run", *TINY, "--out", str(out), "--rounds", "2"],
                     ["run", *TINY, "--out", str(out), "--rounds", "2", "--overwrite"],
                     ["run", "--resume", str(out), "--quiet"]):
            err = _refused(capsys, argv)
            assert f"in use by another fednorm process (pid {proc.pid} on {socket.gethostname()}, since " in err, err
            assert "--resume" not in err.split("in use by")[1]  # no advice to start a second writer
            assert len(err.strip().splitlines()) == 1
        err = _refused(capsys, ["diagnose", str(out)])
        assert "still training" in err and f"pid {proc.pid}" in err
        assert not (out / "diagnosis.json").exists()
        err = _refused(capsys, ["analyze", str(out), "--no-plots"])
        assert "still training" in err and not (out / "analysis.json").exists()
        assert proc.poll() is None  # the live run was neither deleted nor disturbed
        assert (out / "config.yaml").read_text() == config
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert is_locked(out) is None  # the kernel dropped the dead process's lock
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == proc.pid  # its file still names it
    done = load_latest(out)["server_round"]
    assert main(["run", "--resume", str(out), "--rounds", str(done + 1), "--quiet"]) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds"] == done + 1
    assert not (out / LOCK_NAME).exists()  # released: no lock file is left behind


def test_two_runs_started_together_into_one_directory_give_one_run(tmp_path):
    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "fednorm", "run", "--rounds", "3", *TINY, "--out", str(out)]
    procs = [subprocess.Popen(cmd + ["--lr", lr], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for lr in ("0.05", "0.02")]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "in use by another fednorm process" in loser or "already holds" in loser
    winner_lr = ("0.05", "0.02")[[code for code, _ in results].index(0)]
    assert f"lr: {winner_lr}" in (out / "config.yaml").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds"] == 3
    assert [json.loads(line)["round"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_a_live_comparison_is_not_joined(tmp_path, capsys):
    out = tmp_path / "c"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for argv in (["compare", "--rounds", "2", *TINY, "--out", str(out)], ["compare", "--resume", str(out)]):
            assert f"pid {holder.pid}" in _refused(capsys, argv)
    finally:
        holder.kill()
        holder.wait()


HOLD = """
import sys, time
from fednorm.engine.runlock import run_lock
with run_lock(sys.argv[1], "test"):
    print("held", flush=True)
    time.sleep(600)
"""


def test_the_lock_is_reentrant_in_a_process_and_leaves_no_trace_on_failure(tmp_path):
    d = tmp_path / "new" / "run"
    with run_lock(d):
        with run_lock(d):
            assert (d / LOCK_NAME).is_file()
        assert (d / LOCK_NAME).is_file()  # still held by the outer block
    assert not (tmp_path / "new").exists()  # it made the folders and nothing else was written: both removed
    with pytest.raises(RunLockedError):
        holder = subprocess.Popen([sys.executable, "-c", HOLD, str(d)], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "held"
            with run_lock(d):
                pass
        finally:
            holder.kill()
            holder.wait()


def test_a_child_started_by_the_holder_inherits_the_lock(tmp_path):
    from fednorm.engine.runlock import inherit_env

    d = tmp_path / "r"
    with run_lock(d):
        child = subprocess.run([sys.executable, "-c", HOLD.replace("time.sleep(600)", "pass"), str(d)],
                               env=inherit_env([d]), capture_output=True, text=True, timeout=120)
        assert child.returncode == 0 and "held" in child.stdout, child.stderr
        other = subprocess.run([sys.executable, "-c", HOLD.replace("time.sleep(600)", "pass"), str(d)],
                               env={k: v for k, v in os.environ.items() if k != "FEDNORM_INHERITED_LOCKS"},
                               capture_output=True, text=True, timeout=120)
        assert other.returncode != 0 and "RunLockedError" in other.stderr
