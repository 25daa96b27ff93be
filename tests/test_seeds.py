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


def test_compare_over_seeds_tabulates_each_variant_mean_and_std(tmp_path: Path, capsys) -> None:
    out = tmp_path / "cmp"
    argv = ["compare", "--seeds", "0,1", "--methods", "fedavg,fedbn", "--dataset", "digits", "--num-clients", "3",
            "--rounds", "2", "--batch-size", "32", "--eval-every", "1", "--threads", "1", "--quiet", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    saved = json.loads((out / "results.json").read_text())
    assert saved["seeds"] == [0, 1] and list(saved["variants"]) == ["fedavg+bn", "fedbn+bn"]
    rows = list(csv.DictReader(open(out / "results.csv")))
    for label, folder in (("fedavg+bn", "fedavg_bn"), ("fedbn+bn", "fedbn_bn")):
        finals = [load_run(out / folder / f"seed{s}")[0]["final_test_accuracy"] for s in (0, 1)]
        got = saved["variants"][label]["metrics"]["final_test_accuracy"]
        assert got["mean"] == pytest.approx(statistics.fmean(finals))
        assert got["std"] == pytest.approx(statistics.stdev(finals)) and got["std"] > 0
        row = next(r for r in rows if r["variant"] == label and r["metric"] == "final_test_accuracy")
        assert float(row["seed0"]) == pytest.approx(finals[0]) and row["n"] == "2"
        cell = f"{100 * statistics.fmean(finals):.2f} ± {100 * statistics.stdev(finals):.2f}"
        assert cell in printed and cell in (out / "results.md").read_text()
    assert "| fedbn+bn | per client | 2 |" in printed
    assert (out / "accuracy.png").stat().st_size > 0
    # rerunning keeps every finished seed
    stamp = (out / "fedbn_bn" / "seed1" / "summary.json").stat().st_mtime_ns
    assert main(argv) == 0
    assert (out / "fedbn_bn" / "seed1" / "summary.json").stat().st_mtime_ns == stamp


def test_mean_std_curve_uses_the_rounds_every_seed_evaluated() -> None:
    from fednorm.seeds import mean_std_curve

    hist = {0: [{"round": 1, "test_accuracy": 0.2}, {"round": 2, "test_accuracy": 0.4}],
            1: [{"round": 2, "test_accuracy": 0.6}, {"round": 3, "test_accuracy": 0.9}]}
    rounds, means, stds = mean_std_curve(hist)
    assert rounds == [2] and means == pytest.approx([0.5]) and stds == pytest.approx([statistics.stdev([0.4, 0.6])])


def test_the_overall_bar_counts_every_round_of_every_seed(tmp_path: Path) -> None:
    import io

    from fednorm.cli.progress import OverallBar

    out = io.StringIO()
    bar = OverallBar(runs=2, rounds=2, file=out)
    run_seeds(ExperimentConfig(**TINY), [0, 1], tmp_path, progress=False, on_round=bar, plot=False)
    assert bar.bar.n == bar.bar.total == 4 and "run 2/2: fedavg+bn seed " in out.getvalue()  # stacked: either seed starts second
    bar.close()


def test_stacked_seeds_train_on_the_split_their_keyword_config_asks_for(tmp_path):
    """Config fields given as keywords (partition="iid") decide the data the stacked seeds share:
    before, the shared copy was built from the config without them (a Dirichlet split under a
    record that said iid), which the data-field check now refuses; each seed's clients must hold
    what fednorm.run of that seed's config alone gives them."""
    import torch

    from fednorm.config import load_config
    from fednorm.data.federated import federated_data_from_config
    from fednorm.seeds import run_seeds

    kw = dict(rounds=1, model="mlp", partition="iid", num_clients=4, clients_per_round=2, threads=1)
    result = run_seeds(None, [0, 1], tmp_path / "s", plot=False, progress=False, **kw)
    for seed in (0, 1):
        recorded = json.loads((tmp_path / "s" / f"seed{seed}" / "partition.json").read_text())
        assert recorded["partition"] == "iid" and result.summaries[seed]["status"] == "completed"
        alone = federated_data_from_config(load_config(None, {**kw, "seed": seed}))
        counts = [[int(c) for c in torch.bincount(alone.train_y[idx], minlength=alone.num_classes)] for idx in alone.client_train]
        assert recorded["train_label_counts"] == counts


def test_seeds_with_validation_summarise_the_test_accuracy_at_each_seeds_best_validation_round(tmp_path: Path) -> None:
    """With validation_fraction every seed's summary.json has the test accuracy at its best validation
    round; the seeds' statistics are those figures, read back from each run's evaluations here, and a
    comparison's table gets a column for them."""
    from fednorm.seeds import SeedsComparison

    cfg = ExperimentConfig(**{**TINY, "rounds": 4, "eval_every": 1, "validation_fraction": 0.3, "lr": 0.5,
                              "partition": "dirichlet", "alpha": 0.5})
    result = run_seeds(cfg, [0, 1], tmp_path / "val", plot=False)
    expected = {}
    for seed in (0, 1):
        _, history = load_run(tmp_path / "val" / f"seed{seed}")
        evaluated = [h for h in history if "val_accuracy" in h]
        best = max(h["val_accuracy"] for h in evaluated)
        expected[seed] = next(h for h in evaluated if h["val_accuracy"] == best)["test_accuracy"]
    got = result.stats["best_val_test_accuracy"]
    assert got.values == pytest.approx(expected)
    assert got.mean == pytest.approx(statistics.fmean(expected.values()))
    table = SeedsComparison(tmp_path, [0, 1], {"fedavg+bn": result}).markdown()
    assert "acc at best val (%)" in table.splitlines()[0]
    assert f"{100 * got.mean:.2f} ± {100 * got.std:.2f}" in table
    # runs without validation add no such column
    plain = run_seeds(ExperimentConfig(**TINY), [0], tmp_path / "plain", plot=False)
    assert "best_val_test_accuracy" not in plain.stats
    assert "best val" not in SeedsComparison(tmp_path, [0], {"fedavg+bn": plain}).markdown()


def test_per_source_accuracy_at_the_best_validation_round() -> None:
    from fednorm.seeds import summarize_seeds

    summaries = {
        0: {"client_sources": ["a", "b", "a"], "final_client_accuracies": [0.9, 0.6, 0.7],
            "best_val_client_accuracies": [0.5, 0.4, 0.9]},
        1: {"client_sources": ["a", "b", "a"], "final_client_accuracies": [0.8, 0.5, 0.8],
            "best_val_client_accuracies": [0.6, 0.2, 0.6]},
    }
    stats = summarize_seeds(summaries)
    assert stats["best_val_test_accuracy[a]"].values == {0: pytest.approx(0.7), 1: pytest.approx(0.6)}
    assert stats["best_val_test_accuracy[b]"].mean == pytest.approx(0.3)
    assert stats["final_accuracy[a]"].mean == pytest.approx(0.8)
