"""Where the public API writes (issue 47, item 7 and after): a comparison refuses to write over an
earlier one from Python as ``fednorm compare`` does (``overwrite=True`` starts it again), the
out-directory rule lives below both the CLI and :mod:`fednorm.api`, and every path the public API
takes may be a ``str`` or any ``os.PathLike`` (``fednorm.run(out=Path(...))`` was refused with
"Input should be a valid string").
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

import fednorm
from fednorm import api
from fednorm.errors import ConfigError

_QUICK = {"model": "mlp", "rounds": 1, "num_clients": 2, "batch_size": 16, "progress": False, "threads": 1}
_ONE = [{"method": "fedavg", "norm": "bn"}]


class _FsPath(os.PathLike):
    """An ``os.PathLike`` that is not a ``pathlib.Path`` (as a user's own path class would be)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __fspath__(self) -> str:
        return self.path


# --- compare(out=...) into an earlier comparison -------------------------------------------------
def test_compare_into_an_earlier_comparison_is_refused_unless_overwrite(tmp_path):
    out = tmp_path / "cmp"
    first = api.compare(out=str(out), variants=_ONE, **_QUICK)
    variant_dir = first.results["fedavg+bn"].out_dir
    (variant_dir / "report").mkdir()  # `fednorm report` of the earlier variant: must not outlive it
    before = (out / "results.md").read_text()
    with pytest.raises(ConfigError) as err:
        api.compare(out=str(out), variants=_ONE, lr=0.2, **_QUICK)
    message = str(err.value)
    assert "\n" not in message and "already holds a comparison" in message
    assert f"fednorm.compare(resume={str(out)!r})" in message and "overwrite=True" in message
    assert (out / "results.md").read_text() == before  # nothing of the earlier comparison was touched
    again = api.compare(out=str(out), variants=_ONE, lr=0.2, overwrite=True, **_QUICK)
    assert yaml.safe_load((variant_dir / "config.yaml").read_text())["lr"] == 0.2
    assert not (variant_dir / "report").exists()
    assert json.loads((out / "compare.json").read_text())["base"]["lr"] == 0.2
    assert again.results["fedavg+bn"].summary["status"] == "completed"


def test_compare_overwrite_checks_every_variant_before_deleting_anything(tmp_path):
    out = tmp_path / "cmp"
    api.compare(out=str(out), variants=_ONE, **_QUICK)
    with pytest.raises(ConfigError, match="nosuchmethod"):
        api.compare(out=str(out), variants=[*_ONE, {"method": "nosuchmethod", "norm": "bn"}], overwrite=True, **_QUICK)
    assert (out / "results.md").is_file() and (out / "fedavg_bn" / "summary.json").is_file()


def test_compare_into_a_single_runs_directory_is_refused(tmp_path):
    out = tmp_path / "run"
    api.run(out=str(out), **_QUICK)
    with pytest.raises(ConfigError, match="a comparison needs a directory of its own"):
        api.compare(out=str(out), variants=_ONE, overwrite=True, **_QUICK)
    assert (out / "summary.json").is_file() and not (out / "compare.json").exists()


def test_compare_resume_and_overwrite_together_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="pass one of them"):
        api.compare(resume=str(tmp_path), overwrite=True)


def test_the_api_layer_does_not_import_the_cli():
    """The out-directory rule moved from fednorm/cli/rundir.py to fednorm/engine/rundir.py."""
    from fednorm.engine import rundir

    assert hasattr(rundir, "check_run_dir") and hasattr(rundir, "check_comparison_dir")
    assert not (Path(fednorm.__file__).parent / "cli" / "rundir.py").exists()


# --- paths as str or os.PathLike ---------------------------------------------------------------
@pytest.mark.parametrize("kind", [Path, _FsPath])
def test_run_takes_any_path_like_and_records_it_as_text(tmp_path, kind):
    (tmp_path / "c.yaml").write_text("rounds: 1\nnum_clients: 2\nmodel: mlp\nbatch_size: 16\n")
    out = tmp_path / "run"
    result = api.run(kind(tmp_path / "c.yaml"), out=kind(out), data_dir=kind(tmp_path / "data"), progress=False, threads=1)
    assert result.out_dir == out and result.config.out == str(out)
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["out"] == str(out) and saved["data_dir"] == str(tmp_path / "data")
    resumed = api.run(resume=kind(out), rounds=2, progress=False)
    assert resumed.summary["rounds"] == 2
    assert fednorm.evaluate(kind(out))["round"] == 2


def test_compare_and_run_seeds_take_any_path_like(tmp_path):
    (tmp_path / "c.yaml").write_text("rounds: 1\nnum_clients: 2\nmodel: mlp\nbatch_size: 16\n")
    result = api.compare(_FsPath(tmp_path / "c.yaml"), out=_FsPath(tmp_path / "cmp"), variants=_ONE, progress=False)
    assert (tmp_path / "cmp" / "results.md").is_file() and result.out_dir == tmp_path / "cmp"
    seeds = fednorm.seeds.run_seeds(_FsPath(tmp_path / "c.yaml"), [0], _FsPath(tmp_path / "seeds"), plot=False, progress=False)
    assert (tmp_path / "seeds" / "seed0" / "summary.json").is_file() and seeds.summaries
