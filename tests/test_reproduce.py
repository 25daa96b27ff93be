"""fednorm reproduce: the shipped table configs, caching, resuming, the report, the CLI.

Most tests use a tiny table on the embedded digits (written to a temporary configs folder), so they
need no data files; the end-to-end test of a shipped table skips when ../shared/data is absent.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import fednorm.api
from fednorm.cli.main import main
from fednorm.config import ExperimentConfig
from fednorm.data.partition import check_partition_args
from fednorm.engine.simulator import Simulation
from fednorm.errors import ConfigError, DatasetError
from fednorm.reproduce import PAPERS, collect, list_tables, load_paper, plan, run_state, validate_table, write_report
from fednorm.reproduce import runner
from fednorm.reproduce.suite import load_table

TINY = textwrap.dedent(
    """\
    paper: hbn
    table: tiny
    title: "A tiny table on the embedded digits"
    source: "tests/test_reproduce.py"
    claim: "a beats b"
    metric: test_accuracy
    compare: [final, best]
    seeds: 1
    base:
      dataset: digits
      partition: dirichlet
      alpha: 0.5
      num_clients: 4
      model: simple_cnn
      rounds: 40
      local_epochs: 1
      batch_size: 32
      lr: 0.05
      eval_every: 1
      checkpoint_every: 2
      seed: 3
    reduced:
      description: "4 rounds"
      set: {rounds: 4}
    rows:
      - {id: a, label: "A", set: {norm: bn}}
      - {id: b, label: "B", set: {norm: gn, norm_args: {num_groups: 2}}}
      - {id: c, label: "C", set: {norm: none}}
    columns:
      - {id: x, label: "alpha 0.5", set: {alpha: 0.5}}
      - {id: y, label: "alpha 0.1", set: {alpha: 0.1}}
    cells:
      a: {x: 80.0, y: {paper: 70.0, approx: true, note: "about 70"}}
      b: {x: 75.0, y: 60.0}
      c: {x: {skip: "no norm is not in this table"}, y: "qualitative only"}
    """
)


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: two threads on a busy 2-core machine spin in OpenMP barriers (a run took
    50x longer). Restored afterwards for the other test files."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny_configs(tmp_path: Path) -> Path:
    root = tmp_path / "configs"
    (root / "hbn").mkdir(parents=True)
    (root / "hbn" / "tiny.yaml").write_text(TINY)
    return root


def _tiny(root: Path):
    return load_paper("hbn", ["tiny"], root)


# -- the shipped tables ----------------------------------------------------------------------


@pytest.mark.parametrize("paper", PAPERS)
def test_shipped_tables_validate_at_both_scales(paper: str, tmp_path: Path) -> None:
    tables = load_paper(paper)
    assert tables, f"no table configs for {paper}"
    for table in tables:
        counts = validate_table(table)  # every cell through ExperimentConfig, full and reduced
        assert counts["full"] == counts["reduced"] == len(table.rows) * len(table.columns)
        assert table.reduced["description"].strip()
        # the paper's numbers are data: every row has at least one paper number or statement
        for row in table.rows:
            cells = [table.cell(row.id, c.id) for c in table.columns]
            assert any(c.paper is not None or c.paper_text or c.skip for c in cells) or row.id in ("silobn",), (table.id, row.id)
        for scale in ("full", "reduced"):
            specs = plan([table], scale=scale, out=tmp_path / scale)
            dirs = [s.dir for s in specs]
            assert len(dirs) == len(set(dirs))
            planned = {cell for s in specs for cell in s.cells}
            runnable = {(r.id, c.id) for r in table.rows for c in table.columns if not table.cell(r.id, c.id).skip}
            assert planned == runnable
            # full scale is the paper's setting; the reduced one is smaller
            rounds = {s.config["rounds"] for s in specs}
            if scale == "reduced":
                assert max(rounds) < table.paper_rounds(table.rows[0].id, table.columns[0].id)
            # no partition_args key the cell's partitioner would ignore (`fednorm run --config`
            # on a run's saved config.yaml refuses those)
            for s in specs:
                check_partition_args(s.config["partition"], s.config.get("partition_args") or {})


def test_docs_table_of_tables_agrees_with_list_and_plan(tmp_path: Path, capsys) -> None:
    """docs/reproduce.md's table of tables: its cells are those `fednorm reproduce --list` prints,
    its runs those the suite plans at the default seeds (what `--dry-run` counts)."""
    import re

    assert main(["reproduce", "--list"]) == 0
    listed, paper = {}, None
    for line in capsys.readouterr().out.splitlines():
        if not line.startswith(" "):
            paper = line.split(":")[0]
        elif m := re.match(r"\s+cells: (\d+) run", line):
            listed[(paper, table_id)] = int(m.group(1))
        elif m := re.match(r"  (\w+): ", line):
            table_id = m.group(1)
    text = (Path(__file__).resolve().parents[1] / "docs" / "reproduce.md").read_text()
    documented = {}
    for line in text[text.index("## The tables"):text.index("## Full and reduced scale")].splitlines():
        m = re.match(r"\| `(\w+)` \| `(\w+)`:.*\| (\d+)[^|]*\| (\d+)[^|]*\|$", line)
        if m:
            documented[(m.group(1), m.group(2))] = (int(m.group(3)), int(m.group(4)))
    assert set(documented) == set(listed) and listed, (sorted(documented), sorted(listed))
    for (paper, table_id), (cells, runs) in documented.items():
        assert cells == listed[(paper, table_id)], (paper, table_id)
        planned = plan(load_paper(paper, [table_id]), scale="full", out=tmp_path / paper)
        assert runs == len(planned), (paper, table_id, len(planned))


def test_table_file_errors_name_the_file(tmp_path: Path) -> None:
    (tmp_path / "hbn").mkdir()
    bad = tmp_path / "hbn" / "tiny.yaml"
    bad.write_text(TINY.replace("  a: {x: 80.0", "  zz: {x: 80.0"))
    with pytest.raises(ConfigError, match=r"tiny.yaml.*unknown row 'zz'"):
        load_table(bad)
    bad.write_text(TINY.replace("  lr: 0.05", "  lr: -1"))
    with pytest.raises(ConfigError, match=r"(?s)tiny.yaml: cell a/x at full scale.*lr"):
        validate_table(load_table(bad))
    bad.write_text(TINY.replace("reduced:\n  description: \"4 rounds\"\n", "reduced:\n"))
    with pytest.raises(ConfigError, match="reduced.description"):
        load_table(bad)


def test_plan_merges_settings_and_shares_identical_runs(tiny_configs: Path, tmp_path: Path) -> None:
    (table,) = _tiny(tiny_configs)
    specs = plan([table], scale="reduced", out=tmp_path, seeds=2, overrides={"device": "cpu", "threads": 1})
    by_cell = {cell: s for s in specs for cell in s.cells}
    assert ("c", "x") not in by_cell  # skipped
    a_y = next(s for s in specs if s.cells == [("a", "y")] and s.seed == 3)
    assert a_y.config["alpha"] == 0.1 and a_y.config["norm"] == "bn" and a_y.config["rounds"] == 4
    assert a_y.config["threads"] == 1 and a_y.dir == tmp_path.resolve() / "tiny" / "a__y" / "seed3"
    assert sorted({s.seed for s in specs}) == [3, 4]
    # a row whose setting makes two columns identical runs once for both
    (tiny_configs / "hbn" / "tiny.yaml").write_text(TINY.replace('set: {norm: none}', 'set: {norm: none, alpha: 0.3}'))
    (table,) = _tiny(tiny_configs)
    specs = plan([table], scale="reduced", out=tmp_path, seeds=1, columns=["x", "y"])
    c_runs = [s for s in specs if s.cells[0][0] == "c"]
    assert len(c_runs) == 1 and c_runs[0].cells == [("c", "y")]  # (c, x) is skipped


def test_a_shared_run_has_one_directory_whatever_the_column_selection(tiny_configs: Path, tmp_path: Path) -> None:
    """A run serving two columns lives in its first column's directory, also when only the
    second column is selected, so a later run of the whole table finds (and reports) it."""
    (tiny_configs / "hbn" / "tiny.yaml").write_text(
        TINY.replace("set: {norm: gn, norm_args: {num_groups: 2}}", "set: {norm: gn, norm_args: {num_groups: 2}, alpha: 0.3}"))
    (table,) = _tiny(tiny_configs)
    whole = {s.run_id: s for s in plan([table], scale="reduced", out=tmp_path, rows=["b"])}
    only_y = plan([table], scale="reduced", out=tmp_path, rows=["b"], columns=["y"])
    assert list(whole) == ["b__x"] and whole["b__x"].cells == [("b", "x"), ("b", "y")]
    assert [(s.run_id, s.dir, s.cells) for s in only_y] == [("b__x", whole["b__x"].dir, [("b", "y")])]


# -- running: caching, resuming ---------------------------------------------------------------


def _summaries(out: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime_ns for p in sorted(out.rglob("summary.json"))}


def test_cli_caches_finished_runs(tiny_configs: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    args = ["reproduce", "hbn", "--configs", str(tiny_configs), "--table", "tiny", "--scale", "reduced", "--out", str(out),
            "--no-plots", "--quiet"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "5 runs in 1 table(s): 5 new" in first and "[5/5]" in first
    mtimes = _summaries(out)
    assert len(mtimes) == 5
    for path in mtimes:
        assert json.loads(Path(path).read_text())["status"] == "completed"
        record = json.loads((Path(path).parent / "reproduce.json").read_text())
        assert record["invocations"][0]["command"].startswith("fednorm reproduce hbn")
        assert "commit" in record["invocations"][0]
    assert main(args) == 0
    second = capsys.readouterr().out
    assert "5 runs in 1 table(s): 5 done" in second and "[1/" not in second
    assert _summaries(out) == mtimes  # nothing was rerun
    results = json.loads((out / "results.json").read_text())
    cells = {(c["row"], c["column"]): c for c in results["tables"][0]["cells"]}
    assert cells[("c", "x")]["status"] == "skipped" and cells[("c", "x")]["reason"] == "no norm is not in this table"
    assert cells[("a", "x")]["status"] == "ok" and cells[("a", "x")]["stats"]["final"]["n"] == 1
    # --dry-run reports the same, runs nothing
    assert main(args + ["--dry-run"]) == 0
    assert capsys.readouterr().out.count("  done ") == 5


class _Interrupting(Simulation):
    """Stops (as on SIGINT) after training round 3, before it is logged: the last checkpoint is round 2."""

    def rounds(self):
        for record in super().rounds():
            if self.server_round >= 3:
                raise KeyboardInterrupt
            yield record


def test_interrupted_run_resumes_from_its_checkpoint(tiny_configs: Path, tmp_path: Path, monkeypatch) -> None:
    (table,) = _tiny(tiny_configs)
    (spec,) = plan([table], scale="reduced", out=tmp_path / "out", rows=["a"], columns=["x"])
    assert spec.config["checkpoint_every"] == 2 and spec.config["rounds"] == 4
    reference = fednorm.api.run({**spec.config, "out": str(tmp_path / "reference")}, progress=False)

    with pytest.raises(KeyboardInterrupt):
        fednorm.api.run(spec.config, progress=False, simulation=_Interrupting)
    summary = json.loads((spec.dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    state = run_state(spec)
    assert state.action == "resume"

    calls = []
    real_run = fednorm.api.run

    def spy(*args, **kwargs):
        calls.append(kwargs.get("resume"))
        return real_run(*args, **kwargs)

    monkeypatch.setattr(fednorm.api, "run", spy)
    outcome = runner.execute(spec, state, command="test")
    assert calls == [spec.dir]  # continued from the run directory, not started afresh
    assert outcome.status == "completed" and outcome.rounds == 4
    history = [json.loads(line) for line in (spec.dir / "metrics.jsonl").read_text().splitlines()]
    assert [h["round"] for h in history] == [1, 2, 3, 4]
    np.testing.assert_allclose([h["test_accuracy"] for h in history], [h["test_accuracy"] for h in reference.history])
    record = json.loads((spec.dir / runner.RECORD_NAME).read_text())
    assert [i["action"] for i in record["invocations"]] == ["resume"]
    assert run_state(spec).action == "done"

    # a longer plan extends the finished run; a shorter one or a changed setting is refused
    (longer,) = plan([table], scale="reduced", out=tmp_path / "out", rows=["a"], columns=["x"], overrides={"rounds": 6})
    assert run_state(longer).action == "extend"
    (shorter,) = plan([table], scale="reduced", out=tmp_path / "out", rows=["a"], columns=["x"], overrides={"rounds": 3})
    with pytest.raises(ConfigError, match="longer run"):
        run_state(shorter)
    (tiny_configs / "hbn" / "tiny.yaml").write_text(TINY.replace("lr: 0.05", "lr: 0.02"))
    (changed,) = plan(_tiny(tiny_configs), scale="reduced", out=tmp_path / "out", rows=["a"], columns=["x"])
    with pytest.raises(ConfigError, match=r"(?s)different experiment.*lr: 0.05 -> 0.02"):
        run_state(changed)


def test_a_run_held_by_another_process_is_left_alone(tiny_configs: Path, tmp_path: Path) -> None:
    """A run directory another live process holds (its writer lock) is not run; once that process
    is killed, its lock is stale and the run is taken over."""
    import signal
    import subprocess
    import sys

    (table,) = _tiny(tiny_configs)
    (spec,) = plan([table], scale="reduced", out=tmp_path, rows=["a"], columns=["x"])
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(spec.dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert run_state(spec).detail.startswith("being started by pid")
        outcome = runner.execute(spec, run_state(spec))
        assert outcome.status == "running elsewhere" and f"pid {holder.pid}" in outcome.error
        assert not (spec.dir / "summary.json").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert runner.lock_holder(spec.dir) is None  # the kernel dropped the dead process's lock
    assert runner.execute(spec, run_state(spec)).status == "completed"


HOLD_LOCK = """
import sys, time
from fednorm.engine.runlock import run_lock
with run_lock(sys.argv[1], "test"):
    print("held", flush=True)
    time.sleep(600)
"""


def _suite(tiny_configs: Path, out: Path, log: Path, *extra: str):
    """A ``fednorm reproduce`` process of the tiny table's rows a and b over two workers, in its own
    process group; output to a file (orphaned workers would hold a pipe open)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "fednorm.cli.main", "reproduce", "hbn", "--configs", str(tiny_configs), "--table", "tiny",
           "--rows", "a,b", "--columns", "x", "--jobs", "2", "--threads", "1", "--out", str(out), "--no-plots", "--quiet", *extra]
    with log.open("w") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _until(condition, proc, log: Path, seconds: float = 240) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not condition():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)


def _training(out: Path) -> bool:
    """Both runs have logged a round (a stop before the first round would leave 0 rounds)."""
    logs = list(out.rglob("metrics.jsonl"))
    return len(logs) == 2 and all(p.read_text().strip() for p in logs)


def _group_gone(pgid: int) -> bool:
    import time

    for _ in range(50):  # multiprocessing's resource tracker leaves when its pipe closes
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _kill_group(pgid: int) -> None:
    import signal

    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_two_workers_give_the_runs_one_process_gives(tiny_configs: Path, tmp_path: Path) -> None:
    proc = _suite(tiny_configs, tmp_path / "two", tmp_path / "log", "--scale", "reduced")
    try:
        assert proc.wait(timeout=300) == 0, (tmp_path / "log").read_text()
    finally:
        _kill_group(proc.pid)
    assert main(["reproduce", "hbn", "--configs", str(tiny_configs), "--table", "tiny", "--rows", "a,b", "--columns", "x",
                 "--scale", "reduced", "--out", str(tmp_path / "one"), "--no-plots", "--quiet"]) == 0
    for run in ("a__x", "b__x"):
        two, one = (json.loads(next((tmp_path / d).rglob(f"{run}/*/summary.json")).read_text()) for d in ("two", "one"))
        assert two["status"] == one["status"] == "completed"
        assert two["final_test_accuracy"] == one["final_test_accuracy"] and two["final_test_loss"] == one["final_test_loss"]


def test_sigterm_to_the_suite_alone_stops_its_workers_cleanly(tiny_configs: Path, tmp_path: Path) -> None:
    """``kill PID`` of a ``--jobs 2`` suite (a scheduler's, ``timeout``'s): the workers, which got
    no signal, stop after their round, checkpoint and record the invocation; the suite waits for
    them, writes its report and exits 143, and no worker outlives it (before, the suite died at once
    and its workers ran on, orphaned)."""
    import signal

    out, log = tmp_path / "out", tmp_path / "log"
    proc = _suite(tiny_configs, out, log, "--rounds", "100000")
    try:
        _until(lambda: _training(out), proc, log)
        os.kill(proc.pid, signal.SIGTERM)  # the parent only, not its process group
        rc = proc.wait(timeout=120)
        gone = _group_gone(proc.pid)
    finally:
        _kill_group(proc.pid)
    text = log.read_text()
    assert rc == 128 + signal.SIGTERM, text
    assert gone, "a worker outlived the suite"
    assert "interrupted; every started run has a checkpoint" in text and (out / "results.json").is_file()
    runs = sorted(p.parent for p in out.rglob("reproduce.json"))
    assert len(runs) == 2
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        (invocation,) = json.loads((run / runner.RECORD_NAME).read_text())["invocations"]
        assert summary["status"] == invocation["status"] == "interrupted"
        assert 0 < summary["rounds"] == invocation["rounds"] < 100000
        assert torch.load(run / "checkpoint.pt", weights_only=False)["server_round"] == summary["rounds"]
        assert not (run / runner.LOCK_NAME).exists()


def test_a_killed_worker_is_reported_and_the_others_go_on(tiny_configs: Path, tmp_path: Path) -> None:
    """SIGKILL to one worker (as the out-of-memory killer sends): its run is reported ``killed``
    at once, with the signal, and recorded; the other run goes on until the suite is stopped."""
    import signal
    import subprocess

    out, log = tmp_path / "out", tmp_path / "log"
    proc = _suite(tiny_configs, out, log, "--rounds", "100000")
    try:
        _until(lambda: _training(out), proc, log)
        children = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", str(proc.pid)], capture_output=True, text=True).stdout
        workers = [int(line.split()[0]) for line in children.splitlines() if "spawn_main" in line]
        assert len(workers) == 2, children
        os.kill(workers[0], signal.SIGKILL)
        _until(lambda: "killed after" in log.read_text(), proc, log, 60)
        before = {p.parent.parent.name: len(p.read_text().splitlines()) for p in out.rglob("metrics.jsonl")}
        _until(lambda: any(len(p.read_text().splitlines()) > before[p.parent.parent.name] + 2 for p in out.rglob("metrics.jsonl")),
               proc, log, 60)  # the other run still trains
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=120)
        gone = _group_gone(proc.pid)
    finally:
        _kill_group(proc.pid)
    text = log.read_text()
    assert rc == 128 + signal.SIGTERM and gone, text
    assert "SIGKILL" in text and "run the same command again" in text.lower()
    statuses = sorted(json.loads(p.read_text())["invocations"][-1]["status"] for p in out.rglob(runner.RECORD_NAME))
    assert statuses == ["interrupted", "killed"], statuses


# -- the report -------------------------------------------------------------------------------


def _fake_run(spec: runner.RunSpec, seed: int, accs: list[float], status: str = "completed", engine_wall: float = 1.0) -> None:
    """A run directory with known accuracies, as the engine and the runner write it (the runner
    timed 2 s of invocations; the engine's own clock says ``engine_wall``)."""
    d = spec.dir.parent / f"seed{seed}"
    d.mkdir(parents=True)
    cfg = ExperimentConfig(**{**spec.config, "seed": seed, "out": str(d)})
    (d / "config.yaml").write_text(cfg.to_yaml())
    (d / "metrics.jsonl").write_text("".join(json.dumps({"round": r + 1, "test_accuracy": a}) + "\n" for r, a in enumerate(accs)))
    (d / "summary.json").write_text(json.dumps({"status": status, "rounds": len(accs), "seed": seed, "wall_seconds": engine_wall}))
    (d / runner.RECORD_NAME).write_text(json.dumps({"wall_seconds": 2.0, "invocations": [
        {"commit": "abc123", "dirty": False, "command": "fednorm reproduce hbn"}]}))


def test_report_from_known_run_summaries(tiny_configs: Path, tmp_path: Path) -> None:
    (table,) = _tiny(tiny_configs)
    out = tmp_path / "out"
    specs = {cell: s for s in plan([table], scale="reduced", out=out) for cell in s.cells}
    rng = np.random.default_rng(0)
    curves = {}
    for cell, seeds in ((("a", "x"), [3, 4, 5]), (("b", "x"), [3, 4]), (("a", "y"), [3])):
        for seed in seeds:
            accs = list(rng.uniform(0.1, 0.9, size=12))
            curves.setdefault(cell, []).append(accs)
            # seed 5: an invocation was killed (not in reproduce.json), the engine's clock counted it
            _fake_run(specs[cell], seed, accs, engine_wall=7.0 if seed == 5 else 1.0)
    _fake_run(specs[("b", "y")], 3, [0.5, 0.6], status="interrupted")
    results = collect([table], scale="reduced", out=out)
    cells = {(c["row"], c["column"]): c for c in results["tables"][0]["cells"]}

    for cell, runs in curves.items():
        got = cells[cell]
        finals = [100 * r[-1] for r in runs]
        bests = [100 * max(r) for r in runs]
        last10 = [100 * float(np.mean(r[-10:])) for r in runs]
        for stat, values in (("final", finals), ("best", bests), ("last10", last10)):
            assert got["stats"][stat]["mean"] == pytest.approx(float(np.mean(values)))
            assert got["stats"][stat]["n"] == len(values)
            if len(values) > 1:
                assert got["stats"][stat]["std"] == pytest.approx(float(np.std(values, ddof=1)))
            else:
                assert got["stats"][stat]["std"] is None
        paper = {("a", "x"): 80.0, ("b", "x"): 75.0, ("a", "y"): 70.0}[cell]
        assert got["diff"]["final"] == pytest.approx(float(np.mean(finals)) - paper)
        assert got["diff"]["best"] == pytest.approx(float(np.mean(bests)) - paper)
        assert got["status"] == "ok"
    # wall time per cell: each run's larger clock (runner 2 s, engine 1 s, or the engine's 7 s)
    assert {c: cells[c]["wall_seconds"] for c in curves} == {("a", "x"): 2 + 2 + 7, ("b", "x"): 2 + 2, ("a", "y"): 2}
    assert cells[("b", "y")]["status"] == "interrupted" and cells[("b", "y")]["stats"]["final"]["n"] == 0
    assert "at round 2" in cells[("b", "y")]["reason"]
    assert cells[("c", "x")]["status"] == "skipped"
    assert cells[("c", "y")]["status"] == "not run" and cells[("c", "y")]["paper_text"] == "qualitative only"

    # the ordering in column x: the paper has a (80) > b (75); ours by the final accuracy
    order = results["tables"][0]["ordering"]["x"]
    ours_a, ours_b = (statistics.fmean(100 * r[-1] for r in curves[(k, "x")]) for k in ("a", "b"))
    assert order["pairs"] == 1 and order["holds"] == (ours_a > ours_b)
    assert results["tables"][0]["ordering"]["y"]["holds"] is None  # b/y has no completed run

    paths = write_report(results, plots=True)
    text = paths["report"].read_text()
    a_x = cells[("a", "x")]["stats"]["final"]
    assert f"{a_x['mean']:.2f} ± {a_x['std']:.2f}" in text
    assert "no norm is not in this table" in text and "qualitative only" in text and "4 rounds" in text
    assert json.loads(paths["results"].read_text())["tables"][0]["table"] == "tiny"
    assert (out / "plots" / "tiny_curves.png").is_file() and (out / "plots" / "tiny_bars.png").is_file()
    # --report-only rebuilds the same numbers from the run directories
    os.remove(paths["report"])
    assert main(["reproduce", "hbn", "--configs", str(tiny_configs), "--table", "tiny", "--scale", "reduced", "--out", str(out),
                 "--report-only", "--no-plots"]) == 0
    assert f"{a_x['mean']:.2f} ± {a_x['std']:.2f}" in paths["report"].read_text()


# -- user mistakes: one clear line, no traceback ----------------------------------------------


def test_cli_errors_are_clear(tiny_configs: Path, tmp_path: Path, capsys) -> None:
    assert main(["reproduce", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown paper 'nope'" in err and "hbn, fedtan, fbn, ln, fedbn" in err and "Traceback" not in err
    assert main(["reproduce", "hbn", "--table", "table99"]) == 2
    err = capsys.readouterr().err
    assert "unknown table 'table99'" in err and "table1" in err
    assert main(["reproduce", "hbn", "--table", "table1", "--rows", "bn,zz"]) == 2
    assert "unknown row 'zz'" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    code = main(["reproduce", "hbn", "--table", "table1", "--scale", "reduced", "--rows", "bn", "--columns", "phi0.6",
                 "--data-dir", str(empty), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err  # missing data is bad input (issue 19)
    assert str(empty) in err and "cifar10" in err and "--data-dir" in err
    # without --table a paper's table whose data is missing is skipped with the same message; when
    # nothing could run, the exit status says so
    code = main(["reproduce", "hbn", "--scale", "reduced", "--rows", "bn", "--columns", "phi0.6", "--data-dir", str(empty),
                 "--out", str(tmp_path / "out2"), "--no-plots"])
    err = capsys.readouterr().err
    assert code == 1 and "skipping hbn/table1" in err and "not run for missing data: table1" in err
    assert "data missing" in (tmp_path / "out2" / "report.md").read_text()
    assert main(["reproduce", "--list"]) == 0
    listing = capsys.readouterr().out
    for paper in PAPERS:
        assert f"{paper}: " in listing and list_tables(paper)[0] in listing


def test_missing_data_is_a_dataset_error(tmp_path: Path) -> None:
    (table,) = load_paper("fedtan", ["table1"])
    specs = plan([table], scale="full", out=tmp_path, data_dir=str(tmp_path), rows=["fedtan"], columns=["iid"])
    with pytest.raises(DatasetError, match="--data-dir"):
        runner.prepare_data(table, specs, source_dir=str(tmp_path), out=tmp_path)
    assert runner.data_missing_file(tmp_path, "table1").is_file()


# -- one shipped table end to end on the real data ----------------------------------------------


def test_shipped_table_reduced_end_to_end(shared_data: Path, tmp_path: Path, capsys) -> None:
    """HBN Table 1 at its reduced scale through the CLI (two rows, one column: about 5 s)."""
    out = tmp_path / "hbn"
    code = main(["reproduce", "hbn", "--table", "table1", "--scale", "reduced", "--seeds", "1", "--rows", "bn,hbn",
                 "--columns", "phi0.6", "--data-dir", str(shared_data), "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "[2/2]" in printed
    results = json.loads((out / "results.json").read_text())
    # the report covers every table of the paper (table4 too, not run here)
    assert [t["table"] for t in results["tables"]] == list_tables("hbn")
    t = next(t for t in results["tables"] if t["table"] == "table1")
    cells = {(c["row"], c["column"]): c for c in t["cells"]}
    for row in ("bn", "hbn"):
        cell = cells[(row, "phi0.6")]
        assert cell["status"] == "ok" and cell["rounds"] == [3] and cell["paper_rounds"] == 500
        assert 0.0 <= cell["stats"]["final"]["mean"] <= 100.0
        assert cell["diff"]["best"] == pytest.approx(cell["stats"]["best"]["mean"] - cell["paper"])
    assert cells[("gn", "phi0.6")]["status"] == "not run"
    subset = yaml.safe_load((out / "table1" / "bn__phi0.6" / "seed42" / "config.yaml").read_text())["data_dir"]
    assert Path(subset).parent == out.resolve() / "_data"
    text = (out / "report.md").read_text()
    assert "HBN Table 1" in text and "75.82" in text and "3 of 500" in text
    assert (out / "plots" / "table1_curves.png").is_file()


def _interrupt_and_export(configs: Path, tmp_path: Path):
    """The tiny table's cell (a, x) run uninterrupted (the reference) and interrupted after round 2,
    then exported with its checkpoint: (spec, reference, CLI arguments, work, dest, exported run)."""
    (table,) = _tiny(configs)
    work, dest = tmp_path / "work", tmp_path / "committed"
    (spec,) = plan([table], scale="reduced", out=work, rows=["a"], columns=["x"])
    reference = fednorm.api.run({**spec.config, "out": str(tmp_path / "reference")}, progress=False)
    with pytest.raises(KeyboardInterrupt):
        fednorm.api.run(spec.config, progress=False, simulation=_Interrupting)
    common = ["reproduce", "hbn", "--configs", str(configs), "--table", "tiny", "--scale", "reduced",
              "--rows", "a", "--columns", "x", "--no-plots", "--quiet"]
    assert main(common + ["--out", str(work), "--report-only", "--export", str(dest), "--export-checkpoints"]) == 0
    return spec, reference, common, work, dest, dest / spec.dir.relative_to(work)


def test_export_keeps_results_and_lets_an_unfinished_run_resume_from_a_copy(tiny_configs: Path, tmp_path: Path) -> None:
    """A session ends mid-run: --export --export-checkpoints writes the records and the checkpoint
    to a folder to commit; the next session resumes from a copy of it and ends with the numbers
    of an uninterrupted run; exporting again drops the finished run's checkpoint, and an older
    working copy never overwrites a result that is further along."""
    spec, reference, common, work, dest, exported = _interrupt_and_export(tiny_configs, tmp_path)
    assert (exported / "checkpoint.pt").is_file() and (exported / "metrics.jsonl").is_file()
    assert json.loads((exported / "summary.json").read_text())["status"] == "interrupted"
    assert (dest / "report.md").is_file() and (dest / "results.json").is_file()
    stopped = {(c["row"], c["column"]): c for c in json.loads((dest / "results.json").read_text())["tables"][0]["cells"]}
    last = json.loads((exported / "metrics.jsonl").read_text().splitlines()[-1])
    assert f"last evaluation {100 * last['test_accuracy']:.2f}% at round {last['round']}" in stopped[("a", "x")]["reason"]
    # a report at a shorter --rounds still measures the unfinished run against the length it was started for
    assert main(common + ["--out", str(work), "--report-only", "--rounds", "1"]) == 0
    shorter = {(c["row"], c["column"]): c for c in json.loads((work / "results.json").read_text())["tables"][0]["cells"]}
    assert spec.config["rounds"] != 1 and f" of {spec.config['rounds']}, last evaluation" in shorter[("a", "x")]["reason"]

    session2 = tmp_path / "session2"
    shutil.copytree(dest, session2)
    assert main(common + ["--out", str(session2), "--export", str(dest)]) == 0
    resumed = session2 / spec.dir.relative_to(work)
    record = json.loads((resumed / runner.RECORD_NAME).read_text())
    assert [i["action"] for i in record["invocations"]] == ["resume"]
    history = [json.loads(line) for line in (exported / "metrics.jsonl").read_text().splitlines()]
    assert [h["round"] for h in history] == [1, 2, 3, 4]
    np.testing.assert_allclose([h["test_accuracy"] for h in history], [h["test_accuracy"] for h in reference.history])
    assert json.loads((exported / "summary.json").read_text())["status"] == "completed"
    assert not (exported / "checkpoint.pt").exists()  # finished: the records are the result
    cells = {(c["row"], c["column"]): c for c in json.loads((dest / "results.json").read_text())["tables"][0]["cells"]}
    assert cells[("a", "x")]["status"] == "ok"

    # exporting the stale first working copy leaves the finished result alone
    assert main(common + ["--out", str(work), "--report-only", "--export", str(dest)]) == 0
    assert json.loads((exported / "summary.json").read_text())["status"] == "completed"
    assert len((exported / "metrics.jsonl").read_text().splitlines()) == 4


def test_export_compacts_a_dsgd_checkpoint_and_a_copy_resumes_to_the_same_run(tmp_path: Path) -> None:
    """A DSGD run's exported checkpoint keeps only the clients' mean momentum (smaller, and said in
    the record); resumed from a copy, the run ends with the uninterrupted run's numbers (float64)."""
    root = tmp_path / "configs"
    (root / "hbn").mkdir(parents=True)
    row = '{id: a, label: "A", set: {norm: fbn, method: fbn, dsgd: true, momentum: 0.9, dtype: float64}}'
    (root / "hbn" / "tiny.yaml").write_text(TINY.replace('{id: a, label: "A", set: {norm: bn}}', row))
    spec, reference, common, work, dest, exported = _interrupt_and_export(root, tmp_path)
    source_bytes, exported_bytes = (spec.dir / "checkpoint.pt").stat().st_size, (exported / "checkpoint.pt").stat().st_size
    (entry,) = json.loads((exported / runner.RECORD_NAME).read_text())["compacted_checkpoints"]
    assert entry == {"round": 2, "clients": 4, "bytes": source_bytes, "compacted_bytes": exported_bytes}
    assert exported_bytes < 0.6 * source_bytes  # 4 momenta and the model became 1 and the model

    session2 = tmp_path / "session2"
    shutil.copytree(dest, session2)
    assert main(common + ["--out", str(session2), "--export", str(dest)]) == 0
    history = [json.loads(line) for line in (exported / "metrics.jsonl").read_text().splitlines()]
    assert [h["round"] for h in history] == [1, 2, 3, 4]
    for key in ("test_accuracy", "test_loss"):
        np.testing.assert_allclose([h[key] for h in history], [h[key] for h in reference.history], rtol=1e-9)
    record = json.loads((exported / runner.RECORD_NAME).read_text())
    assert [i["action"] for i in record["invocations"]] == ["resume"] and record["compacted_checkpoints"] == [entry]
    assert "completed (resumed at round 2 from the clients' mean momentum)" in (dest / "report.md").read_text()


def test_export_keeps_every_momentum_when_the_partition_does_not_match(tmp_path: Path) -> None:
    """A DSGD checkpoint whose partition.json names other clients is exported whole, with a warning."""
    from fednorm.engine.checkpoint import save_checkpoint
    from fednorm.reproduce.export import export_runs

    cfg = ExperimentConfig(dataset="digits", partition="iid", num_clients=3, rounds=5, batch_size=64, model="mlp",
                           norm="fbn", method="fbn", dsgd=True, momentum=0.9)
    sim = Simulation(cfg)
    sim.step()
    run = _export_run(tmp_path / "work", 1, "interrupted")
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    (run / "partition.json").write_text(json.dumps({"train_label_counts": [[5, 5]] * 4}))  # 4 clients, not 3
    save_checkpoint(run, sim.state_dict())
    with pytest.warns(UserWarning, match="exported whole"):
        done = export_runs(tmp_path / "work", tmp_path / "dest", checkpoints=True)
    assert len(done.checkpoints) == 1 and not done.compacted
    assert (done.checkpoints[0]).read_bytes() == (run / "checkpoint.pt").read_bytes()


def test_the_per_run_line_gives_last_10_as_the_last_10_rounds(tmp_path: Path, capsys) -> None:
    """A run evaluated every 2nd round has no last-10 (rounds R-9 to R), as in the report and, since
    issue 50, in the run's own summary.json, not the mean of its last evaluations."""
    root = tmp_path / "configs"
    (root / "hbn").mkdir(parents=True)
    (root / "hbn" / "tiny.yaml").write_text(TINY.replace("eval_every: 1", "eval_every: 2"))
    code = main(["reproduce", "hbn", "--configs", str(root), "--table", "tiny", "--scale", "reduced", "--rows", "a",
                 "--columns", "x", "--no-plots", "--quiet", "--out", str(tmp_path / "out")])
    assert code == 0
    (line,) = [l for l in capsys.readouterr().out.splitlines() if l.startswith("[1/1]")]
    assert "last-10 n/a" in line
    summary = json.loads(next((tmp_path / "out").glob("tiny/*/seed*/summary.json")).read_text())
    assert summary["last10_mean_test_accuracy"] is None  # one meaning everywhere (issue 50): the summary agrees with the line


def _export_run(root: Path, rounds: int, status: str) -> Path:
    run = root / "t" / "row__col" / "seed0"
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text(f"rounds: {rounds}\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"round": r}) + "\n" for r in range(1, rounds + 1)))
    (run / "summary.json").write_text(json.dumps({"status": status, "rounds": rounds}))
    return run


@pytest.mark.parametrize("dest_rounds, dest_status, replaced", [
    (3, "completed", True),     # finished at a stated fraction, extended elsewhere: the extension wins
    (6, "interrupted", False),  # more rounds there
    (5, "completed", False),    # as many rounds and finished there
    (5, "interrupted", True),
])
def test_export_replaces_a_run_only_when_the_source_is_further_along(
        tmp_path: Path, dest_rounds: int, dest_status: str, replaced: bool) -> None:
    from fednorm.reproduce.export import export_runs

    _export_run(tmp_path / "work", 5, "interrupted")
    target = _export_run(tmp_path / "dest", dest_rounds, dest_status)
    done = export_runs(tmp_path / "work", tmp_path / "dest")
    assert (len(done.copied), len(done.kept)) == ((1, 0) if replaced else (0, 1))
    rounds = len((target / "metrics.jsonl").read_text().splitlines())
    assert rounds == (5 if replaced else dest_rounds)


def test_export_checkpoints_needs_export(capsys) -> None:
    assert main(["reproduce", "hbn", "--export-checkpoints"]) == 2
    assert "--export DIR" in capsys.readouterr().err


@pytest.mark.parametrize("paper_rounds, limit, kept", [
    (10, 0, True),   # a stated fraction: kept whatever its size, to be extended
    (3, 0, False),   # finished at the paper's rounds and over the limit: the records are the result
    (3, 5, True),    # finished and small: kept for `fednorm diagnose`
    (3, 4, False),   # one byte over the limit
])
def test_export_keeps_the_checkpoint_of_a_stated_fraction_or_a_small_finished_run(
        tmp_path: Path, paper_rounds: int, limit: int, kept: bool) -> None:
    """A full-scale run finished at --rounds 3 of the paper's 10 will be extended: its checkpoint
    is exported; at the paper's rounds it goes along only when it is at most the limit."""
    from fednorm.reproduce.export import export_runs

    run = tmp_path / "work" / "t" / "row__col" / "seed0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("rounds: 3\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"round": r}) + "\n" for r in (1, 2, 3)))
    (run / "summary.json").write_text(json.dumps({"status": "completed", "rounds": 3}))
    (run / runner.RECORD_NAME).write_text(json.dumps({"scale": "full", "paper_rounds": paper_rounds}))
    (run / "checkpoint.pt").write_bytes(b"state")  # 5 bytes
    target = tmp_path / "dest" / "t" / "row__col" / "seed0" / "checkpoint.pt"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"stale")  # an earlier export's: replaced, or removed with the run finished
    done = export_runs(tmp_path / "work", tmp_path / "dest", checkpoints=True, finished_limit=limit)
    assert len(done.copied) == 1
    assert target.is_file() == kept and (done.checkpoints == [target]) == kept


def test_export_without_checkpoints_keeps_an_unfinished_runs_committed_checkpoint(tmp_path: Path) -> None:
    """Exporting records only (no --export-checkpoints) onto a committed folder must not delete the
    checkpoint an unfinished run resumes from (it deleted HBN Table 1's fbn_exact checkpoint)."""
    from fednorm.reproduce.export import export_runs

    _export_run(tmp_path / "work", 5, "interrupted")
    target = _export_run(tmp_path / "dest", 5, "interrupted")
    (target / "checkpoint.pt").write_bytes(b"state")
    export_runs(tmp_path / "work", tmp_path / "dest")
    assert (target / "checkpoint.pt").read_bytes() == b"state"
    _export_run(tmp_path / "work", 5, "completed")  # once the run has finished, its old checkpoint goes
    export_runs(tmp_path / "work", tmp_path / "dest")
    assert not (target / "checkpoint.pt").exists()


def test_a_tree_with_uncommitted_package_changes_is_refused_unless_allowed(tiny_configs: Path, tmp_path: Path,
                                                                          monkeypatch, capsys) -> None:
    """A reproduce run records its commit; from a dirty tree that commit does not describe the code."""
    monkeypatch.delenv("FEDNORM_ALLOW_DIRTY", raising=False)
    dirty = {"commit": "a" * 40, "dirty": True, "changed": ["fednorm/api.py", "configs/x.yaml", "fednorm/b.py", "fednorm/c.py"],
             "diff_sha256": "d" * 64}
    monkeypatch.setattr(runner, "git_info", lambda repo=None: dict(dirty))
    common = ["reproduce", "hbn", "--configs", str(tiny_configs), "--table", "tiny", "--scale", "reduced", "--rows", "a",
              "--columns", "x", "--no-plots", "--quiet", "--out", str(tmp_path / "out")]
    assert main(common) == 2
    err = capsys.readouterr().err
    assert "uncommitted changes to fednorm/api.py, configs/x.yaml, fednorm/b.py and 1 more" in err and "--allow-dirty" in err
    assert not list((tmp_path / "out").rglob(runner.RECORD_NAME))
    assert main(common + ["--allow-dirty"]) == 0
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "out").rglob(runner.RECORD_NAME)]
    (inv,) = record["invocations"]
    assert inv["dirty"] is True and inv["diff_sha256"] == "d" * 64 and inv["status"] == "completed"
    report = (tmp_path / "out" / "report.md").read_text()
    assert "aaaaaaaaaa+dirty:dddddddd" in report


def test_git_info_sees_only_the_package_and_configs(tmp_path: Path) -> None:
    import subprocess

    repo = tmp_path / "repo"
    (repo / "fednorm").mkdir(parents=True)
    (repo / "fednorm" / "a.py").write_text("x = 1\n")
    (repo / "REPRODUCTION.md").write_text("results\n")
    for cmd in (["init", "-q"], ["add", "."], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"]):
        subprocess.run(["git", "-C", str(repo), *cmd], check=True)
    assert runner.git_info(repo)["dirty"] is False
    (repo / "REPRODUCTION.md").write_text("more results\n")  # records and docs do not make a run's code
    assert runner.git_info(repo)["dirty"] is False
    (repo / "fednorm" / "a.py").write_text("x = 2\n")
    info = runner.git_info(repo)
    assert info["dirty"] is True and info["changed"] == ["fednorm/a.py"] and len(info["diff_sha256"]) == 64


def test_a_killed_suite_leaves_the_invocation_it_started(tiny_configs: Path, tmp_path: Path) -> None:
    """The record is written when the run starts: SIGKILL to the whole suite (no parent left to
    report it) still leaves the commit and command of the invocation, marked running."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "fednorm", "reproduce", "hbn", "--configs", str(tiny_configs), "--table",
                             "tiny", "--scale", "reduced", "--rows", "a", "--columns", "x", "--rounds", "100000", "--quiet",
                             "--no-plots", "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not any(p.read_text().count("\n") >= 2 for p in out.rglob("metrics.jsonl")):
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (record,) = [json.loads(p.read_text()) for p in out.rglob(runner.RECORD_NAME)]
    (inv,) = record["invocations"]
    assert inv["status"] == "running" and inv["pid"] == proc.pid and "--rounds 100000" in inv["command"]
    assert "commit" in inv


def test_the_next_invocation_closes_a_killed_ones_entry(tiny_configs: Path, tmp_path: Path) -> None:
    """A suite killed outright leaves its entry ``running``; the invocation that resumes the run
    completes it with what the killed one kept: the rounds of the checkpoint it resumes from and the
    engine's time to that round, read here from the metrics before the resume."""
    import signal
    import subprocess
    import sys
    import time

    from fednorm.engine.checkpoint import saved_round

    out = tmp_path / "out"
    args = [sys.executable, "-m", "fednorm", "reproduce", "hbn", "--configs", str(tiny_configs), "--table", "tiny",
            "--scale", "reduced", "--rows", "a", "--columns", "x", "--quiet", "--no-plots", "--out", str(out)]
    proc = subprocess.Popen([*args, "--rounds", "100000"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not any(p.read_text().count("\n") >= 5 for p in out.rglob("metrics.jsonl")):  # a checkpoint at round 4
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (run,) = [p.parent for p in out.rglob(runner.RECORD_NAME)]
    reached = saved_round(run)
    assert reached is not None and reached >= 4
    walls = {r["round"]: r["wall_seconds"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    done = subprocess.run([*args, "--rounds", str(reached + 2)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    record = json.loads((run / runner.RECORD_NAME).read_text())
    killed, resumed = record["invocations"]
    assert killed["pid"] == proc.pid and killed["status"] == "killed" and killed["rounds"] == reached
    assert killed["wall_seconds"] == pytest.approx(walls[reached], abs=1e-3) and killed["wall_seconds"] > 0
    assert resumed["action"] == "resume" and resumed["status"] == "completed" and resumed["rounds"] == reached + 2
    assert record["wall_seconds"] == pytest.approx(killed["wall_seconds"] + resumed["wall_seconds"])


def test_only_the_latest_killed_entry_gets_the_runs_rounds(tmp_path: Path) -> None:
    """Two killed entries in a row (a record from before entries were closed): the older one was
    followed by another invocation, so its rounds are unknown; the latest kept the run up to its
    checkpoint, from where its predecessor left it. A killed worker timed by its parent keeps that time."""
    from fednorm.engine.checkpoint import save_checkpoint

    save_checkpoint(tmp_path, {"server_round": 30})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "wall_seconds": 1.5 * r}) + "\n"
                                                    for r in range(10, 41, 10)))
    invs = [{"action": "new", "status": "completed", "rounds": 10, "wall_seconds": 15.0, "pid": 1},
            {"action": "extend", "status": "running", "rounds": None, "wall_seconds": 0.0, "pid": 2},
            {"action": "resume", "status": "running", "rounds": None, "wall_seconds": 0.0, "pid": 3}]
    runner.close_interrupted(tmp_path, invs, current_pid=4)
    assert invs[0]["status"] == "completed" and invs[0]["rounds"] == 10
    assert invs[1]["status"] == "killed" and invs[1]["rounds"] is None and invs[1]["wall_seconds"] is None
    # the latest: its predecessor's rounds are unknown, so where it started is too
    assert invs[2]["status"] == "killed" and invs[2]["rounds"] is None and invs[2]["wall_seconds"] is None
    invs = [{"action": "new", "status": "completed", "rounds": 10, "wall_seconds": 15.0, "pid": 1},
            {"action": "extend", "status": "running", "rounds": None, "wall_seconds": 0.0, "pid": 2}]
    runner.close_interrupted(tmp_path, invs, current_pid=4)
    assert invs[1]["status"] == "killed" and invs[1]["rounds"] == 30 and invs[1]["wall_seconds"] == pytest.approx(1.5 * 20)
    stacked = [{"action": "new", "status": "running", "rounds": None, "wall_seconds": 0.0, "pid": 2, "stacked_with": 3}]
    runner.close_interrupted(tmp_path, stacked, current_pid=4)  # the stack's clock, shared as a finished stack's is
    assert stacked[0]["rounds"] == 30 and stacked[0]["wall_seconds"] == pytest.approx(1.5 * 30 / 3)
    own = [{"action": "new", "status": "running", "rounds": None, "wall_seconds": 0.0, "pid": 2, "stacked_with": 3,
            "engine_clock": "per run"}]
    runner.close_interrupted(tmp_path, own, current_pid=4)  # a clock that counts the run's own share already
    assert own[0]["rounds"] == 30 and own[0]["wall_seconds"] == pytest.approx(1.5 * 30)
    timed = [{"action": "new", "status": "killed", "rounds": None, "wall_seconds": 7.0, "pid": 5}]
    runner.close_interrupted(tmp_path, timed, current_pid=6)
    assert timed[0]["rounds"] == 30 and timed[0]["wall_seconds"] == 7.0
    again = [dict(i) for i in invs]
    runner.close_interrupted(tmp_path, again, current_pid=7)  # closed entries are left as they are
    assert again == invs


def test_data_that_loads_but_cannot_be_split_as_the_table_needs_is_missing_data(tiny_configs: Path, tmp_path: Path,
                                                                                 monkeypatch) -> None:
    """Digits-5 with two of its five domains loads, then cannot give five one-domain clients: the
    table is reported as missing data (a suite over every table skips it) instead of stopping the suite."""
    from fednorm.errors import DatasetError, PartitionError

    (table,) = _tiny(tiny_configs)
    specs = plan([table], scale="reduced", out=tmp_path, rows=["a"], columns=["x"])

    def impossible(config):
        raise PartitionError("num_clients=5 is not a multiple of the 2 sources")

    class TwoDomains:  # a multi-source test split that loads (two of the sources the table needs)
        domains = [0, 1]

    monkeypatch.setattr(runner, "_data_for", impossible)
    monkeypatch.setattr("fednorm.data.datasets.load_dataset", lambda *a, **k: TwoDomains())
    with pytest.raises(DatasetError, match="cannot be split as hbn/tiny needs: num_clients=5"):
        runner.prepare_data(table, specs, source_dir=None, out=tmp_path)
    assert runner.data_missing_file(tmp_path, "tiny").is_file()


def test_a_finished_run_is_scored_on_the_tables_other_test_sets_and_the_report_shows_it(tiny_configs: Path,
                                                                                        tmp_path: Path) -> None:
    """extra_tests: every finished full-scale run is also evaluated on those files of the data folder
    (CIFAR-10's 1,000 lossless test images beside the JPEG copy), and the report gives their accuracy."""
    from fednorm.data.datasets import load_dataset
    from fednorm.reproduce.report import collect
    from fednorm.reproduce.report_markdown import markdown

    (table,) = _tiny(tiny_configs)
    table.extra_tests = ["own.npz"]
    (spec,) = plan([table], scale="full", out=tmp_path / "out", rows=["a"], columns=["x"], overrides={"rounds": 2})
    test = load_dataset("digits", train=False)
    np.savez(tmp_path / "own.npz", x=test.data, y=np.asarray(test.targets))  # the run's own test images
    spec.config["data_dir"] = str(tmp_path)
    assert spec.extra_tests == ["own.npz"]
    outcome = runner.execute(spec, run_state(spec))
    assert outcome.status == "completed"
    entry = json.loads((spec.dir / "evaluation.json").read_text())["own.npz"]
    assert entry["accuracy"] == pytest.approx(outcome.summary["final_test_accuracy"], abs=1e-12)
    results = collect([table], scale="full", out=tmp_path / "out", overrides={"rounds": 2})
    (cell,) = [c for c in results["tables"][0]["cells"] if (c["row"], c["column"]) == ("a", "x")]
    assert cell["stats"]["test:own.npz"]["mean"] == pytest.approx(100 * entry["accuracy"])
    assert "Final accuracy on `own.npz`" in markdown(results)


def test_export_carries_the_scores_on_other_test_sets_and_keeps_the_copys_current_ones(tmp_path: Path) -> None:
    """A finished run's lossless-subset score (evaluation.json) reaches the committed copy; a score
    made on the copy itself for the same round survives the export, one of an older round does not."""
    from fednorm.reproduce.export import EVALUATION, export_runs

    run = _export_run(tmp_path / "work", 5, "completed")
    (run / EVALUATION).write_text(json.dumps({"lossless.npz": {"round": 5, "accuracy": 0.7}}))
    target = _export_run(tmp_path / "dest", 4, "interrupted")
    (target / EVALUATION).write_text(json.dumps({"original.npz": {"round": 4, "accuracy": 0.5}}))
    export_runs(tmp_path / "work", tmp_path / "dest")
    assert json.loads((target / EVALUATION).read_text()) == {"lossless.npz": {"round": 5, "accuracy": 0.7}}
    (target / EVALUATION).write_text(json.dumps({"original.npz": {"round": 5, "accuracy": 0.72}}))
    export_runs(tmp_path / "work", tmp_path / "dest")  # as far along: replaced, the copy's round-5 score kept
    assert json.loads((target / EVALUATION).read_text()) == {
        "original.npz": {"round": 5, "accuracy": 0.72}, "lossless.npz": {"round": 5, "accuracy": 0.7}}


def test_export_never_replaces_a_finished_run_by_another_finished_record(tmp_path: Path) -> None:
    """A working copy holding an older finished run of a cell (a run since rerun and committed)
    must not overwrite the committed run: it did, when both had 500 rounds."""
    from fednorm.reproduce.export import export_runs

    stale = _export_run(tmp_path / "work", 5, "completed")
    (stale / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "acc": 0.1}) + "\n" for r in range(1, 6)))
    target = _export_run(tmp_path / "dest", 5, "completed")
    committed = (target / "metrics.jsonl").read_text()
    done = export_runs(tmp_path / "work", tmp_path / "dest")
    assert done.kept == [target] and (target / "metrics.jsonl").read_text() == committed


def test_export_drops_the_scores_of_the_run_it_replaces(tmp_path: Path) -> None:
    """A score in the committed copy belongs to the run that was there: when another run of the
    cell replaces it (both interrupted at round 5), the score goes with it."""
    from fednorm.reproduce.export import EVALUATION, export_runs

    run = _export_run(tmp_path / "work", 5, "interrupted")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "acc": 0.2}) + "\n" for r in range(1, 6)))
    target = _export_run(tmp_path / "dest", 5, "interrupted")
    (target / EVALUATION).write_text(json.dumps({"lossless.npz": {"round": 5, "accuracy": 0.5}}))
    export_runs(tmp_path / "work", tmp_path / "dest")
    assert (target / "metrics.jsonl").read_text() == (run / "metrics.jsonl").read_text()
    assert not (target / EVALUATION).exists()


def test_a_scoring_that_fails_is_recorded_and_the_next_invocation_scores_the_finished_run(tiny_configs: Path,
                                                                                         tmp_path: Path) -> None:
    """The training is the result: a run whose other-test-set scoring fails (the file holds images
    of another size) still completes, its record says what failed, and once the file is right the next
    ``fednorm reproduce`` of the table scores the finished run without training it again."""
    from fednorm.cli.main import main
    from fednorm.data.datasets import load_dataset

    (table,) = _tiny(tiny_configs)
    test = load_dataset("digits", train=False)
    data = tmp_path / "data"
    data.mkdir()
    np.savez(data / "own.npz", x=test.data[:, :4], y=np.asarray(test.targets))  # 4 rows of pixels: not the run's size
    tiny = tiny_configs / "hbn" / "tiny.yaml"
    tiny.write_text(tiny.read_text().replace("seeds: 1\n", "seeds: 1\nextra_tests: [own.npz]\n"))
    out = tmp_path / "out"
    args = ["reproduce", "hbn", "--configs", str(tiny_configs), "--table", "tiny", "--rows", "a", "--columns", "x",
            "--rounds", "2", "--data-dir", str(data), "--quiet", "--no-plots", "--out", str(out), "--allow-dirty"]
    assert main(args) == 0
    (run,) = [p.parent for p in out.rglob(runner.RECORD_NAME)]
    (inv,) = json.loads((run / runner.RECORD_NAME).read_text())["invocations"]
    assert inv["status"] == "completed" and inv["rounds"] == 2
    assert len(inv["scoring_errors"]) == 1 and inv["scoring_errors"][0].startswith("test:own.npz: ")
    assert not (run / "evaluation.json").exists()
    np.savez(data / "own.npz", x=test.data, y=np.asarray(test.targets))  # the run's own test images
    metrics = (run / "metrics.jsonl").read_text()
    assert main(args) == 0
    assert (run / "metrics.jsonl").read_text() == metrics  # not trained again
    entry = json.loads((run / "evaluation.json").read_text())["own.npz"]
    summary = json.loads((run / "summary.json").read_text())
    assert entry["round"] == 2 and entry["accuracy"] == pytest.approx(summary["final_test_accuracy"], abs=1e-12)
    assert runner.missing_scores(next(s for s in plan(_tiny(tiny_configs), scale="full", out=out, rows=["a"], columns=["x"],
                                                      data_dir=str(data), overrides={"rounds": 2}))) == []


def _many_client_run(root: Path, clients: int, status: str, evaluations: int = 4) -> Path:
    """A run directory whose evaluations carry ``clients`` per-client accuracies."""
    run = _export_run(root, evaluations, status)
    rows = [{"test_accuracy": 0.1 * r, "client_accuracies": [(r + c) % 7 / 7 for c in range(clients)], "round": r}
            for r in range(1, evaluations + 1)]
    rows.insert(2, {"round": 2, "note": "a row without the list"})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "reproduce.json").write_text(json.dumps({"invocations": []}))
    return run


def test_thin_metrics_keeps_the_last_per_client_list_and_every_other_figure() -> None:
    from fednorm.reproduce.export import thin_metrics

    rows = [{"round": r, "test_accuracy": r / 10, "client_accuracies": [r / (c + 1) for c in range(5)]} for r in range(1, 5)]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    thinned, left_out = thin_metrics(text, limit=4)
    parsed = [json.loads(line) for line in thinned.splitlines()]
    assert parsed[:-1] == [{k: v for k, v in r.items() if k != "client_accuracies"} for r in rows[:-1]]
    assert thinned.splitlines()[-1] == text.splitlines()[-1]  # the kept line byte for byte
    assert left_out == {"field": "client_accuracies", "kept_at_round": 4, "clients": 5, "evaluations_thinned": 3,
                        "source_bytes": len(text.encode())}
    assert thin_metrics(thinned, limit=4) == (thinned, None)  # a thinned text is left as it is
    assert thin_metrics(text, limit=5) == (text, None)  # lists of at most ``limit`` clients stay


def test_export_thins_a_finished_many_client_run_and_replaces_a_whole_copy_of_the_same_run(tmp_path: Path) -> None:
    """HBN Table 3's K = 1,000 runs: the committed copy keeps each client's accuracy at the last
    evaluation only, says so in its record, and an earlier whole export of the same run is
    replaced by the thinned one (not kept as another run's record)."""
    from fednorm.reproduce.export import THIN_CLIENTS, THINNED_RECORD, export_runs

    run = _many_client_run(tmp_path / "work", THIN_CLIENTS + 1, "completed")
    source = (run / "metrics.jsonl").read_text()
    whole = _many_client_run(tmp_path / "dest", THIN_CLIENTS + 1, "completed")  # an export from before the thinning
    done = export_runs(tmp_path / "work", tmp_path / "dest")
    assert done.copied == [whole]
    rows = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("test_accuracy") for r in rows] == [json.loads(line).get("test_accuracy") for line in source.splitlines()]
    assert [r["round"] for r in rows if "client_accuracies" in r] == [4]
    record = json.loads((whole / "reproduce.json").read_text())
    assert record[THINNED_RECORD]["kept_at_round"] == 4 and record[THINNED_RECORD]["evaluations_thinned"] == 3
    assert (run / "metrics.jsonl").read_text() == source  # the working copy keeps everything
    first = (whole / "metrics.jsonl").read_bytes()
    export_runs(tmp_path / "work", tmp_path / "dest")  # again: the same run, copied over itself
    assert (whole / "metrics.jsonl").read_bytes() == first


@pytest.mark.parametrize("extra, status", [(0, "completed"), (1, "interrupted")])
def test_export_copies_a_run_whole_below_the_limit_or_while_it_must_resume(tmp_path: Path, extra: int, status: str) -> None:
    """Runs of at most THIN_CLIENTS clients (every table but HBN Table 3) and unfinished runs (they
    resume from the copy, reading their whole history) are exported byte for byte."""
    from fednorm.reproduce.export import THIN_CLIENTS, THINNED_RECORD, export_runs

    run = _many_client_run(tmp_path / "work", THIN_CLIENTS + extra, status)
    export_runs(tmp_path / "work", tmp_path / "dest")
    target = tmp_path / "dest" / run.relative_to(tmp_path / "work")
    assert (target / "metrics.jsonl").read_bytes() == (run / "metrics.jsonl").read_bytes()
    assert THINNED_RECORD not in json.loads((target / "reproduce.json").read_text())
