"""The operator's side of the ``fednorm`` command (issue 24): results are never lost without a word,
a run never sits silent off a terminal, signals give the shell's exit status, options that would do
nothing are refused or said, and the run records what it ran on. Tiny runs (MLP, 2-4 clients)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

import fednorm
from fednorm import api
from fednorm.cli import progress as progress_mod
from fednorm.cli.main import build_parser, main
from fednorm.cli.threads import choose_threads
from fednorm.engine.checkpoint import load_latest
from fednorm.engine.outputs import read_metrics

from _signals import sigint_at

TINY = ["--num-clients", "3", "--model", "mlp", "--batch-size", "64", "--seed", "1"]


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch):
    """accuracy.png costs seconds of matplotlib per run on a busy machine; nothing here reads it."""
    monkeypatch.setattr("fednorm.plotting.plot_accuracy", lambda *a, **k: None)
    monkeypatch.setattr("fednorm.plotting.plot_comparison", lambda *a, **k: None)


def _run(out, *extra, rounds=2):
    return main(["run", "--rounds", str(rounds), *TINY, "--out", str(out), *extra])


def _no_time(history):
    return [{k: v for k, v in h.items() if k != "wall_seconds"} for h in history]


# -- results lost without a word --------------------------------------------------------------

def test_run_refuses_a_directory_holding_a_run_and_says_how_to_go_on(tmp_path, capsys):
    out = tmp_path / "r"
    assert _run(out, "--quiet") == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert _run(out, "--quiet", "--lr", "0.5") == 2
    err = capsys.readouterr().err
    assert "already holds a completed run of 2 rounds" in err
    assert f"--resume {out}" in err and "--overwrite" in err and "another --out" in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_overwrite_starts_again_and_removes_the_old_run_files(tmp_path, capsys):
    out = tmp_path / "r"
    assert _run(out, "--quiet", rounds=3) == 0
    (out / "analysis.json").write_text("{}")  # written by `fednorm analyze` for the old model
    (out / "notes.txt").write_text("mine")  # not fednorm's: kept
    (out / "tensorboard").mkdir()  # an earlier run's logger folder: its events would mix with the new run's
    (out / "tensorboard" / "events.out.tfevents.1").write_bytes(b"old")
    assert _run(out, "--quiet", "--overwrite") == 0
    assert "deleted the earlier run" in capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text())["rounds"] == 2
    assert [r["round"] for r in read_metrics(out)] == [1, 2]
    assert not (out / "analysis.json").exists() and (out / "notes.txt").read_text() == "mine"
    assert not (out / "tensorboard").exists()
    assert load_latest(out)["server_round"] == 2


def test_a_run_repeated_from_its_saved_config_gets_a_new_directory(tmp_path, capsys):
    out = tmp_path / "r"
    assert _run(out, "--quiet") == 0
    first = (out / "metrics.jsonl").read_bytes()
    assert main(["run", "--config", str(out / "config.yaml"), "--quiet"]) == 0
    assert f"in a new directory {out}-2" in capsys.readouterr().out
    assert (out / "metrics.jsonl").read_bytes() == first
    assert _no_time(read_metrics(f"{out}-2")) == _no_time(read_metrics(out))  # the same thread count: bit for bit


def test_resume_with_fewer_rounds_than_run_is_refused_and_changes_nothing(tmp_path, capsys):
    out = tmp_path / "r"
    assert _run(out, "--quiet", rounds=3) == 0
    config = (out / "config.yaml").read_text()
    assert main(["run", "--resume", str(out), "--rounds", "2", "--quiet"]) == 2
    assert "already run 3 rounds" in capsys.readouterr().err
    assert (out / "config.yaml").read_text() == config
    with pytest.raises(fednorm.errors.ConfigError, match="already run 3 rounds"):
        api.run(resume=out, rounds=1)


def test_compare_refuses_an_earlier_comparison_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "c"
    argv = ["compare", "--rounds", "1", *TINY, "--methods", "fedavg", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    table = (out / "results.md").read_text()
    assert main(argv) == 2
    assert "already holds a comparison" in capsys.readouterr().err
    assert (out / "results.md").read_text() == table
    assert main([*argv, "--overwrite"]) == 0


# -- silence and signals -----------------------------------------------------------------------

def test_off_a_terminal_a_run_prints_one_line_per_evaluation(tmp_path, capsys):
    assert _run(tmp_path / "r", "--eval-every", "2", rounds=4) == 0  # capsys: stdout is not a terminal
    lines = [ln for ln in capsys.readouterr().out.splitlines() if " round " in ln]
    assert len(lines) == 2
    pattern = r"^fedavg\+bn round [24]/4: test accuracy \d+\.\d\d%, elapsed \d+s, ETA \d+s$"
    assert all(re.match(pattern, ln) for ln in lines), lines


def test_quiet_prints_no_progress_lines(tmp_path, capsys):
    assert _run(tmp_path / "r", "--quiet") == 0
    assert " round 1/2" not in capsys.readouterr().out


def test_progress_line_estimates_the_time_left():
    class Rec:
        def __init__(self, r, metrics):
            self.server_round, self.metrics, self.seconds = r, metrics, 1.0

    class Sim:
        class config:
            method, norm, rounds = "fedbn", "bn", 10

    import io

    buf = io.StringIO()
    lines = progress_mod.ProgressLines(stream=buf, variants=3)
    sim = Sim()
    lines(Rec(1, {}), sim)
    lines(Rec(2, {"test_accuracy": 0.5}), sim)
    assert buf.getvalue().startswith("[1/3] fedbn+bn round 2/10: test accuracy 50.00%, elapsed")
    assert progress_mod.format_seconds(3725) == "1h02m" and progress_mod.format_seconds(65) == "1m05s"


@pytest.mark.parametrize("method", ["fedavg", "hbn"])
def test_a_dp_run_shows_epsilon_in_each_progress_line_and_its_summary(method, tmp_path, capsys):
    pytest.importorskip("opacus")
    out = tmp_path / "r"
    norm = ["--method", "hbn", "--norm", "hbn"] if method == "hbn" else []
    assert _run(out, "--dp-clip", "1", "--dp-noise", "0.5", *norm, rounds=3) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if " round " in ln]
    shown = [float(re.search(r", epsilon (\S+) at delta 1e-05, ", ln).group(1)) for ln in lines]
    assert len(shown) == 3 and shown == sorted(shown) and shown[0] < shown[-1], lines  # rounds compose
    logged = [h["dp/epsilon"] for h in read_metrics(out)]
    assert shown == pytest.approx(logged, rel=5e-3)  # 3 significant digits of the accountant's figure
    privacy = json.loads((out / "summary.json").read_text())["method_report"]["privacy"]
    assert 0 < privacy["epsilon"] < float("inf") and privacy["delta"] == 1e-5
    assert privacy["epsilon"] >= logged[-1]  # HBN's round T+1 statistics answers come after the last record


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_a_batch_larger_than_a_client_is_said_once_per_run(executor):
    import warnings

    def run_and_catch(batch_size):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # count every warning, not once per location
            res = api.run(rounds=3, num_clients=3, model="mlp", batch_size=batch_size, executor=executor, seed=1,
                          write=False, progress=False)
        return res, [str(w.message) for w in caught if "exceeds the training samples" in str(w.message)]

    res, said = run_and_catch(1000)
    assert res.simulation.executor.name == executor
    sizes = [len(c) for c in res.simulation.data.client_train]
    small = [n for n in sizes if n < 1000]
    assert small and len(said) == 1, said  # 3 rounds, len(small) clients: one warning
    assert f"batch_size=1000 exceeds the training samples of {len(small)} of 3 clients" in said[0]
    assert f"(the smallest has {min(small)})" in said[0] and "\n" not in said[0]
    assert run_and_catch(min(sizes))[1] == []  # every client fills a batch: nothing to say


def _signal_at_round(monkeypatch, sig, at=2):
    """Make the progress printer send ``sig`` to this process after round ``at`` (a user's Ctrl-C)."""
    original = progress_mod.ProgressLines.__call__

    def call(self, record, sim):
        original(self, record, sim)
        if record.server_round == at:
            os.kill(os.getpid(), sig)

    monkeypatch.setattr(progress_mod.ProgressLines, "__call__", call)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_run_exits_128_plus_the_signal_after_its_checkpoint(sig, code, tmp_path, monkeypatch, capsys):
    _signal_at_round(monkeypatch, sig)
    out = tmp_path / "r"
    assert _run(out, rounds=50) == code
    assert "continue with: fednorm run --resume" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["rounds"] == 2
    assert load_latest(out)["server_round"] == 2
    assert main(["run", "--resume", str(out), "--rounds", "3", "--quiet"]) == 0


def test_a_signal_while_the_data_loads_stops_before_the_first_round_with_a_checkpoint(tmp_path, monkeypatch, capsys):
    """SIGTERM while the clients' data is built (minutes for a large dataset) used to kill the
    process with no run directory; now the run stops before round 1, as an interrupted run that
    resumes to the numbers of an uninterrupted one."""
    from fednorm.engine.simulator import Simulation

    original = Simulation.__init__

    def loading(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the data and model are being built
        original(self, *args, **kwargs)

    monkeypatch.setattr(Simulation, "__init__", loading)
    out = tmp_path / "r"
    assert _run(out, rounds=2) == 143
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["rounds"] == 0
    assert load_latest(out)["server_round"] == 0 and read_metrics(out) == []
    monkeypatch.setattr(Simulation, "__init__", original)
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    assert _run(tmp_path / "ref", "--quiet", rounds=2) == 0
    assert _no_time(read_metrics(out)) == _no_time(read_metrics(tmp_path / "ref"))


def test_an_interrupted_compare_writes_the_finished_variants_and_exits_130(tmp_path, monkeypatch, capsys):
    out = tmp_path / "c"
    sigint_at(monkeypatch, variant=2, server_round=2)  # Ctrl-C in the second variant's second round
    code = main(["compare", "--rounds", "3", *TINY, "--methods", "fedavg,fedbn,silobn", "--out", str(out)])
    assert code == 130
    table = (out / "results.md").read_text()
    assert "| fedavg+bn |" in table and "| fedbn+bn |" not in table
    assert "Stopped by SIGINT" in table and "fedbn+bn was interrupted" in table and "Not run: silobn+bn" in table
    assert not (out / "silobn_bn").exists()
    capsys.readouterr()


def test_sigterm_to_a_real_run_process_exits_143(tmp_path):
    out = tmp_path / "r"
    proc = subprocess.Popen([sys.executable, "-m", "fednorm", "run", "--rounds", "500", *TINY, "--out", str(out),
                             "--checkpoint-every", "1", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 2):
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert "interrupted after round" in stdout
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"


# -- options that would do nothing ---------------------------------------------------------------

def test_client_deadline_under_auto_runs_sequentially_and_says_so(tmp_path, capsys):
    assert _run(tmp_path / "r", "--client-deadline", "100", "--quiet", rounds=1) == 0
    assert "executor: sequential because client_deadline" in capsys.readouterr().out
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["executor"] == "sequential" and "client_deadline" in summary["executor_note"]


def test_client_deadline_with_a_lockstep_method_is_refused():
    with pytest.raises(fednorm.errors.ConfigError, match="client_deadline does not work with method 'fedtan'"):
        api.run(method="fedtan", client_deadline=10, rounds=1, num_clients=2, model="mlp", write=False, progress=False)


def test_compare_help_shows_the_defaults_compare_uses(capsys):
    assert main(["compare", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "local mini-batch size (default: 4)" in text
    assert "client SGD momentum (reset every round) (default: 0.9)" in text
    assert "communication rounds (default: 15)" in text
    assert main(["run", "--help"]) == 0
    assert "local mini-batch size (default: 32)" in " ".join(capsys.readouterr().out.split())


# -- small things ------------------------------------------------------------------------------

def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"fednorm {fednorm.__version__} (torch {torch.__version__}, Python {sys.version.split()[0]})")


def test_summary_records_versions_and_threads(tmp_path):
    assert _run(tmp_path / "r", "--quiet", "--threads", "1", rounds=1) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["threads"] == 1
    assert summary["torch_version"] == torch.__version__ and summary["fednorm_version"] == fednorm.__version__


def test_no_prefix_matching_of_options(tmp_path, capsys):
    assert main(["run", "--round", "1", "--out", str(tmp_path / "r")]) == 2
    assert "did you mean --rounds?" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_divergence_suggests_a_lower_learning_rate(tmp_path, capsys):
    out = tmp_path / "d"
    assert _run(out, "--lr", "1e6", "--quiet", "--checkpoint-every", "1", rounds=30) == 1
    err = capsys.readouterr().err
    assert f"with a smaller learning rate: fednorm run --resume {out} --lr 100000" in err  # a tenth of lr
    assert len(err.strip().splitlines()) == 1 and len(err.strip()) <= 300


def test_a_repaired_partition_is_one_warning_line(capsys):
    assert main(["partition", "--alpha", "0.01", "--num-clients", "50", "--min-size", "5"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fednorm partition: warning: dirichlet: no draw of 11")


# -- threads -----------------------------------------------------------------------------------

def test_threads_follow_the_free_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert choose_threads(torch_default=2, load=4.0, cores=2)[0] == 1  # busy 2-core machine
    assert choose_threads(torch_default=2, load=0.1, cores=2)[0] == 2  # quiet one
    assert choose_threads(torch_default=8, load=3.0, cores=8)[0] == 5
    assert choose_threads(torch_default=4, load=0.0, cores=16)[0] == 4  # never above torch's own default
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert choose_threads(torch_default=2, load=4.0, cores=2) == (torch.get_num_threads(), "OMP_NUM_THREADS=3")


def test_the_cli_records_the_thread_count_it_chose(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("fednorm.cli.threads.choose_threads", lambda: (1, "test"))
    assert _run(tmp_path / "r", "--quiet", rounds=1) == 0
    assert "threads: 1" in (tmp_path / "r" / "config.yaml").read_text()
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["threads"] == 1
    assert ", 1 thread" in capsys.readouterr().out


def test_library_runs_keep_their_thread_setting(tmp_path):
    res = api.run(rounds=1, num_clients=2, model="mlp", write=False, progress=False)
    assert res.config.threads is None
    assert "threads" in build_parser().parse_args(["run", "--threads", "2"]).__dict__


def test_missing_data_names_the_cli_option(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["run", "--dataset", "mnist", "--data-dir", str(tmp_path / "empty"), "--out", str(tmp_path / "r"), "--quiet"]) == 2  # a data problem is a user error, as a configuration error
    err = capsys.readouterr().err
    assert "Pass --download true to download it" in err and "download=True" not in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "r").exists()
