"""Checkpoint/resume (including a real SIGKILL), client faults, divergence, bad resume input."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from fednorm import api
from fednorm.cli.main import main
from fednorm.engine.checkpoint import CheckpointError, load_latest
from fednorm.engine.outputs import read_metrics
from fednorm.errors import ConfigError, DivergenceError, RoundFailedError
from fednorm.methods import FedAvg, register_method

BASE = dict(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=6, clients_per_round=3, batch_size=32,
            lr=0.05, momentum=0.9, model="mlp", norm="bn", seed=5)


def _no_time(history):
    return [{k: v for k, v in h.items() if k != "wall_seconds"} for h in history]


def _final_state(run_dir):
    return load_latest(run_dir)["global_state"]


def test_resume_from_checkpoint_equals_uninterrupted_run(tmp_path):
    full = api.run(rounds=6, checkpoint_every=2, out=str(tmp_path / "full"), progress=False, **BASE)
    api.run(rounds=3, checkpoint_every=2, out=str(tmp_path / "part"), progress=False, **BASE)
    resumed = api.run(resume=tmp_path / "part", rounds=6, progress=False)
    assert resumed.summary["status"] == "completed" and resumed.summary["rounds"] == 6
    assert _no_time(resumed.history) == _no_time(full.history)
    for key, value in full.simulation.global_state.items():
        assert torch.equal(resumed.simulation.global_state[key], value), key
    lines = (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == list(range(1, 7))


def _cli(*args, **kw):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "fednorm", "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **kw)


def _cli_args(out, rounds=8):
    # One thread in both processes: without --threads each picks its count from the load at its start.
    args = ["--out", str(out), "--rounds", str(rounds), "--checkpoint-every", "1", "--threads", "1", "--quiet"]
    for k, v in BASE.items():
        args += ["--" + k.replace("_", "-"), str(v)]
    return args


def _wait_for_rounds(out, n, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        path = out / "metrics.jsonl"
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.stderr.read()}")
        time.sleep(0.05)
    raise AssertionError("timed out waiting for rounds")


def test_sigkill_at_a_random_point_then_resume_gives_identical_results(tmp_path):
    rounds = 40  # long enough that the kill lands in training (8 rounds had finished before it)
    ref = tmp_path / "ref"
    assert _cli(*_cli_args(ref, rounds=rounds)).wait(timeout=300) == 0
    killed = tmp_path / "killed"
    proc = _cli(*_cli_args(killed, rounds=rounds))
    rng = np.random.default_rng(7)  # a seeded "random point": after k evaluations plus a random delay
    k = int(rng.integers(1, 6))
    _wait_for_rounds(killed, k, proc)
    time.sleep(float(rng.uniform(0, 0.2)))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    # the kill interrupted training: no summary was written and the checkpoint is short of the end
    assert not (killed / "summary.json").exists() and load_latest(killed)["server_round"] < rounds
    done = subprocess.run([sys.executable, "-m", "fednorm", "run", "--resume", str(killed), "--quiet"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    a = json.loads((ref / "summary.json").read_text())
    b = json.loads((killed / "summary.json").read_text())
    for key in ("final_test_accuracy", "final_test_loss", "best_test_accuracy", "rounds", "uplink_bytes", "samples_trained"):
        assert a[key] == b[key], key
    assert _no_time(read_metrics(ref)) == _no_time(read_metrics(killed))
    sa, sb = _final_state(ref), _final_state(killed)
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def test_sigterm_stops_after_the_round_with_a_checkpoint(tmp_path):
    out = tmp_path / "r"
    proc = _cli(*_cli_args(out, rounds=200))
    _wait_for_rounds(out, 2, proc)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143  # 128 + SIGTERM: a scheduler must not read an interrupted run as done
    assert "interrupted after round" in stdout and "--resume" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert load_latest(out)["server_round"] == summary["rounds"]


def test_simulated_client_faults_are_dropped_and_recorded(tmp_path):
    res = api.run(rounds=6, client_failure_rate=0.3, client_nan_rate=0.2, straggler_rate=0.2, num_clients=8,
                  clients_per_round=5, write=False, progress=False, **{k: v for k, v in BASE.items() if k not in ("num_clients", "clients_per_round")})
    dropped = res.summary["dropped_clients"]
    assert dropped.get("crash", 0) > 0 and dropped.get("non_finite_update", 0) > 0 and dropped.get("straggler", 0) > 0
    events = [e for h in res.history for e in h["events"]]
    assert sum(dropped.values()) == len(events)
    assert all(set(e) == {"round", "client", "kind", "detail"} for e in events)
    assert all(torch.isfinite(v).all() for v in res.simulation.global_state.values() if v.is_floating_point())


def test_too_few_clients_fails_the_round_with_a_clear_message():
    with pytest.raises(RoundFailedError, match=r"fewer than min_clients=3"):
        api.run(rounds=3, client_failure_rate=0.9, min_clients=3, write=False, progress=False, **BASE)


@register_method("_test_flaky", force=True)
class Flaky(FedAvg):
    name = "_test_flaky"

    def client_begin(self, ctx):
        if ctx.client_id % 2 == 0:
            raise RuntimeError("disk full")


def test_a_client_that_raises_is_dropped_and_recorded():
    res = api.run(rounds=2, method="_test_flaky", write=False, progress=False, **{k: v for k, v in BASE.items() if k != "seed"}, seed=1)
    events = [e for h in res.history for e in h["events"]]
    assert events and all(e["kind"] == "error" and "disk full" in e["detail"] and e["client"] % 2 == 0 for e in events)


def test_divergence_names_round_client_method_and_keeps_last_good_checkpoint(tmp_path):
    out = tmp_path / "d"
    with pytest.raises(DivergenceError, match=r"round \d+, client \d+, method fedavg") as info:
        api.run(rounds=30, lr=1e6, momentum=0.0, checkpoint_every=1, out=str(out), progress=False,
                **{k: v for k, v in BASE.items() if k not in ("lr", "momentum")})
    assert "--resume" in str(info.value)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "diverged" and "non-finite" in summary["error"]
    state = load_latest(out)
    assert state["server_round"] == summary["rounds"]
    assert all(torch.isfinite(v).all() for v in state["global_state"].values() if v.is_floating_point())


def test_resume_refuses_changed_settings_and_corrupt_checkpoints(tmp_path, capsys):
    out = tmp_path / "r"
    api.run(rounds=2, checkpoint_every=1, out=str(out), progress=False, **BASE)
    with pytest.raises(ConfigError, match="cannot change lr"):
        api.run(resume=out, lr=0.5)
    (out / "checkpoint.pt").write_bytes(b"garbage")
    (out / "checkpoint.prev.pt").write_bytes(b"")
    assert main(["run", "--resume", str(out)]) == 1
    err = capsys.readouterr().err
    assert "checkpoint" in err and "Traceback" not in err
    with pytest.raises(CheckpointError):
        load_latest(out)
    assert main(["run", "--resume", str(tmp_path / "nowhere")]) == 2


def test_a_checkpoint_from_before_a_config_field_existed_still_resumes(tmp_path):
    """A field added to ExperimentConfig after a run started is absent from its checkpoint and
    config.yaml; its default is the behaviour the run had, so the run resumes and finishes."""
    import yaml

    from fednorm.engine.checkpoint import save_checkpoint

    out = tmp_path / "old"
    api.run(rounds=1, checkpoint_every=1, out=str(out), progress=False, **BASE)
    new_fields = ("eval_autocast", "eval_compile", "input_norm")  # fields this version added
    checkpoint = {k: v for k, v in load_latest(out).items() if k not in ("version", "fednorm_version")}
    for key in new_fields:
        del checkpoint["config"][key]
    save_checkpoint(out, checkpoint)
    saved = yaml.safe_load((out / "config.yaml").read_text())
    (out / "config.yaml").write_text(yaml.safe_dump({k: v for k, v in saved.items() if k not in new_fields}))
    result = api.run(resume=out, rounds=2, progress=False)
    assert result.summary["status"] == "completed" and result.summary["rounds"] == 2
    with pytest.raises(ConfigError, match="settings differ"):  # a real difference is still refused
        checkpoint["config"]["lr"] = 0.123
        save_checkpoint(out, checkpoint)
        api.run(resume=out, rounds=3, progress=False)
