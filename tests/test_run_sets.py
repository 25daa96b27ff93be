"""Run sets you can trust (issue 46): one driver, no threads. The same ``--seeds`` command gives the
same bits twice and after a SIGKILL and the same command again; two Ctrl-C's exit at once;
SIGTERM exits 143; a run that diverges or is resumed at another round goes on alone and equals
itself run alone; a failing joint round leaves no client trained twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fednorm import api
from fednorm.api.run_set import run_stacked
from fednorm.config import ExperimentConfig
from fednorm.engine.checkpoint import load_latest
from fednorm.engine.outputs import read_metrics
from fednorm.errors import ConfigError, DivergenceError

BASE = dict(dataset="digits", partition="dirichlet", alpha=0.3, num_clients=6, clients_per_round=4, batch_size=16, lr=0.05,
            momentum=0.9, model="simple_cnn", rounds=3, dtype="float64", eval_every=1, threads=1)
#: A float32 set on the CLI (the bits of float32 depend on how rows are grouped, float64's barely).
CLI = ["--model", "mlp", "--norm", "bn", "--num-clients", "6", "--clients-per-round", "4", "--partition", "dirichlet",
       "--alpha", "0.3", "--batch-size", "16", "--lr", "0.05", "--eval-every", "1", "--checkpoint-every", "1",
       "--threads", "1", "--quiet"]
TIMING = ("wall_seconds", "eval_seconds", "samples_per_second", "eval_fraction", "threads")


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch):
    monkeypatch.setattr("fednorm.plotting.plot_accuracy", lambda *a, **k: None)


def _no_time(history):
    return [{k: v for k, v in h.items() if k not in TIMING} for h in history]


def _assert_same_dirs(a: Path, b: Path, seeds) -> None:
    """Bit-identical runs: every metric but the timings, and every tensor of the final checkpoint."""
    for s in seeds:
        da, db = a / f"seed{s}", b / f"seed{s}"
        assert _no_time(read_metrics(da)) == _no_time(read_metrics(db)), s
        ca, cb = load_latest(da), load_latest(db)
        assert ca["server_round"] == cb["server_round"]
        for key, value in ca["global_state"].items():
            assert torch.equal(value, cb["global_state"][key]), (s, key)
        sa, sb = (json.loads((d / "summary.json").read_text()) for d in (da, db))
        assert sa["status"] == sb["status"] == "completed"
        assert {k: v for k, v in sa.items() if "seconds" not in k and k not in (*TIMING, "code")} == \
               {k: v for k, v in sb.items() if "seconds" not in k and k not in (*TIMING, "code")}
        # the code record says what ran: one start, or a start and a resume, of the same code
        assert {e["commit"] for e in sa["code"]} == {e["commit"] for e in sb["code"]}
        assert sa["code"][0]["from_round"] == sb["code"][0]["from_round"] == 0


def _fednorm(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "fednorm", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def _wait_for_lines(path: Path, n: int, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"the set ended early: {proc.stderr.read()}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {n} lines of {path}")


@pytest.mark.slow
def test_the_same_seeds_command_twice_and_after_a_sigkill_gives_the_same_bits(tmp_path):
    seeds, rounds = (0, 1, 2), 30
    args = ["run", "--seeds", "0,1,2", "--rounds", str(rounds), *CLI]
    for name in ("a", "b"):
        done = subprocess.run([sys.executable, "-m", "fednorm", *args, "--out", str(tmp_path / name)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
    _assert_same_dirs(tmp_path / "a", tmp_path / "b", seeds)
    killed = tmp_path / "killed"
    proc = _fednorm(*args, "--out", str(killed))
    rng = np.random.default_rng(46)  # a seeded random point: after k rounds plus a random delay
    _wait_for_lines(killed / "seed2" / "metrics.jsonl", int(rng.integers(3, 12)), proc)
    time.sleep(float(rng.uniform(0, 0.3)))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    rounds_saved = [load_latest(killed / f"seed{s}")["server_round"] for s in seeds]
    assert max(rounds_saved) < rounds and not (killed / "seed0" / "summary.json").exists()  # the kill landed mid-training
    done = subprocess.run([sys.executable, "-m", "fednorm", *args, "--out", str(killed)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    _assert_same_dirs(tmp_path / "a", killed, seeds)


@pytest.mark.slow
def test_two_ctrl_c_exit_at_once_and_sigterm_exits_143_with_checkpoints(tmp_path):
    args = ["run", "--seeds", "0,1,2", "--rounds", "400", *CLI]
    out = tmp_path / "int"
    proc = _fednorm(*args, "--out", str(out))
    _wait_for_lines(out / "seed0" / "metrics.jsonl", 2, proc)
    proc.send_signal(signal.SIGINT)
    assert "stopping after this round" in proc.stderr.readline()  # the first reached Python: the second is a second
    proc.send_signal(signal.SIGINT)
    start = time.time()
    _, err = proc.communicate(timeout=60)
    assert time.time() - start < 30 and proc.returncode == 130, err
    for s in (0, 1, 2):  # each run says how it ended, and its last checkpoint resumes it
        assert json.loads((out / f"seed{s}" / "summary.json").read_text())["status"] == "interrupted"
        assert load_latest(out / f"seed{s}")["server_round"] >= 1
    term = tmp_path / "term"
    proc = _fednorm(*args, "--out", str(term))
    _wait_for_lines(term / "seed1" / "metrics.jsonl", 2, proc)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, stdout
    assert "run the same command again" in stdout
    for s in (0, 1, 2):  # stopped after the same round, each with its checkpoint
        summary = json.loads((term / f"seed{s}" / "summary.json").read_text())
        assert summary["status"] == "interrupted" and load_latest(term / f"seed{s}")["server_round"] == summary["rounds"]
    assert json.loads((term / "seeds.json").read_text())["status"] == {"0": "interrupted", "1": "interrupted", "2": "interrupted"}


def _alone(cfg: ExperimentConfig):
    return api.run(cfg.model_copy(update={"out": None}), write=False, progress=False)


def _assert_equal_alone(res, cfg):
    alone = _alone(cfg)
    assert [h["round"] for h in res.history] == [h["round"] for h in alone.history]
    for a, b in zip(res.history, alone.history):
        assert a["test_accuracy"] == b["test_accuracy"] and a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-10)
    for key, value in alone.simulation.global_state.items():
        torch.testing.assert_close(res.simulation.global_state[key], value, rtol=1e-10, atol=1e-10)


def test_a_run_that_diverges_mid_set_stops_alone_and_the_others_equal_their_runs_alone(tmp_path):
    rates = (0.05, 1000.0, 0.02)  # the middle run diverges in round 1; the others go on
    configs = [ExperimentConfig(**{**BASE, "method": "fedbn", "lr": lr, "rounds": 4}, seed=0, out=str(tmp_path / f"lr{i}"))
               for i, lr in enumerate(rates)]
    with pytest.raises(DivergenceError):
        _alone(configs[1])
    results, info = run_stacked(configs)
    assert info["separate_rounds"] >= 1
    assert isinstance(results[1], DivergenceError)
    assert json.loads((tmp_path / "lr1" / "summary.json").read_text())["status"] == "diverged"
    for i in (0, 2):
        _assert_equal_alone(results[i], configs[i])


def test_a_joint_round_that_fails_in_a_later_chunk_trains_no_client_twice(tmp_path, monkeypatch):
    """FedBN keeps each client's BatchNorm in its bank: a rerun from a bank that the first chunk had
    already updated would train those clients twice."""
    from fednorm.engine.stacked_runs import StackedRunsExecutor

    original = StackedRunsExecutor._run_chunk
    calls = []

    def failing_second_chunk(self, server_round, client_ids, global_state, lr):
        calls.append(server_round)
        if server_round == 2 and calls.count(2) == 2:
            raise DivergenceError("non-finite training loss at round 2 (injected in the second chunk)")
        return original(self, server_round, client_ids, global_state, lr)

    monkeypatch.setattr(StackedRunsExecutor, "_run_chunk", failing_second_chunk)
    configs = [ExperimentConfig(**{**BASE, "method": "fedbn", "max_parallel_clients": 2}, seed=s, out=str(tmp_path / f"s{s}"))
               for s in (0, 1)]
    results, info = run_stacked(configs)
    assert info["separate_rounds"] == 1 and info["joint_rounds"] == 2
    monkeypatch.setattr(StackedRunsExecutor, "_run_chunk", original)
    for cfg, res in zip(configs, results):
        _assert_equal_alone(res, cfg)


def test_a_run_resumed_at_another_round_than_the_others_equals_its_run_alone(tmp_path):
    first = ExperimentConfig(**{**BASE, "rounds": 2, "checkpoint_every": 1}, seed=0, out=str(tmp_path / "a"))
    api.run(first, progress=False)
    configs = [first.model_copy(update={"rounds": 4}), ExperimentConfig(**{**BASE, "rounds": 4}, seed=1, out=str(tmp_path / "b"))]
    results, info = run_stacked(configs, resume=[tmp_path / "a", None])
    assert info["joint_rounds"] >= 2  # round 3 and 4 of both runs together
    for cfg, res in zip(configs, results):
        assert res.summary["rounds"] == 4
        _assert_equal_alone(res, cfg.model_copy(update={"rounds": 4}))


def test_runs_whose_own_executor_is_sequential_still_stack(tmp_path, monkeypatch):
    """`auto` picks the sequential executor for FBN's model on a CPU (issue 46.1's crash): the set
    still trains stacked and counts its samples."""
    monkeypatch.setattr("fednorm.engine.simulator.prefers_sequential", lambda *a, **k: "a CPU runs them faster one by one")
    configs = [ExperimentConfig(**{**BASE, "method": "fbn", "norm": "fbn"}, seed=s, out=str(tmp_path / f"s{s}")) for s in (0, 1)]
    results, info = run_stacked(configs)
    assert info["joint_rounds"] == 3
    for cfg, res in zip(configs, results):
        assert not isinstance(res, BaseException), res
        assert res.summary["samples_trained"] == _alone(cfg).summary["samples_trained"] > 0


def test_two_runs_of_a_set_cannot_write_one_directory(tmp_path):
    configs = [ExperimentConfig(**BASE, seed=s, out=str(tmp_path / "same")) for s in (0, 1)]
    with pytest.raises(ConfigError, match="both write"):
        run_stacked(configs)
    assert not (tmp_path / "same").exists()


# -- run sets on disk (issue 46.6) and checkpoints (46.7): each case failed on the threaded driver --

def _cli_main(*args: str) -> int:
    from fednorm.cli.main import main

    return main(list(args))


def test_a_single_run_is_refused_in_a_seeds_folder_and_resume_there_names_the_set_command(tmp_path, capsys):
    root = tmp_path / "set"
    args = ["run", "--seeds", "0,1", "--rounds", "1", "--model", "mlp", "--num-clients", "3", "--threads", "1", "--quiet",
            "--out", str(root)]
    assert _cli_main(*args) == 0
    assert json.loads((root / "seeds.json").read_text())["command"] == "fednorm " + " ".join(args)
    capsys.readouterr()
    assert _cli_main("run", "--rounds", "1", "--model", "mlp", "--out", str(root), "--quiet") == 2
    assert "holds a set of runs" in capsys.readouterr().err
    assert not (root / "config.yaml").exists() and not (root / "metrics.jsonl").exists()  # nothing written
    assert _cli_main("run", "--resume", str(root)) == 2
    err = capsys.readouterr().err
    assert "fednorm run --seeds 0,1" in err and f"--resume {root / 'seed0'}" in err


def test_a_single_run_is_refused_in_a_comparison_folder(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert _cli_main("compare", "--methods", "fedavg", "--rounds", "1", "--model", "mlp", "--num-clients", "3", "--threads",
                     "1", "--quiet", "--out", str(out)) == 0
    before = sorted(p.name for p in out.iterdir())
    capsys.readouterr()
    assert _cli_main("run", "--rounds", "1", "--model", "mlp", "--out", str(out), "--quiet") == 2
    assert "holds a set of runs" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == before


def test_a_failed_run_of_a_set_is_told_how_to_continue_the_set(tmp_path):
    configs = [ExperimentConfig(**{**BASE, "lr": lr}, seed=0, out=str(tmp_path / f"lr{i}")) for i, lr in enumerate((0.05, 1000.0))]
    results, _ = run_stacked(configs, again="fednorm run --seeds 0,1 --out X")
    assert isinstance(results[1], DivergenceError)
    assert "rerun the set's command with --lr 100 in place of its lr" in str(results[1])
    assert str(results[1]).endswith("fednorm run --seeds 0,1 --out X")


def test_after_a_divergence_the_sets_command_with_a_smaller_lr_restarts_the_set(tmp_path, capsys):
    args = ["run", "--seeds", "0,1", "--rounds", "2", "--model", "mlp", "--num-clients", "3", "--threads", "1", "--quiet",
            "--out", str(tmp_path / "set")]
    assert _cli_main(*args, "--lr", "1000") == 1  # both seeds diverge
    assert _cli_main(*args, "--lr", "1000") == 2  # the same lr again is refused, with the way forward
    assert "--lr 100 in place of its lr" in capsys.readouterr().err
    assert _cli_main(*args, "--lr", "0.05") == 0  # one command restarts the set from the last good checkpoints
    status = json.loads((tmp_path / "set" / "seeds.json").read_text())["status"]
    assert status == {"0": "completed", "1": "completed"}
    restarts = [json.loads((tmp_path / "set" / f"seed{s}" / "summary.json").read_text())["status"] for s in (0, 1)]
    assert restarts == ["completed", "completed"]


def test_a_divergence_whose_last_checkpoint_has_blown_up_says_start_over(tmp_path):
    with pytest.raises(DivergenceError, match="a restart from it diverges again: start over"):
        api.run(rounds=15, lr=8.0, checkpoint_every=1, threads=1, out=str(tmp_path / "r"), progress=False)


def test_a_checkpoint_with_flipped_bytes_is_refused_not_loaded(tmp_path):
    from fednorm.engine.checkpoint import CheckpointError, load_checkpoint

    run_dir = tmp_path / "r"
    api.run(**{**BASE, "rounds": 3, "checkpoint_every": 1}, out=str(run_dir), progress=False)
    path = run_dir / "checkpoint.pt"
    data = bytearray(path.read_bytes())
    rng = np.random.default_rng(0)
    for i in rng.integers(len(data) // 4, 3 * len(data) // 4, size=1000):  # the size is unchanged
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="CRC"):
        load_checkpoint(path)
    with pytest.warns(UserWarning, match="previous checkpoint"):  # the previous, intact one resumes the run
        assert load_latest(run_dir)["server_round"] == 3  # the end writes round 3 twice


def test_a_directory_made_read_only_mid_run_ends_in_one_line_with_the_round_and_the_resume(tmp_path, monkeypatch):
    """Before: a raw `[Errno 30] ... .summary.json.tmp`, no round, no resume command."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_newcomer_inputs import _read_only  # every write under a folder fails with EROFS (we are root)

    from fednorm.errors import RunWriteError
    from fednorm.tracking.callback import Callback

    out = tmp_path / "r"

    class ReadOnlyAfterRound2(Callback):
        def on_round_end(self, record, sim):  # type: ignore[no-untyped-def]
            if record.server_round == 2:
                _read_only(monkeypatch, out)

    with pytest.raises(RunWriteError) as err:
        api.run(**{**BASE, "rounds": 4, "checkpoint_every": 1}, out=str(out), progress=False, callbacks=[ReadOnlyAfterRound2()])
    text = str(err.value)
    assert "\n" not in text and "[Errno" not in text and "Read-only file system" in text
    assert f"the last good checkpoint is round 1; make the directory writable again, then: fednorm run --resume {out}" in text


@pytest.mark.parametrize("stack", [True, False])
def test_a_set_counts_each_second_once_in_its_runs_clocks(stack, monkeypatch):
    """Each run's ``wall_seconds`` is its own planning, its share of the training and its own server
    work and evaluations: the runs' clocks add up to no more than the set took. A run's clock ran
    from the joint round's start to its own aggregation, so the third run of three counted the
    training three times over and the first two runs' aggregation and evaluation besides.
    ``stack=False``: runs that cannot stack train one after another, each its own time."""
    if not stack:
        monkeypatch.setattr("fednorm.api.run_set.stack_blockers", lambda *a, **k: ["refused here"])
    configs = [ExperimentConfig(**{**BASE, "rounds": 3}, seed=s) for s in range(3)]
    started = time.perf_counter()
    results, info = run_stacked(configs, write=False)
    elapsed = time.perf_counter() - started
    assert info["joint_rounds"] == (3 if stack else 0)
    clocks = [r.history[-1]["wall_seconds"] for r in results]
    assert all(c > 0 for c in clocks)
    assert sum(clocks) <= elapsed
