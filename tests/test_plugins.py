"""Plugins (issue 38.3): a user's method, registered in their own module, named on the command
line through --plugin, FEDNORM_PLUGINS or an entry point, in run, compare, list, resume and the
processes fednorm starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PLUGIN = textwrap.dedent(
    """\
    import torch
    from fednorm.methods import FedAvg, register_method

    @register_method("uniform_avg")
    class UniformAvg(FedAvg):
        \"\"\"FedAvg with every client weighted equally, whatever its sample count.\"\"\"
        name = "uniform_avg"

        def aggregate(self, server_round, global_state, updates):
            updates.num_examples = torch.ones_like(updates.num_examples)
            return super().aggregate(server_round, global_state, updates)
    """
)

RUN = ["run", "--dataset", "digits", "--num-clients", "4", "--rounds", "2", "--method", "uniform_avg", "--threads", "1"]


def _fednorm(args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "FEDNORM_PLUGINS"}  # only the plugins the test names
    full.update({"OMP_NUM_THREADS": "1", **(env or {})})
    return subprocess.run([sys.executable, "-m", "fednorm", *args], capture_output=True, text=True, env=full, cwd=cwd, timeout=300)


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    path = tmp_path / "plugs" / "my_methods.py"
    path.parent.mkdir()
    path.write_text(PLUGIN)
    return path


def test_a_plugin_file_makes_its_method_a_cli_name_and_its_runs_resumable(plugin: Path, tmp_path: Path) -> None:
    listed = _fednorm(["--plugin", str(plugin), "list", "methods"])
    assert listed.returncode == 0 and "uniform_avg" in listed.stdout, listed.stderr
    out = tmp_path / "run"
    ran = _fednorm(["--plugin", str(plugin), *RUN, "--out", str(out)])
    assert ran.returncode == 0, ran.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["method"] == "uniform_avg"
    # without the plugin the name is unknown, and the error says how to bring it in
    bare = _fednorm(["run", "--resume", str(out), "--rounds", "3"])
    assert bare.returncode == 2 and "Unknown method 'uniform_avg'" in bare.stderr and "(your own: fednorm --plugin MODULE)" in bare.stderr
    assert len(bare.stderr.strip().splitlines()) == 1
    # FEDNORM_PLUGINS as a module name on the path: resume continues the run
    resumed = _fednorm(["run", "--resume", str(out), "--rounds", "3"],
                       env={"FEDNORM_PLUGINS": "my_methods", "PYTHONPATH": f"{plugin.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "summary.json").read_text())["rounds"] == 3


def test_a_plugin_method_runs_in_compare(plugin: Path, tmp_path: Path) -> None:
    done = _fednorm(["--plugin", str(plugin), "compare", "--dataset", "digits", "--num-clients", "4", "--rounds", "1",
                     "--methods", "fedavg,uniform_avg", "--norms", "bn", "--threads", "1", "--out", str(tmp_path / "cmp")])
    assert done.returncode == 0, done.stderr
    assert "uniform_avg" in done.stdout


def test_uniform_weights_differ_from_fedavg_on_unequal_clients(plugin: Path) -> None:
    """The plugin's method is really the one that ran: with unequal clients its one-round global
    model differs from FedAvg's, and equals the plain mean of the clients' updates."""
    import importlib.util

    import torch

    from fednorm.config import ExperimentConfig
    from fednorm.engine.simulator import Simulation
    from fednorm.methods.registry import METHODS

    spec = importlib.util.spec_from_file_location("fednorm_test_plugin_uniform", plugin)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # registers uniform_avg in this process
    try:
        cfg = dict(dataset="digits", num_clients=4, clients_per_round=4, rounds=1, partition="dirichlet", alpha=0.2,
                   dtype="float64", checkpoint_every=0, out=None, threads=1, norm="gn", norm_args={"num_groups": 2})
        sims = {m: Simulation(ExperimentConfig(**cfg, method=m)) for m in ("fedavg", "uniform_avg")}
        start = {k: v.clone() for k, v in sims["fedavg"].global_state.items()}
        captured = {}
        for m, sim in sims.items():
            orig = sim.method.aggregate

            def spy(r, g, updates, orig=orig, m=m):
                captured[m] = {k: v.clone() for k, v in updates.states.items()}, updates.num_examples.clone()
                return orig(r, g, updates)

            sim.method.aggregate = spy
            sim.step()
        states, sizes = captured["uniform_avg"]
        assert len(set(sizes.tolist())) > 1  # unequal clients, so the weighting matters
        key = next(k for k in states if k.endswith("weight"))
        torch.testing.assert_close(sims["uniform_avg"].global_state[key], states[key].mean(0), rtol=1e-12, atol=1e-12)
        assert not torch.allclose(sims["uniform_avg"].global_state[key], sims["fedavg"].global_state[key])
        assert not torch.equal(sims["fedavg"].global_state[key], start[key])
    finally:
        METHODS.remove("uniform_avg")


def test_a_broken_plugin_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad_plugin.py"
    bad.write_text("raise RuntimeError('the plugin is broken')\n")
    done = _fednorm(["--plugin", str(bad), "list", "methods"])
    assert done.returncode == 2
    assert done.stderr.strip() == f"fednorm: error: cannot load plugin '{bad}' (from --plugin): RuntimeError: the plugin is broken"
    missing = _fednorm(["list", "methods"], env={"FEDNORM_PLUGINS": "no_such_module_here"})
    assert missing.returncode == 2 and "cannot load plugin 'no_such_module_here' (from FEDNORM_PLUGINS)" in missing.stderr


def test_entry_points_are_loaded(plugin: Path, monkeypatch) -> None:
    import importlib.metadata

    from fednorm import plugins
    from fednorm.methods.registry import METHODS

    monkeypatch.syspath_prepend(str(plugin.parent))
    monkeypatch.delenv(plugins.PLUGINS_ENV, raising=False)
    ep = importlib.metadata.EntryPoint(name="mine", value="my_methods", group=plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group=None: [ep] if group == plugins.ENTRY_POINT_GROUP else [])
    monkeypatch.setattr(plugins, "_LOADED", {})
    try:
        assert plugins.load_plugins() == ["my_methods"] and "uniform_avg" in METHODS
    finally:
        METHODS.remove("uniform_avg")
        sys.modules.pop("my_methods", None)
