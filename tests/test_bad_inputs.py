"""Every bad input to the ``fednorm`` command: exit status 2, one line on stderr, no traceback.

A table, so a new option cannot regress unnoticed: add its bad values here. Each case fails
before any training (most before any data is loaded), in-process, in well under a second.
``{file}``, ``{run}`` ... in an argument are the fixture's paths (see ``paths``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fednorm import api
from fednorm.cli.main import main

NO_CUDA = not torch.cuda.is_available()
MAX_MESSAGE = 300  # characters: an error names the field and the fix, never dumps a config or a module


def _unwritable(root: Path) -> str | None:
    """A directory this process cannot write in (root ignores modes: try a read-only /sys)."""
    if os.geteuid() != 0:
        d = root / "readonly"
        d.mkdir()
        d.chmod(0o500)
        return str(d)
    probe = Path("/sys/fednorm-write-probe")
    try:
        probe.mkdir()
    except OSError:
        return "/sys"
    probe.rmdir()
    return None


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "afile").write_text("not a directory\n")
    (tmp / "empty.yaml").write_text("")
    (tmp / "bad.yaml").write_text("rounds: 1\n  num_clients: [\n")
    (tmp / "list.yaml").write_text("- rounds\n- 1\n")
    (tmp / "typo.yaml").write_text("rounds: 1\nlocal_epoch: 2\n")
    (tmp / "adir").mkdir()
    api.run(rounds=2, num_clients=2, model="mlp", batch_size=64, out=str(tmp / "run"), progress=False)
    return {"tmp": str(tmp), "file": str(tmp / "afile"), "empty": str(tmp / "empty.yaml"), "badyaml": str(tmp / "bad.yaml"),
            "listyaml": str(tmp / "list.yaml"), "typo": str(tmp / "typo.yaml"), "dir": str(tmp / "adir"), "run": str(tmp / "run"),
            "unwritable": _unwritable(tmp) or ""}


CASES = [
    # registry names
    (["run", "--method", "fedavgg"], "Did you mean 'fedavg'"),
    (["run", "--norm", "batchnorm"], "Unknown norm"),
    (["run", "--model", "resnet-200"], "Unknown model"),
    (["run", "--dataset", "imagenet21k"], "Unknown dataset"),
    (["run", "--partition", "zipf"], "Unknown partition"),
    (["run", "--client-opt", "scafold"], "scaffold"),
    # values
    (["run", "--alpha", "0"], "alpha: Input should be greater than 0"),
    (["run", "--rounds", "0"], "rounds"),
    (["run", "--rounds", "ten"], "invalid int value"),
    (["run", "--lr", "-1"], "lr"),
    (["run", "--lr", "nan"], "lr"),
    (["run", "--weight-decay", "inf"], "finite"),
    (["run", "--momentum", "1"], "momentum"),
    (["run", "--seed", "-1"], "seed"),
    (["run", "--num-clients", "0"], "num_clients"),
    (["run", "--num-clients", "3", "--clients-per-round", "5"], "exceeds num_clients"),
    (["run", "--clients-per-round", "11"], "clients_per_round to at most 10"),  # the default 10 clients
    (["run", "--attack", "sign_flip"], "num_byzantine"),
    (["run", "--dtype", "float16"], "invalid choice"),
    (["run", "--executor", "parallel"], "invalid choice"),
    (["run", "--dsgd", "maybe"], "expected true/false"),
    (["run", "--norm-args", "[1, 2]"], "expected a mapping"),
    (["run", "--partition-args", "{mode: ring"], "expected a YAML/JSON mapping"),
    # options that would do nothing
    (["run", "--partition-args", "{mode: ring}"], "'mode' belongs to the 'classes' partition"),
    (["run", "--partition", "classes", "--partition-args", "{mod: ring}"], "did you mean 'mode'"),
    (["run", "--partition-args", "{alpha: 0.3}"], "setting of its own"),
    (["run", "--client-deadline", "1", "--executor", "vectorized"], "client_deadline"),
    # devices
    (["run", "--device", "tpu"], "unknown device 'tpu'"),
    (["run", "--device", "cuda:99"], "cuda"),
    pytest.param(["run", "--device", "cuda"], "no CUDA", marks=pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")),
    # where results go
    (["run", "--out", "{file}"], "is a file, not a directory"),
    (["run", "--out", "{file}/sub"], "lies under the file"),
    (["run", "--out", "{unwritable}/run"], "--out"),
    (["run", "--out", "{run}"], "already holds a completed run of 2 rounds"),
    (["compare", "--out", "{file}"], "is a file, not a directory"),
    (["compare", "--out", "{file}/sub"], "lies under the file"),
    # config files
    (["run", "--config", "{dir}"], "is a directory"),
    (["run", "--config", "{tmp}/missing.yaml"], "not found"),
    (["run", "--config", "{empty}"], "is empty"),
    (["run", "--config", "{badyaml}"], "bad.yaml\", line 2"),
    (["run", "--config", "{listyaml}"], "must hold a mapping"),
    (["run", "--config", "{typo}"], "local_epoch: unknown field"),
    # option spelling: no silent prefix matching
    (["run", "--round", "5"], "did you mean --rounds"),
    (["run", "--bogus-option"], "unrecognized arguments"),
    (["compare", "--variant", "fedavg:bn"], "did you mean --variants"),
    (["frobnicate"], "invalid choice"),
    (["list", "widgets"], "invalid choice"),
    # resume
    (["run", "--resume", "{tmp}/nowhere"], "no config.yaml"),
    (["run", "--resume", "{run}", "--rounds", "1"], "already run 2 rounds"),
    (["run", "--resume", "{run}", "--lr", "0.5"], "cannot change lr"),
    (["run", "--resume", "{run}", "--config", "{typo}"], "do not pass --config"),
    (["run", "--resume", "{run}", "--overwrite"], "pass one of them"),
    # compare validates every variant before the first trains
    (["compare", "--variants", "fedavg:bn,fedavgg:bn"], "variant fedavgg+bn"),
    (["compare", "--methods", "fedavg", "--norms", "bn,layernorm"], "Unknown norm"),
    # other commands
    (["launch", "--nproc", "0"], "--nproc must be at least 1"),
    (["partition", "--partition-args", "{mode: ring}"], "belongs to the 'classes' partition"),
    (["analyze", "{tmp}/nowhere"], "no config.yaml"),
    (["adapt", "{tmp}/nowhere", "--client", "0"], "not a fednorm run directory"),
]


def _fill(arg: str, paths: dict[str, str]) -> str:
    for key, value in paths.items():
        arg = arg.replace("{" + key + "}", value)
    return arg


def _ids(case) -> str:
    argv = case.values[0] if hasattr(case, "values") else case[0]
    return " ".join(argv)[:60]


@pytest.mark.parametrize("argv, needle", CASES, ids=[_ids(c) for c in CASES])
def test_bad_input_is_one_line_and_exit_2(argv, needle, paths, tmp_path, monkeypatch, capsys):
    if any("{unwritable}" in a for a in argv) and not paths["unwritable"]:
        pytest.skip("no unwritable directory available to this user")
    monkeypatch.chdir(tmp_path)  # a case that wrongly ran would write here, not into the repository
    before = sorted(os.listdir(paths["run"]))
    code = main([_fill(a, paths) for a in argv])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1, err
    assert len(lines[0]) <= MAX_MESSAGE, (len(lines[0]), err)
    assert lines[0].startswith("fednorm"), err
    assert needle in lines[0], err
    assert "Traceback" not in err + out
    assert sorted(os.listdir(paths["run"])) == before  # the earlier run is untouched
    assert not os.listdir(tmp_path), os.listdir(tmp_path)  # nothing was written


def test_a_module_that_does_not_fit_the_data_is_a_short_config_error_without_its_repr():
    from fednorm import run
    from fednorm.config import load_config
    from fednorm.errors import ConfigError

    class Wide(torch.nn.Module):  # a repr of many lines, which the message must not quote
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(30)])

    for module in (torch.nn.Linear(2, 2), Wide()):
        with pytest.raises(ConfigError) as info:
            run(model=module, rounds=1, write=False)
        msg = str(info.value)
        assert len(msg) <= MAX_MESSAGE and "\n" not in msg, msg
        assert "model 'user:" in msg and "fails on a batch of the data" in msg, msg  # run(model=net) takes modules (issue 38)
        assert "in_features" not in msg, msg  # no module repr
        with pytest.raises(ConfigError) as info:  # a module inside a config is not a name: run(model=net) takes it
            load_config(None, {"model": module})
        msg = str(info.value)
        assert len(msg) <= MAX_MESSAGE and "\n" not in msg and "in_features" not in msg, msg
        assert "model:" in msg and "registered model" in msg and "fednorm.run(model=net)" in msg, msg


def test_the_table_is_large():
    assert len(CASES) >= 30


def test_a_fresh_process_exits_2_without_a_traceback(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    proc = subprocess.run([sys.executable, "-m", "fednorm", "run", "--device", "tpu", "--out", str(afile)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
