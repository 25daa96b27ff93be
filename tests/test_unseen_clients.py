"""FedBN Table 17's unseen-domain columns (issue 48): a table's ``unseen:<name>`` column is the accuracy of a
client that never trained, built by FedBN's App. G recipe (averaged BN affine + BN statistics of its own
images) on the finished run. Checked against an independent computation from the files the fake tree holds:
the images fitted and normalised by hand, the seeded draw of the statistics' samples, each BN layer's
statistics taken in forward order with ``torch.var_mean`` over the whole set, predictions by argmax."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fednorm.data.morpho_mnist_test import write_fake_morpho_mnist
from fednorm.errors import ConfigError, DatasetError
from fednorm.reproduce import plan, run_all, run_state, runner
from fednorm.reproduce.report import run_metrics
from fednorm.reproduce.suite import configs_root, load_table

TABLE17 = configs_root() / "fedbn" / "table17.yaml"


def _fake_digits5(root: Path) -> None:
    rng = np.random.default_rng(3)
    for domain in ("mnist", "svhn", "usps", "synth", "mnistm"):
        for split, n in (("train", 40), ("test", 10)):
            y = np.arange(n, dtype=np.int64) % 10
            np.savez(root / f"{domain}_{split}.npz", x=rng.integers(0, 256, (n, 28, 28, 3), dtype=np.uint8), y=y)


def _finished_run(run_dir: Path):
    """The run's simulation at its last checkpoint, and its state with every local tensor averaged."""
    from fednorm.config import load_config
    from fednorm.engine.checkpoint import load_latest
    from fednorm.engine.simulator import Simulation

    sim = Simulation(load_config(run_dir / "config.yaml"))
    sim.load_state_dict(load_latest(run_dir))
    state = dict(sim.global_state)
    bank = sim.bank.state_dict()
    for key in sim.method.local_keys:  # FedBN: every BN tensor, averaged uniformly over the 5 clients
        vals = torch.stack([bank[c][key] for c in bank if key in bank[c]])
        state[key] = vals.double().mean(0).to(vals.dtype) if vals.is_floating_point() else vals.max(0).values
    return sim, state


def _independent_accuracy(run, x_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, num_samples: int
                          ) -> tuple[float, dict[str, torch.Tensor]]:
    sim, state = run
    model = sim.global_model(state).double().eval()
    pick = np.sort(np.random.default_rng(sim.config.seed).choice(len(x_train), size=num_samples, replace=False))

    def inputs(x: np.ndarray) -> torch.Tensor:  # grey 28×28 -> 3 channels, (v / 255 - 0.5) / 0.5, as the digits domains
        t = torch.from_numpy(x).double().div(255).unsqueeze(1).repeat(1, 3, 1, 1)
        return (t - 0.5) / 0.5

    x, xt = inputs(x_train[pick]), inputs(x_test)
    bns = {name: m for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    order: list[str] = []
    hooks = [m.register_forward_pre_hook(lambda mod, inp, n=n: order.append(n)) for n, m in bns.items()]
    with torch.no_grad():
        model(x[:2])
    for h in hooks:
        h.remove()
    stats = {}
    for name in order:  # each layer's input with every earlier layer already on its new statistics
        seen: dict[str, torch.Tensor] = {}
        hook = bns[name].register_forward_pre_hook(lambda mod, inp: seen.__setitem__("x", inp[0]))
        with torch.no_grad():
            model(x)
        hook.remove()
        t = seen["x"]
        var, mean = torch.var_mean(t, dim=[d for d in range(t.dim()) if d != 1], unbiased=True)
        bns[name].running_mean.copy_(mean)
        bns[name].running_var.copy_(var)
        stats[name] = mean
    with torch.no_grad():
        pred = model(xt).argmax(1).numpy()
    return float((pred == y_test).mean()), stats


@pytest.mark.slow
def test_unseen_column_equals_an_independent_computation_on_the_run(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    _fake_digits5(data)
    written = write_fake_morpho_mnist(data, ("global", "local"), n_train=20, n_test=20, seed=5)  # fewer than 743: all
    table = load_table(TABLE17)
    assert table.unseen["morpho_global"].num_samples == 743
    specs = [s for s in plan([table], scale="reduced", out=tmp_path / "out", seeds=1, data_dir=str(data), rows=["fedbn"],
                             overrides={"device": "cpu", "rounds": 1, "checkpoint_every": 0,
                                        "partition_args": {"per_client": 8}})]
    assert len(specs) == 1 and sorted(specs[0].cells) == [("fedbn", "morpho_global"), ("fedbn", "morpho_local")]
    runner.prepare_data(table, specs, source_dir=str(data), out=tmp_path / "out")
    run_all([(s, run_state(s)) for s in specs], progress=False)
    run_dir = specs[0].dir
    recorded = json.loads((run_dir / "unseen.json").read_text())
    assert set(recorded) == {"morpho_global", "morpho_local"}
    run = _finished_run(run_dir)
    for name, variant in (("morpho_global", "global"), ("morpho_local", "local")):
        entry = recorded[name]
        assert (entry["round"], entry["num_stat_samples"], entry["num_test"], entry["new_client"]) == (1, 20, 20, True)
        assert entry["dataset_args"] == {"variant": variant} and entry["method"] == "fedbn"
        x_train, _, _ = written[(variant, "train")]
        x_test, y_test, _ = written[(variant, "t10k")]
        expected, _ = _independent_accuracy(run, x_train, x_test, y_test.astype(np.int64), 20)
        assert entry["accuracy"] == expected
        # the report's cell for the column reads the same number, in %, as the run's final and best
        metrics = run_metrics(run_dir, f"unseen:{name}")
        assert metrics["final"] == metrics["best"] == 100.0 * expected and metrics["final_round"] == 1
    # a seeded draw of 12 of the 20 training images: the same statistics and accuracy as the independent ones
    from fednorm.evaluation.unseen import adapt_run_to_dataset

    result = adapt_run_to_dataset(run_dir, "morpho_mnist", dataset_args={"variant": "global"}, num_samples=12, write=False)
    x_train, _, _ = written[("global", "train")]
    x_test, y_test, _ = written[("global", "t10k")]
    expected, stats = _independent_accuracy(run, x_train, x_test, y_test.astype(np.int64), 12)
    assert (result.num_stat_samples, result.accuracy) == (12, expected)
    assert set(result.statistics) == set(stats)
    for name, mean in stats.items():
        # the run's model computes in float32 (its activations carry float32 rounding), this one in float64
        torch.testing.assert_close(result.statistics[name][0], mean, rtol=1e-5, atol=1e-5)


def test_unseen_entries_are_checked_when_the_table_loads(tmp_path: Path) -> None:
    text = TABLE17.read_text()
    folder = tmp_path / "fedbn"
    folder.mkdir()
    bad = folder / "table17.yaml"
    bad.write_text(text.replace('metric: "unseen:morpho_local"', 'metric: "unseen:morpho_locl"'))
    with pytest.raises(ConfigError, match=r"table17.yaml: column 'morpho_local' reads unseen:morpho_locl.*morpho_global, morpho_local"):
        load_table(bad)
    bad.write_text(text.replace("    num_samples: 743          #", "    num_sample: 743          #"))
    with pytest.raises(ConfigError, match=r"unseen.morpho_global has unknown keys \['num_sample'\]"):
        load_table(bad)
    bad.write_text(text.replace("  seeds: 1\nrows:", "  seeds: 1\n  data_subset: {train_per_class: 4, test_per_class: 2, seed: 0}\nrows:"))
    with pytest.raises(ConfigError, match="reduced.data_subset"):
        load_table(bad)


def test_missing_unseen_files_stop_the_table_before_training(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    _fake_digits5(data)  # the training data is there, Morpho-MNIST is not
    table = load_table(TABLE17)
    specs = plan([table], scale="reduced", out=tmp_path / "out", seeds=1, data_dir=str(data))
    with pytest.raises(DatasetError, match=r"(?s)fedbn/table17 needs 'morpho_mnist'.*global.*--data-dir"):
        runner.prepare_data(table, specs, source_dir=str(data), out=tmp_path / "out")


def test_fednorm_adapt_dataset_scores_a_runs_model_on_another_dataset(tmp_path: Path, capsys) -> None:
    """``fednorm adapt RUN --dataset`` is the table column's computation from the command line: a digits
    run (8×8 grey) scored on Morpho-MNIST's fake global folder prints and records what the Python call
    gives, under the name the dataset and its variant make; misuse stops with a one-line error."""
    from fednorm.cli.main import main
    from fednorm.evaluation.unseen import adapt_run_to_dataset, read_unseen

    data = tmp_path / "morpho"
    write_fake_morpho_mnist(data, variants=("global",))
    run_dir = tmp_path / "run"
    assert main(["run", "--dataset", "digits", "--model", "mlp", "--norm", "bn", "--method", "fedbn", "--num-clients", "3",
                 "--rounds", "2", "--batch-size", "32", "--threads", "1", "--quiet", "--out", str(run_dir)]) == 0
    capsys.readouterr()
    argv = ["adapt", str(run_dir), "--dataset", "morpho_mnist", "--dataset-args", "{variant: global}",
            "--num-samples", "12", "--data-dir", str(data)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    want = adapt_run_to_dataset(run_dir, "morpho_mnist", dataset_args={"variant": "global"}, num_samples=12,
                                data_dir=str(data), write=False)
    recorded = read_unseen(run_dir)["morpho_mnist_global"]
    assert recorded["accuracy"] == want.summary()["accuracy"] and recorded["num_stat_samples"] == 12
    assert json.loads(printed[: printed.rindex("}") + 1])["accuracy"] == want.summary()["accuracy"]
    assert "morpho_mnist_global" in printed
    # scoring again says which entry it replaces, never silently
    assert main([*argv[:-4], "--num-samples", "20", *argv[-2:]]) == 0
    assert f"replacing the earlier entry (accuracy {recorded['accuracy']}, num_samples 12)" in capsys.readouterr().out
    assert read_unseen(run_dir)["morpho_mnist_global"]["num_samples"] == 20
    assert main(["adapt", str(run_dir), "--client", "0", "--dataset-args", "{variant: global}"]) == 2
    assert "--dataset-args goes with --dataset" in capsys.readouterr().err
