"""The command line: end-to-end runs and documented errors (exit 2, one message, no traceback)."""

import subprocess
import sys

import pytest

from fednorm.cli.main import main


def test_cli_run_end_to_end_in_a_subprocess(tmp_path):
    out = tmp_path / "r"
    proc = subprocess.run(
        [sys.executable, "-m", "fednorm", "run", "--rounds", "2", "--num-clients", "4", "--norm", "gn",
         "--batch-size", "32", "--out", str(out), "--quiet"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "final test accuracy" in proc.stdout
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "accuracy.png"):
        assert (out / name).is_file(), name


def test_one_evaluation_writes_no_curve_but_every_result(tmp_path):
    """A curve needs two points: `--rounds 1` skips matplotlib's import and drawing."""
    out = tmp_path / "one"
    assert main(["run", "--rounds", "1", "--num-clients", "3", "--model", "mlp", "--out", str(out), "--quiet"]) == 0
    assert not (out / "accuracy.png").exists()
    for name in ("config.yaml", "metrics.jsonl", "summary.json"):
        assert (out / name).is_file(), name


def test_cli_config_file_and_overrides(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rounds: 1\nnum_clients: 3\nnorm: ln\nmethod_args: {weighting: uniform}\n")
    assert main(["run", "--config", str(cfg), "--batch-size", "64", "--out", str(tmp_path / "o"), "--quiet"]) == 0
    text = (tmp_path / "o" / "config.yaml").read_text()
    assert "norm: ln" in text and "batch_size: 64" in text and "weighting: uniform" in text


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["run", "--method", "fedavgg"], "Unknown method 'fedavgg'. Did you mean 'fedavg'?"),
        (["run", "--norm", "batchnorm"], "Unknown norm"),
        (["run", "--alpha", "0"], "alpha: Input should be greater than 0"),
        (["run", "--num-clients", "100000"], "num_clients=100000"),
        (["run", "--partition", "classes", "--classes-per-client", "11"], "classes_per_client"),
        (["run", "--model", "resnet-200"], "Unknown model"),
        (["run", "--norm", "gn", "--norm-args", "{num_groups: 3}"], "must be divisible by num_groups"),
        (["run", "--model-args", "{bogus: 1}"], "unexpected keyword argument 'bogus'"),
    ],
)
def test_cli_bad_input_gives_one_clear_error(argv, needle, capsys, tmp_path):
    code = main(argv + ["--out", str(tmp_path / "x"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert needle in err
    assert "Traceback" not in err


def test_cli_unknown_yaml_key(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rounds: 1\nlocal_epoch: 2\n")
    assert main(["run", "--config", str(cfg)]) == 2
    assert "local_epoch: unknown field" in capsys.readouterr().err


def test_cli_list_and_partition(tmp_path, capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("methods: ", "fedavg", "norms: ", "bn", "gn", "ln", "none", "models: ", "simple_cnn", "datasets: ", "digits", "partitions: ", "dirichlet",
                 "aggregators: ", "median", "attacks: ", "alie"):
        assert word in out
    assert main(["partition", "--partition", "classes", "--classes-per-client", "1", "--num-clients", "10", "--plot", str(tmp_path / "h.png")]) == 0
    assert (tmp_path / "h.png").exists()


def test_hbn_norm_without_the_hbn_method_is_refused(capsys, tmp_path):
    assert main(["run", "--norm", "hbn", "--rounds", "1", "--out", str(tmp_path / "h"), "--quiet"]) == 2
    assert "only works under method 'hbn'" in capsys.readouterr().err


def test_feature_norm_model_option_runs(tmp_path):
    assert main(["run", "--model", "ln_cnn", "--norm", "none", "--model-args", "{feature_norm: true}", "--rounds", "1",
                 "--num-clients", "2", "--out", str(tmp_path / "f"), "--quiet"]) == 0


def _option_help(command: str, option: str) -> str:
    import argparse

    from fednorm.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return next(a.help for a in sub.choices[command]._actions if option in a.option_strings)


@pytest.mark.parametrize("command", ["run", "compare", "launch"])
def test_threads_help_says_what_the_command_chooses(command):
    """Without --threads the CLI picks the free cores (fednorm/cli/threads.py), not torch's default."""
    text = " ".join(_option_help(command, "--threads").split())
    assert "torch's choice" not in text
    assert "free cores" in text and "load average" in text and "OMP_NUM_THREADS" in text, text


def test_adapt_num_samples_help_states_its_default():
    assert "(default: all of" in _option_help("adapt", "--num-samples")
