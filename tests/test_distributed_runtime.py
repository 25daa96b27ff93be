"""The torch.distributed runtime: same config, same metrics as the in-process simulator.

Two gloo processes over loopback run every method that exists with its clients spread over the
ranks (round robin, so each rank trains a different subset and keeps those clients' local state);
the metrics must equal the in-process run's to float64 rounding. Then the real launcher
(``fednorm launch`` → torchrun): a rank that dies mid-run stops the run with a clear message and a
checkpoint from which ``--resume`` (with another process count) finishes the run exactly.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from _compare import assert_close_tree
from fednorm.api import run
from fednorm.config import ExperimentConfig

BASE = dict(dataset="digits", partition="dirichlet", alpha=0.5, num_clients=5, rounds=2, local_epochs=1, batch_size=32,
            lr=0.1, momentum=0.9, model="mlp", model_args={"hidden": 32}, dtype="float64", augment=False, threads=1,
            eval_every=1, seed=3)

CASES: dict[str, dict] = {
    "fedavg+bn": dict(method="fedavg", norm="bn"),
    "fedavg+bn, 3 of 5 clients, scaffold, fedadam": dict(method="fedavg", norm="bn", clients_per_round=3,
                                                         client_opt="scaffold", server_opt="fedadam",
                                                         server_opt_args={"server_lr": 0.01}),
    "fedbn": dict(method="fedbn", norm="bn"),
    "hbn": dict(method="hbn", norm="hbn", batch_size=16),
    # the evaluation's statistics pass asks every client, on both ranks, not only the round's
    "hbn, 3 of 5 clients, eval_resync all": dict(method="hbn", norm="hbn", batch_size=16, clients_per_round=3,
                                                 method_args={"eval_resync": "all"}),
    "fbn": dict(method="fbn", norm="fbn", dsgd=True, batch_size=16, lr=0.3, rounds=20, eval_every=10),
    "fedtan": dict(method="fedtan", norm="bn", local_steps=3, batch_size=16, momentum=0.0),
    # each rank holds out the same validation samples of its clients and scores them as in-process
    "fedbn, validation": dict(method="fedbn", norm="bn", validation_fraction=0.3, rounds=3),
    "fedavg+bn, 3 of 5 clients, validation": dict(method="fedavg", norm="bn", clients_per_round=3,
                                                  validation_fraction=0.3, rounds=3),
}
VALIDATION = ("val_accuracy", "val_loss", "client_val_accuracies")
SELECTION = ("best_val_round", "best_val_accuracy", "best_val_test_accuracy", "best_val_client_accuracies",
             "client_best_val_rounds", "client_best_val_test_accuracies")


def _config(case: str) -> ExperimentConfig:
    return ExperimentConfig(**{**BASE, **CASES[case]})


def _metrics(result) -> dict:
    keep = ("test_accuracy", "test_loss", "mean_client_accuracy", "client_accuracies", "train_loss", "uplink_bytes",
            "downlink_bytes", "downlink_bytes_broadcast", "comm_rounds", "samples_trained")
    out = {"history": [{k: h[k] for k in (*keep, *VALIDATION) if k in h} for h in result.history]}
    s = result.summary
    out["final_sync"] = s.get("final_sync")
    out["method_report"] = s.get("method_report")
    out["selection"] = {k: s[k] for k in SELECTION if k in s}
    return out


def _worker(rank: int, world: int, tmp: str) -> None:
    from fednorm.distributed import DistributedSimulation

    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    code = 1
    try:
        results = {}
        for case in CASES:
            result = run(_config(case), write=False, progress=False, simulation=DistributedSimulation)
            results[case] = _metrics(result)
        if rank == 0:
            Path(tmp, "distributed.json").write_text(json.dumps(results))
        # A divergence inside one rank's training stops every rank with the same error, no hang.
        try:
            run(ExperimentConfig(**{**BASE, "lr": 1e12, "rounds": 3}), write=False, progress=False, simulation=DistributedSimulation)
            outcome = "finished"
        except Exception as exc:  # noqa: BLE001 - the type is what the test checks
            outcome = type(exc).__name__
        Path(tmp, f"diverge{rank}.txt").write_text(outcome)
        dist.barrier()
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip interpreter finalisation: gloo's worker threads can abort a process there
        # ("terminate called without an active exception", see pytorch/pytorch#179291).
        os._exit(code)


_close = assert_close_tree


def test_two_processes_give_the_simulators_metrics_for_every_method(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(r, 2, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    distributed = json.loads(Path(tmp_path, "distributed.json").read_text())
    assert [Path(tmp_path, f"diverge{r}.txt").read_text() for r in range(2)] == ["DivergenceError"] * 2
    for case in CASES:
        local = json.loads(json.dumps(_metrics(run(_config(case), write=False, progress=False))))
        assert local["history"][-1]["test_accuracy"] > 0.2, case  # the runs learn something
        if "validation" in case:  # the validation figures exist, so the comparison below covers them
            assert all("client_val_accuracies" in h for h in local["history"]), case
            assert local["selection"]["best_val_round"] in range(1, 4), case
        _close(distributed[case], local, case)


# -- the launcher: torchrun, a dying rank, resume -------------------------------------------------------

def _launch(*args: str, env_extra: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "fednorm.cli.main", "launch", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


LAUNCH_ARGS = ["--dataset", "digits", "--num-clients", "4", "--rounds", "4", "--model", "mlp", "--method", "fedbn",
               "--dtype", "float64", "--augment", "false", "--checkpoint-every", "1", "--seed", "5", "--quiet"]


@pytest.mark.slow
def test_launch_survives_a_dead_rank_with_a_resumable_checkpoint(tmp_path):
    from fednorm.engine.checkpoint import load_latest

    out = tmp_path / "run"
    dead = _launch("--nproc", "2", "--timeout", "60", *LAUNCH_ARGS, "--out", str(out),
                   env_extra={"FEDNORM_KILL_RANK_AT_ROUND": "1:3"})
    assert dead.returncode != 0
    assert "resume" in dead.stderr and str(out) in dead.stderr, dead.stderr[-2000:]
    assert load_latest(out)["server_round"] == 2  # rounds 1-2 committed, round 3 never finished

    resumed = _launch("--nproc", "3", "--resume", str(out))  # another process count: clients move ranks
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 4 and summary["world_size"] == 3
    # Off a terminal, rank 0 alone prints `fednorm run`'s line per evaluation (every round here).
    progress = [line for line in resumed.stdout.splitlines() if ": test accuracy " in line]
    assert [line.split(":")[0] for line in progress] == ["fedbn+bn round 3/4", "fedbn+bn round 4/4"], resumed.stdout

    reference = run(ExperimentConfig(dataset="digits", num_clients=4, rounds=4, model="mlp", method="fedbn",
                                     dtype="float64", augment=False, seed=5), write=False, progress=False)
    _close(summary["final_client_accuracies"], reference.summary["final_client_accuracies"], "clients")
    _close(summary["final_test_loss"], reference.summary["final_test_loss"], "loss")


@pytest.mark.slow
def test_launch_fails_fast_when_a_rank_hangs(tmp_path):
    hung = _launch("--nproc", "2", "--timeout", "5", *LAUNCH_ARGS, "--out", str(tmp_path / "run"),
                   env_extra={"FEDNORM_KILL_RANK_AT_ROUND": "1:2:hang"}, timeout=240)
    assert hung.returncode != 0
    assert "resume" in hung.stderr, hung.stderr[-2000:]


@pytest.mark.slow
def test_lockstep_method_rejects_a_rank_without_clients(tmp_path):
    bad = _launch("--nproc", "3", *LAUNCH_ARGS[:-1], "--method", "fedtan", "--num-clients", "2", "--out", str(tmp_path / "r"))
    assert bad.returncode != 0
    assert "hosts no non-empty client" in bad.stderr, bad.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("how, status", [("ctrl-c", 130), ("sigterm", 143)])
def test_an_interrupted_launch_stops_after_a_round_without_a_traceback(tmp_path, how, status):
    """A Ctrl-C reaches the launcher's process group, a scheduler's SIGTERM the launcher alone;
    either way the workers (in their own session) stop together after a round with a checkpoint,
    and the launcher exits with the signal's status, 130 or 143 (not 0: a scheduler must not read
    the run as done), with no traceback from torchrun."""
    import signal
    import time

    out = tmp_path / "run"
    args = list(LAUNCH_ARGS)
    args[args.index("--rounds") + 1] = "100000"  # far more than the test waits for
    args += ["--eval-every", "1"]  # a metrics line per round shows that training runs
    proc = subprocess.Popen([sys.executable, "-m", "fednorm.cli.main", "launch", "--nproc", "2", *args, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 240
        while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip():
            assert time.monotonic() < deadline and proc.poll() is None, "the run did not start"
            time.sleep(0.5)
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == status, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "interrupted" in stderr and "--resume" in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["rounds"] >= 1
