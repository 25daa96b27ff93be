"""A run's record is what ran (issue 47, items 2 and 7).

Item 2: settings beside ``data=`` that cannot apply to it are refused in one line, and a run of
such data does not write them into its ``config.yaml``; every config field has one role
(fednorm/config_roles.py), from which the lists of fields used across fednorm are derived.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
import yaml

from fednorm import api
from fednorm import config_roles as roles
from fednorm.config import ExperimentConfig, load_config
from fednorm.data.federated import FederatedData
from fednorm.errors import ConfigError


def _data(augment: bool = False) -> FederatedData:
    g = torch.Generator().manual_seed(0)
    clients = [(torch.randn(24, 1, 8, 8, generator=g) + k, torch.randint(0, 3, (24,), generator=g)) for k in range(3)]
    test = (torch.randn(18, 1, 8, 8, generator=g), torch.arange(18) % 3)
    return FederatedData.from_tensors(clients, test=test, augment=augment)


_QUICK = {"model": "mlp", "rounds": 1, "batch_size": 8, "progress": False, "threads": 1}


# --- item 2: settings beside data= --------------------------------------------------------------
@pytest.mark.parametrize("setting", [{"augment": True}, {"alpha": 0.1}, {"num_clients": 7}, {"partition": "iid"},
                                     {"dataset": "cifar10"}, {"input_norm": "none"}, {"partition_args": {"mode": "ring"}}])
def test_a_data_setting_beside_data_is_refused_in_one_line(setting, tmp_path):
    with pytest.raises(ConfigError) as err:
        api.run(data=_data(), out=str(tmp_path / "run"), **_QUICK, **setting)
    message = str(err.value)
    assert "\n" not in message and next(iter(setting)) in message and "data=" in message
    assert not (tmp_path / "run" / "config.yaml").exists()  # refused before anything is written
    if "augment" in setting:
        assert "from_tensors(..., augment=True)" in message  # where augmentation of such data is set


def test_settings_that_agree_with_the_data_are_accepted(tmp_path):
    data = _data(augment=True)
    result = api.run(data=data, augment=True, num_clients=3, out=str(tmp_path / "run"), **_QUICK)
    assert result.config.augment is True and result.config.num_clients == 3


def test_a_run_of_your_data_records_only_what_applied(tmp_path):
    api.run(data=_data(augment=True), out=str(tmp_path / "run"), **_QUICK)
    text = (tmp_path / "run" / "config.yaml").read_text()
    saved = yaml.safe_load(text)
    assert saved["dataset"].startswith("user:") and saved["num_clients"] == 3
    assert saved["augment"] is True  # what the data did, not the config's "dataset default" (None)
    for name in ("alpha", "classes_per_client", "gamma", "min_size", "partition_args", "data_dir", "download", "input_norm"):
        assert name not in saved, name
    assert text.startswith("# dataset user:")  # the file says why they are missing
    cfg = load_config(tmp_path / "run" / "config.yaml")  # and reads back (the left-out fields at their defaults)
    assert cfg.dataset == saved["dataset"]
    resumed = api.run(resume=tmp_path / "run", data=_data(augment=True), rounds=2, progress=False)
    assert resumed.summary["rounds"] == 2


def test_augment_true_no_longer_trains_like_augment_false(tmp_path):
    """Before, ``augment=True`` beside data= was recorded and trained bit-identically to the
    unaugmented run; the data's own flag now decides, and it changes the training."""
    plain = api.run(data=_data(), write=False, **_QUICK)
    augmented = api.run(data=_data(augment=True), write=False, **_QUICK)
    assert plain.config.augment is False and augmented.config.augment is True
    assert plain.history[-1]["test_loss"] != augmented.history[-1]["test_loss"]


def test_a_config_of_registry_data_is_recorded_in_full(tmp_path):
    cfg = ExperimentConfig(alpha=0.1)
    assert cfg.recorded() == cfg.model_dump(mode="json")
    assert "# dataset" not in cfg.to_yaml()


# --- item 2: one role per field, the lists derived from it ----------------------------------------
def test_every_config_field_has_exactly_one_known_role():
    assert set(roles.FIELD_ROLES) == set(ExperimentConfig.model_fields), (
        "give each new ExperimentConfig field a role in fednorm/config_roles.py FIELD_ROLES: "
        f"missing {sorted(set(ExperimentConfig.model_fields) - set(roles.FIELD_ROLES))}, "
        f"stale {sorted(set(roles.FIELD_ROLES) - set(ExperimentConfig.model_fields))}")
    assert set(roles.FIELD_ROLES.values()) <= set(roles.ROLES)
    assert ExperimentConfig.role("alpha") == "partition"


def test_the_lists_of_fields_are_derived_from_the_roles():
    from fednorm.api.resume import RESUMABLE_OVERRIDES
    from fednorm.data import federated, flwr_partition, partition, provenance
    from fednorm.flower import protocol
    from fednorm.report import collect
    from fednorm.reproduce import runner, stacking

    assert provenance.DATA_FIELDS is roles.DATA_FIELDS
    assert federated._SPLIT_FIELDS is roles.SPLIT_FIELDS
    assert partition._CONFIG_FIELDS is roles.PARTITION_FIELDS
    assert flwr_partition._CONFIG_FIELDS == {*roles.PARTITION_FIELDS, *partition._DATA_ARGS}
    assert RESUMABLE_OVERRIDES is roles.RESUMABLE_FIELDS
    assert runner.IGNORED_FIELDS is roles.CACHE_IGNORED_FIELDS and runner.DATA_KEYS is roles.DATA_OBJECT_FIELDS
    assert stacking._EXECUTION_FIELDS is roles.EXECUTION_FIELDS
    assert collect.NOT_RESULTS is roles.NOT_RESULT_FIELDS
    assert protocol._NODE_IRRELEVANT is roles.NODE_IRRELEVANT_FIELDS
    # the lists agree with each other where they describe the same thing
    assert set(roles.DATA_FIELDS) <= set(roles.DATA_OBJECT_FIELDS)
    assert "dataset_args" in runner.DATA_KEYS  # the reproduce runner's data key lacked it: two datasets' options shared one
    assert set(roles.SPLIT_FIELDS) <= set(roles.DATA_FIELDS)
    assert not set(roles.RESUMABLE_FIELDS) & set(roles.DATA_FIELDS)


def test_the_derived_lists_keep_what_the_hand_lists_held():
    """The lists as they were kept by hand before, and what changed deliberately."""
    old = {
        "DATA_FIELDS": {"dataset", "dataset_args", "partition", "alpha", "classes_per_client", "gamma", "min_size",
                        "partition_args", "num_clients", "seed", "augment", "input_norm"},
        "NOT_RESULT_FIELDS": {"seed", "out", "threads", "device", "log", "log_args", "checkpoint_every", "data_dir", "download",
                              "eval_batch_size", "max_parallel_clients", "executor", "channels_last",
                              "train_compile",  # added since: an execution field like channels_last (issue 49)
                              "stack_memory_gib"},  # and the stacked model's memory budget (issue 48)
        "SPLIT_FIELDS": {"partition", "alpha", "classes_per_client", "gamma", "min_size", "partition_args", "num_clients", "seed"},
        "PARTITION_FIELDS": {"alpha", "classes_per_client", "gamma", "min_size"},
        "RECORDED_FIELDS": {"lr_restarts"},
    }
    for name, fields in old.items():
        assert set(getattr(roles, name)) == fields, name
    fixed = {  # list: (old hand list, what the roles add)
        "DATA_OBJECT_FIELDS": ({"dataset", "data_dir", "partition", "alpha", "classes_per_client", "gamma", "min_size",
                                "partition_args", "num_clients", "seed", "augment", "input_norm", "dtype", "device"},
                               {"dataset_args", "download"}),
        "RESUMABLE_FIELDS": ({"rounds", "eval_every", "eval_last_rounds", "eval_batch_size", "checkpoint_every", "threads", "out",
                              "device", "log", "log_args", "diagnostics"}, {"eval_compile", "eval_autocast", "personalized_test"}),
        "CACHE_IGNORED_FIELDS": ({"out", "data_dir", "download", "threads", "device", "checkpoint_every", "eval_batch_size",
                                  "rounds", "eval_every", "eval_last_rounds"}, {"log", "log_args"}),
        "EXECUTION_FIELDS": ({"seed", "out", "threads", "checkpoint_every", "eval_batch_size"}, {"log", "log_args"}),
        "NODE_IRRELEVANT_FIELDS": ({"out", "checkpoint_every", "eval_every", "rounds"}, {"eval_last_rounds", "log", "log_args"}),
    }
    for name, (before, added) in fixed.items():
        assert set(getattr(roles, name)) == before | added, name


def test_config_roles_imports_nothing_of_fednorm():
    """The lowest layers (fednorm.data) import it, so it must stay a leaf."""
    tree = ast.parse(Path(roles.__file__).read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in imports)


# --- item 7: an exploded loss, client weighting, fedprox, an earlier run in out ------------------
def test_a_finite_but_exploded_training_loss_is_warned_and_recorded(tmp_path):
    """``lr=50`` completed with a train loss of 1e5..1e11 and no word: no NaN, so no divergence."""
    with pytest.warns(RuntimeWarning, match=r"training loss is .* at round \d+ .*blown up.*--lr 5\b"):
        result = api.run(data=_data(), lr=50, out=str(tmp_path / "run"), **{**_QUICK, "rounds": 3})
    assert result.summary["status"] == "completed"
    exploded = result.summary["train_loss_exploded"]
    assert exploded["train_loss"] > 1e3
    assert [h["train_loss"] for h in result.history if h["round"] == exploded["round"]] == [exploded["train_loss"]]
    saved = yaml.safe_load((tmp_path / "run" / "summary.json").read_text())
    assert saved["train_loss_exploded"] == exploded


def test_a_healthy_run_is_not_warned_about_its_loss(recwarn):
    result = api.run(data=_data(), write=False, **_QUICK)
    assert "train_loss_exploded" not in result.summary
    assert not [w for w in recwarn if "blown up" in str(w.message)]


def test_mean_client_accuracy_counts_each_client_once_and_the_summary_says_so():
    g = torch.Generator().manual_seed(1)
    clients = [(torch.randn(24, 1, 8, 8, generator=g), torch.arange(24) % 3,
                torch.randn(n, 1, 8, 8, generator=g), torch.arange(n) % 3) for n in (1, 30, 30)]
    result = api.run(data=FederatedData.from_tensors(clients), method="fedbn", write=False, **_QUICK)
    accs = result.history[-1]["client_accuracies"]
    assert result.summary["final_mean_client_accuracy"] == pytest.approx(sum(accs) / 3)  # the 1-sample client weighs 1/3
    assert "unweighted" in result.summary["client_weighting"] and "FedBN" in result.summary["client_weighting"]


@pytest.mark.parametrize("name, option", [("fedprox", "client_opt"), ("scaffold", "client_opt"), ("fedadam", "server_opt")])
def test_an_optimizer_given_as_method_points_to_its_option(name, option):
    with pytest.raises(ConfigError, match=rf"'{name}' is a .* optimizer.*method='fedavg', {option}='{name}'"):
        api.run(method=name, write=False, **_QUICK)


def test_rerunning_into_the_same_out_is_refused_as_the_cli_does_unless_overwrite(tmp_path):
    out = tmp_path / "run"
    first = api.run(data=_data(), out=str(out), **_QUICK)
    (out / "report").mkdir()
    (out / "report" / "report.md").write_text("the first run's report")
    metrics = (out / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError) as err:
        api.run(data=_data(), out=str(out), lr=0.1, **_QUICK)
    message = str(err.value)
    assert "already holds a completed run of 1 rounds" in message
    assert f"fednorm.run(resume={str(out)!r})" in message and "overwrite=True" in message and "\n" not in message
    assert (out / "metrics.jsonl").read_text() == metrics and (out / "report" / "report.md").exists()  # nothing touched
    again = api.run(data=_data(), out=str(out), lr=0.1, overwrite=True, **_QUICK)
    assert again.config.lr == 0.1 and first.config.lr != 0.1
    assert not (out / "report").exists()  # the earlier run's report is gone with it
    assert yaml.safe_load((out / "config.yaml").read_text())["lr"] == 0.1
