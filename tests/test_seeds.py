"""fednorm run --seeds / fednorm.seeds.run_seeds: one run directory per seed, mean ± std of the
summary metrics checked against an independent computation, finished seeds kept, interrupted
ones resumed."""

import csv
import json
import statistics
from pathlib import Path

import pytest

from fednorm.cli.main import main
from fednorm.config import ExperimentConfig
from fednorm.seeds import load_run, run_seeds

TINY = dict(dataset="digits", num_clients=3, rounds=2, batch_size=32, checkpoint_every=1, threads=1)


def test_every_seed_gets_its_run_and_the_statistics_are_the_seeds(tmp_path: Path) -> None:
    calls = []

    def counting_run(*args, **kwargs):
        from fednorm.api import run

        calls.append(kwargs.get("resume") or args[0].seed)
        return run(*args, **kwargs)

    res = run_seeds(ExperimentConfig(**TINY), [3, 5, 4], tmp_path, run=counting_run, progress=False)
    assert calls == [3, 5, 4] and list(res.runs) == [3, 5, 4]
    finals = {}
    for seed in (3, 4, 5):
        summary, history = load_run(tmp_path / f"seed{seed}")
        assert summary["seed"] == seed and summary["status"] == "completed" and len(history) == 2
        finals[seed] = summary["final_test_accuracy"]
    st = res.stats["final_test_accuracy"]
    assert st.mean == pytest.approx(sum(finals.values()) / 3)
    assert st.std == pytest.approx(statistics.stdev(finals.values()))
    assert (st.min, st.max) == (min(finals.values()), max(finals.values()))
    assert len(set(finals.values())) > 1  # the seeds differ, so the std is not trivially 0
    saved = json.loads((tmp_path / "seeds.json").read_text())
    assert saved["metrics"]["final_test_accuracy"]["values"] == {str(s): v for s, v in finals.items()}
    rows = {r["metric"]: r for r in csv.DictReader(open(tmp_path / "seeds.csv"))}
    assert float(rows["final_test_accuracy"]["mean"]) == pytest.approx(st.mean)
    assert (tmp_path / "accuracy_seeds.png").stat().st_size > 0
    # a second call reruns nothing
    calls.clear()
    again = run_seeds(ExperimentConfig(**TINY), [3, 5, 4], tmp_path, run=counting_run, progress=False)
    assert calls == [] and sorted(again.reused) == [3, 4, 5]
    assert again.stats["final_test_accuracy"].mean == pytest.approx(st.mean)


def test_an_interrupted_seed_is_resumed_not_restarted(tmp_path: Path) -> None:
    done = tmp_path / "seed0"
    done.mkdir()
    (done / "checkpoint.pt").write_bytes(b"stand-in")
    (done / "summary.json").write_text(json.dumps({"status": "interrupted"}))
    calls = []

    def fake_run(config=None, *, resume=None, **kwargs):
        calls.append((config.seed if config is not None else None, resume))
        d = Path(resume) if resume is not None else Path(config.out)
        d.mkdir(parents=True, exist_ok=True)
        (d / "summary.json").write_text(json.dumps({"status": "completed", "final_test_accuracy": 0.5}))
        (d / "metrics.jsonl").write_text(json.dumps({"round": 1, "test_accuracy": 0.5}) + "\n")

    res = run_seeds(ExperimentConfig(**TINY), [0, 1], tmp_path, run=fake_run, plot=False)
    assert calls == [(None, done), (1, None)]
    assert res.stats["final_test_accuracy"].std == 0.0


def test_per_source_accuracy_of_feature_shift_runs() -> None:
    from fednorm.seeds import summarize_seeds

    summaries = {
        0: {"client_sources": ["mnist", "usps", "mnist"], "final_client_accuracies": [0.9, 0.6, 0.7]},
        1: {"client_sources": ["mnist", "usps", "mnist"], "final_client_accuracies": [0.8, 0.5, 0.8]},
    }
    stats = summarize_seeds(summaries)
    assert stats["final_accuracy[mnist]"].values == {0: pytest.approx(0.8), 1: pytest.approx(0.8)}
    assert stats["final_accuracy[usps]"].mean == pytest.approx(0.55)


def test_cli_num_seeds_prints_mean_and_std_and_keeps_finished_seeds(tmp_path: Path, capsys) -> None:
    argv = ["run", "--num-seeds", "2", "--seed", "7", "--rounds", "1", "--num-clients", "3", "--batch-size", "32",
            "--threads", "1", "--quiet", "--out", str(tmp_path / "sweep")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2 seed(s) (7, 8)" in out and "final_test_accuracy" in out and "±" in out
    assert (tmp_path / "sweep" / "seed7" / "summary.json").exists() and (tmp_path / "sweep" / "seed8").is_dir()
    assert main(argv) == 0
    assert "kept the finished seed(s) 7, 8" in capsys.readouterr().out
    assert main([*argv[:-2], "--resume", str(tmp_path / "x")]) == 2
