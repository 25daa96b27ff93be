"""What a newcomer meets in the first hour (issue 50): one meaning of "last-10", and the last
malformed inputs and run-directory situations that still slipped through.

Every case runs the real CLI (``fednorm.cli.main.main``, or a subprocess where a signal is
needed) on a tiny MLP run and checks what the user sees: one line on stderr, exit status 2 (1
where the run had started and failed, 130 for an interrupt), no traceback and nothing written.

This machine's tests run as root, which writes through any permission bits, so a read-only run
directory is simulated: :func:`read_only` makes every write under one directory (``open`` for
writing, ``os.open`` with a write flag, ``mkdir``, ``replace``/``rename``) raise
``OSError(EROFS)``, as a read-only mount does, and leaves reads alone.
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fednorm import api
from fednorm.cli.main import main

TINY = ["--model", "mlp", "--num-clients", "2", "--batch-size", "64", "--threads", "1", "--quiet"]
README = Path(__file__).resolve().parents[1] / "README.md"


def _snapshot(root: Path) -> dict[str, tuple[int, float]]:
    """Every file under ``root`` with its size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime) for p in sorted(root.rglob("*")) if p.is_file()}


def _one_line(err: str, needle: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("fednorm") and "Traceback" not in err, err
    assert needle in lines[0], err
    assert len(lines[0]) <= 400, (len(lines[0]), err)
    return lines[0]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 2-round run (both rounds evaluated)."""
    root = tmp_path_factory.mktemp("newcomer")
    api.run(rounds=2, num_clients=2, model="mlp", batch_size=64, threads=1, out=str(root / "run"), progress=False)
    return root / "run"


@pytest.fixture
def run_copy(finished: Path, tmp_path: Path) -> Path:
    """A copy of the finished run that a test may change."""
    dst = tmp_path / "run"
    shutil.copytree(finished, dst)
    return dst


# --- 1. "last-10" means the last 10 rounds everywhere -----------------------------------------------


def test_summary_last10_is_the_mean_over_the_last_10_rounds_or_none(tmp_path):
    """Before: the mean of the last 10 *evaluations* (rounds 5, 10, 12 here, so 3 of them)."""
    sparse = api.run(rounds=12, eval_every=5, num_clients=2, model="mlp", batch_size=64, threads=1,
                     out=str(tmp_path / "sparse"), progress=False).summary
    evaluated = [json.loads(line)["round"] for line in (tmp_path / "sparse" / "metrics.jsonl").read_text().splitlines()]
    assert evaluated == [5, 10, 12]
    assert sparse["last10_mean_test_accuracy"] is None and sparse["last10_rounds"] == [3, 12]
    dense = api.run(rounds=12, eval_every=5, eval_last_rounds=10, num_clients=2, model="mlp", batch_size=64, threads=1,
                    out=str(tmp_path / "dense"), progress=False)
    at = {h["round"]: h["test_accuracy"] for h in dense.history}
    assert dense.summary["last10_mean_test_accuracy"] == pytest.approx(math.fsum(at[r] for r in range(3, 13)) / 10, rel=1e-12)
    assert dense.summary["last10_rounds"] == [3, 12]
    on_disk = json.loads((tmp_path / "dense" / "summary.json").read_text())
    assert on_disk["last10_mean_test_accuracy"] == pytest.approx(dense.summary["last10_mean_test_accuracy"])


def test_compare_table_says_last_10_rounds_and_why_a_cell_is_n_a(tmp_path, capsys):
    """Before: a `last-10 acc (%)` column holding the mean of the evaluations at rounds 5, 10, 12."""
    code = main(["compare", "--variants", "fedavg:bn", "--partition", "iid", "--rounds", "12", "--eval-every", "5",
                 "--eval-last-rounds", "0", *TINY, "--out", str(tmp_path / "cmp")])
    out = capsys.readouterr().out
    assert code == 0
    head = next(line for line in out.splitlines() if line.startswith("| variant |"))
    assert "last-10 rounds acc (%)" in head
    row = next(line for line in out.splitlines() if line.startswith("| fedavg+bn |")).split("|")
    assert row[head.split("|").index(" last-10 rounds acc (%) ")].strip() == "n/a"
    assert "n/a where rounds 3-12 were not all evaluated (evaluated every 5 rounds): pass --eval-last-rounds 10" in out
    assert "last-10 rounds acc (%)" in (tmp_path / "cmp" / "results.md").read_text()


def test_the_first_command_evaluates_its_last_10_rounds_so_its_column_means_something(tmp_path, capsys):
    """`fednorm compare` with its defaults (15 rounds, every 5th evaluated) showed a last-10 of
    rounds 5-15's three evaluations; it now evaluates each of rounds 6-15 and shows their mean."""
    from fednorm.cli.compare import QUICKSTART

    assert QUICKSTART["rounds"] == 15 and QUICKSTART["eval_every"] == 5 and QUICKSTART["eval_last_rounds"] == 10
    code = main(["compare", "--variants", "fedavg:bn", "--partition", "iid", *TINY, "--out", str(tmp_path / "cmp")])
    out = capsys.readouterr().out
    assert code == 0
    history = [json.loads(line) for line in (tmp_path / "cmp" / "fedavg_bn" / "metrics.jsonl").read_text().splitlines()]
    assert [h["round"] for h in history] == [5, *range(6, 16)]
    want = 100 * math.fsum(h["test_accuracy"] for h in history[1:]) / 10
    row = next(line for line in out.splitlines() if line.startswith("| fedavg+bn |")).split("|")
    assert float(row[5]) == pytest.approx(want, abs=0.006)


def test_old_summaries_are_read_with_the_same_meaning(run_copy, tmp_path, capsys):
    """A summary.json written before issue 50 (no last10_rounds, the mean of the last evaluations)
    keeps loading; its last-10 is recomputed from metrics.jsonl: the mean of rounds 1-2 here, and
    n/a when a round of them was not evaluated."""
    from fednorm.engine.outputs import read_summary
    from fednorm.seeds import load_run

    summary = json.loads((run_copy / "summary.json").read_text())
    history = [json.loads(line) for line in (run_copy / "metrics.jsonl").read_text().splitlines()]
    want = math.fsum(h["test_accuracy"] for h in history) / 2
    old = {k: v for k, v in summary.items() if k != "last10_rounds"}
    old["last10_mean_test_accuracy"] = 0.123  # what an older fednorm wrote
    (run_copy / "summary.json").write_text(json.dumps(old))
    assert read_summary(run_copy)["last10_mean_test_accuracy"] == pytest.approx(want)
    assert load_run(run_copy)[0]["last10_mean_test_accuracy"] == pytest.approx(want)
    (run_copy / "metrics.jsonl").write_text(json.dumps(history[-1]) + "\n")  # round 1 not evaluated
    assert load_run(run_copy)[0]["last10_mean_test_accuracy"] is None
    assert main(["report", str(run_copy), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| fedavg+bn |"))
    assert "last-10 rounds acc (%)" in md and "| n/a |" in row and "12.30" not in md


def test_the_readme_shows_the_first_commands_table_with_its_columns_explained():
    """The README's first command printed a table whose columns the README never named."""
    from fednorm.api.comparison import CompareResult

    text = README.read_text()
    head = CompareResult({}, None).markdown().splitlines()[0]
    first = text.split("\n## ", 1)[0]
    assert head in first, "the README's opening shows no table of `fednorm compare`"
    caption = first.split(head, 1)[1]
    for column in ("final acc", "best acc", "last-10 rounds", "mean client acc", "per client"):
        assert column in caption, column
    assert re.search(r"rounds 6.15", caption), "the caption says which rounds last-10 spans"


# --- 2. inputs that still slipped through -----------------------------------------------------------

SLIPPED = [
    # trained with no evaluation and no progress line for ever
    (["run", "--rounds", "99999999999999999999"], "rounds: must be at most 1,000,000"),
    # wrote to runs/<timestamp>
    (["run", "--out", ""], "out: is empty"),
    (["compare", "--out", ""], "out: is empty"),
    # ran all 8 default variants
    (["compare", "--methods", ""], "--methods is empty"),
    (["compare", "--norms", " , "], "--norms is empty"),
    (["compare", "--variants", ""], "--variants is empty"),
    # silently one seed
    (["run", "--seeds", "0,0"], "lists seed 0 more than once"),
    (["compare", "--seeds", "1,2,1"], "lists seed 1 more than once"),
    # exit 1 with a raw "[Errno 36] File name too long: '<300 characters>'"
    (["run", "--out", "{long}"], "cannot be used: File name too long"),
    (["run", "--seeds", "0,1", "--out", "{long}"], "cannot be used: File name too long"),
    (["run", "--resume", "{long}"], "File name too long; pass a shorter path"),
    (["compare", "--resume", "{long}"], "File name too long"),
    # "another process keeps creating and removing it"
    (["run", "--out", "{dangling}"], "is a symbolic link to"),
    (["run", "--out", "{dangling}/sub"], "is a symbolic link to"),
    (["compare", "--out", "{dangling}"], "is a symbolic link to"),
    # two lines: "loading ..." and the error
    (["diagnose", "{tmp}/missing"], "no config.yaml there (it does not exist)"),
]


@pytest.mark.parametrize("argv, needle", SLIPPED, ids=[" ".join(a)[:50] for a, _ in SLIPPED])
def test_inputs_that_slipped_through_are_one_line_exit_2_and_write_nothing(argv, needle, tmp_path, monkeypatch, capsys):
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)  # a case that wrongly ran writes here (runs/...)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    paths = {"{long}": str(tmp_path / ("a" * 300)), "{dangling}": str(tmp_path / "dangling"), "{tmp}": str(tmp_path)}
    args = [next((a.replace(k, v) for k, v in paths.items() if k in a), a) for a in argv]
    before = sorted(os.listdir(tmp_path))
    fresh = argv[0] in ("run", "compare") and "--resume" not in argv  # the others take no experiment options

    def too_long(signum, frame):  # type: ignore[no-untyped-def]
        raise TimeoutError("still running after 60 s: the input was accepted")  # --rounds 1e20 trained for ever

    previous = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(60)
    try:
        code = main([*args, *(TINY if fresh else [])])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    _one_line(err, needle)
    assert "[Errno" not in err and "another process" not in err
    assert not os.listdir(work), os.listdir(work)
    assert sorted(os.listdir(tmp_path)) == before
    assert not (tmp_path / "nowhere").exists()


# --- 3. messages about run directories ---------------------------------------------------------------


def test_report_on_a_corrupt_summary_says_so_and_how_to_rewrite_it(run_copy, capsys):
    """Before: "no run directory (a folder with config.yaml and summary.json) under R"."""
    (run_copy / "summary.json").write_text('{"status": "compl')
    before = _snapshot(run_copy)
    assert main(["report", str(run_copy)]) == 2
    line = _one_line(capsys.readouterr().err, "summary.json is corrupt")
    assert f"fednorm run --resume {run_copy}" in line
    assert _snapshot(run_copy) == before and not (run_copy / "report").exists()
    assert main(["run", "--resume", str(run_copy), "--quiet"]) == 0  # the advice works
    capsys.readouterr()
    assert main(["report", str(run_copy)]) == 0


def test_report_on_a_run_that_was_killed_says_resume_it(run_copy, capsys):
    (run_copy / "summary.json").unlink()  # killed before its end: config, metrics, checkpoints, no summary
    assert main(["report", str(run_copy)]) == 2
    line = _one_line(capsys.readouterr().err, "stopped before it finished")
    assert f"fednorm run --resume {run_copy}" in line and not (run_copy / "report").exists()


def test_report_on_a_run_still_training_says_it_is_training(run_copy, capsys):
    """A live run holds its directory's lock (fednorm/engine/runlock.py) and has no summary.json
    until it ends; another process holds it here, as a training run does."""
    (run_copy / "summary.json").unlink()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom fednorm.engine.runlock import run_lock\n"
         "with run_lock(sys.argv[1], 'run'):\n    print('held', flush=True)\n    time.sleep(120)\n", str(run_copy)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        before = _snapshot(run_copy)
        assert main(["report", str(run_copy)]) == 2
        line = _one_line(capsys.readouterr().err, "is a run still training")
        assert f"pid {holder.pid}" in line and "report it then" in line
        assert _snapshot(run_copy) == before
        # under a folder, the report of the finished runs leaves it out with a warning saying why
        assert main(["report", str(run_copy.parent), "--out", str(run_copy.parent / "rep")]) == 2  # no finished run at all
        assert "is a run still training" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()


def _read_only(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """Every write under ``root`` fails with EROFS, as on a read-only mount (see the module docstring)."""
    base = str(root.resolve())

    def under(path: object) -> bool:
        try:
            return os.path.abspath(os.fsdecode(path)).startswith(base)  # type: ignore[arg-type]
        except TypeError:  # a file descriptor
            return False

    def refuse(path: object) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))  # type: ignore[arg-type]

    real_open, real_os_open, real_mkdir, real_replace, real_rename = builtins.open, os.open, os.mkdir, os.replace, os.rename

    def fake_open(file, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
        if under(file) and any(c in mode for c in "wax+"):
            refuse(file)
        return real_open(file, mode, *args, **kwargs)

    def fake_os_open(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if under(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            refuse(path)
        return real_os_open(path, flags, *args, **kwargs)

    def fake_mkdir(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if under(path):
            refuse(path)
        return real_mkdir(path, *args, **kwargs)

    def moving(real):  # type: ignore[no-untyped-def]
        def fake(src, dst, *args, **kwargs):  # type: ignore[no-untyped-def]
            if under(src) or under(dst):
                refuse(dst)
            return real(src, dst, *args, **kwargs)
        return fake

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(io, "open", fake_open)
    monkeypatch.setattr(os, "open", fake_os_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)
    monkeypatch.setattr(os, "replace", moving(real_replace))
    monkeypatch.setattr(os, "rename", moving(real_rename))


READ_ONLY = [
    (["run", "--resume", "{run}", "--rounds", "3"], "cannot resume"),
    (["report", "{run}"], "pass --out DIR to write it elsewhere"),
    (["diagnose", "{run}"], "cannot diagnose"),
    (["evaluate", "{run}", "--test-file", "{npz}"], "cannot evaluate"),
    (["analyze", "{run}"], "cannot analyze"),
]


@pytest.mark.parametrize("argv, needle", READ_ONLY, ids=[a[0] for a, _ in READ_ONLY])
def test_a_read_only_run_directory_is_one_line_not_errno_30(argv, needle, finished, tmp_path, monkeypatch, capsys):
    """Before: `fednorm X: error: [Errno 30] Read-only file system` and exit 1."""
    npz = tmp_path / "test.npz"
    np.savez(npz, x=np.zeros((4, 8, 8, 1), dtype=np.uint8), y=np.zeros(4, dtype=np.int64))
    args = [a.replace("{run}", str(finished)).replace("{npz}", str(npz)) for a in argv]
    before = _snapshot(finished)
    _read_only(monkeypatch, finished)
    code = main(args + (["--quiet"] if argv[0] == "run" else []))
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert code == 2, (code, err)
    line = _one_line(err, needle)
    assert "Read-only file system" in line and "[Errno" not in line
    assert _snapshot(finished) == before


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_second_ctrl_c_prints_the_resume_command(tmp_path, sig):
    """Two SIGINTs (or SIGTERMs): the first asks the run to stop after its round, the second stops
    it at once. Before: "fednorm run: interrupted" and nothing on how to go on, exit 130 for both."""
    out = tmp_path / "r"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "fednorm", "run", "--model", "mlp", "--num-clients", "2", "--batch-size", "4",
                             "--local-epochs", "200", "--rounds", "5", "--threads", "1", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (out / "checkpoint.pt").is_file():  # round 0's checkpoint: round 1 is training now
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(sig)
        first = proc.stderr.readline()  # the first signal has reached Python (two at once would arrive as one)
        assert "stopping after this round" in first, first
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + int(sig), err
    assert "Traceback" not in err
    assert f"continue from the last checkpoint with: fednorm run --resume {out}" in err.strip().splitlines()[-1], err
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"


def test_a_run_whose_directory_is_removed_fails_and_says_so(tmp_path, monkeypatch, capsys):
    """`rm -rf R` during round 2. Before: the next checkpoint re-created R holding a checkpoint
    alone, and the run printed its results and exit 0."""
    import fednorm.cli.progress as progress
    from fednorm.tracking.callback import Callback

    out = tmp_path / "r"

    class RemoveAtRound2(Callback):
        def on_round_end(self, record, sim):  # type: ignore[no-untyped-def]
            if record.server_round == 2:
                shutil.rmtree(out)

    monkeypatch.setattr(progress, "wants_lines", lambda stream=None: True)
    monkeypatch.setattr(progress, "ProgressLines", lambda *a, **k: RemoveAtRound2())
    args = [a for a in TINY if a != "--quiet"]
    for extra in ([], ["--eval-every", "4"]):  # found at the next metrics line, or at the next checkpoint
        code = main(["run", *args, "--rounds", "6", "--checkpoint-every", "3", *extra, "--out", str(out)])
        captured = capsys.readouterr()
        assert code == 1, captured
        line = _one_line(captured.err, f"the run directory {out} was removed while the run was training")
        assert "start the run again" in line and "--resume" not in line
        assert "run directory:" not in captured.out  # no report of success
        assert not out.exists()  # not re-created with a checkpoint alone
