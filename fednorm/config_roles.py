"""The role of each :class:`~fednorm.config.ExperimentConfig` field, stated once.

Many parts of fednorm need a set of fields: the ones that decide a run's client data (to reuse
it between runs), the ones that may change when a run is resumed, the ones that do not change a
run's results (a report's variants), the ones a Flower node's cache ignores... Kept by hand in
each place, those lists drifted apart (the reproduce runner's data key lacked ``dataset_args``,
so two configs differing only in their dataset options shared one dataset). Here every field has
exactly one role (``tests/test_run_records.py`` fails for a field without one), and every such
list is a union of roles, built below and imported where it is used.

This module imports nothing from fednorm, so the lowest layers (:mod:`fednorm.data`) can use it.
"""

from __future__ import annotations

__all__ = ["ROLES", "FIELD_ROLES", "USER_PREFIX", "fields_with_role", "DATA_FIELDS", "SPLIT_FIELDS", "PARTITION_FIELDS",
           "DATA_OBJECT_FIELDS", "USER_DATA_FIELDS", "USER_DATA_DESCRIBED", "USER_DATA_NOT_APPLICABLE", "is_user_name", "RESUMABLE_FIELDS", "CACHE_IGNORED_FIELDS", "EXECUTION_FIELDS", "STACK_SHARED_FIELDS",
           "NOT_RESULT_FIELDS", "NODE_IRRELEVANT_FIELDS", "RECORDED_FIELDS"]

#: What each role means. Grouped as the issue that introduced them asked: data (data,
#: preprocessing, partition, data_source), model, training (local_training, training, dtype, seed, schedule),
#: evaluation only (evaluation), runtime only (output, runtime, device, execution), and record; holdout
#: (the validation split held out of the clients' training data) came later and is in no list below.
ROLES: dict[str, str] = {
    "data": "which samples: the dataset and its options",
    "preprocessing": "how the samples are prepared: input standardisation and augmentation",
    "partition": "which client holds which sample",
    "data_source": "where the data is read from, not what it is",
    "seed": "the seed of every random choice: partition, initialisation, client sampling, batches",
    "model": "the network and its normalization layers",
    "local_training": "the method and what a client's local steps compute: runs trained stacked together share it",
    "training": "what the rest of the federated training computes (server, sampling, schedule of lr, faults, privacy)",
    "dtype": "the dtype of the parameters and of the data tensors",
    "schedule": "how many rounds run and which of them are evaluated",
    "evaluation": "how an evaluation is measured; never changes training",
    "output": "where and how often the run is written and logged; never changes a number",
    "runtime": "compute resources (threads, evaluation batch size); never changes a result",
    "device": "the torch device",
    "execution": "how a round's clients are batched and laid out: changes floating-point rounding, not results",
    "record": "written by the run about itself (a diverged run's lr restarts), not set as an option",
    "holdout": "which of each client's samples are held out of training to select a model by validation accuracy: "
               "changes what trains, applied to the built data (not part of its recipe)",
}

#: Each config field's role (a key of :data:`ROLES`), in the config's order.
FIELD_ROLES: dict[str, str] = {
    "dataset": "data", "data_dir": "data_source", "download": "data_source", "dataset_args": "data",
    "partition": "partition", "alpha": "partition", "classes_per_client": "partition", "gamma": "partition",
    "min_size": "partition", "partition_args": "partition", "num_clients": "partition",
    "clients_per_round": "training", "augment": "preprocessing", "crop_fill": "local_training", "input_norm": "preprocessing",
    "model": "model", "model_args": "model", "norm": "model", "norm_args": "model",
    "method": "local_training", "method_args": "local_training", "buffers": "local_training", "affine": "local_training",
    "client_opt": "local_training", "client_opt_args": "local_training", "server_opt": "training", "server_opt_args": "training",
    "rounds": "schedule", "local_epochs": "local_training", "local_steps": "local_training", "batch_size": "local_training",
    "drop_last": "local_training", "lr": "training", "momentum": "local_training", "weight_decay": "local_training",
    "max_grad_norm": "local_training", "agc_clip": "local_training", "lr_decay": "training", "lr_milestones": "training",
    "lr_gamma": "training", "lr_values": "training", "lr_restarts": "record", "dsgd": "local_training",
    "aggregator": "training", "nnm": "training", "robust_targets": "training", "attack": "training",
    "num_byzantine": "training", "attack_args": "training", "attack_targets": "training",
    "eval_every": "schedule", "eval_last_rounds": "schedule", "eval_batch_size": "runtime",
    "eval_compile": "evaluation", "personalized_test": "evaluation", "validation_fraction": "holdout", "eval_autocast": "evaluation", "diagnostics": "evaluation",
    "dp_noise": "training", "dp_clip": "training", "dp_stats_bound": "training", "dp_delta": "training",
    "checkpoint_every": "output", "min_clients": "training", "client_failure_rate": "training",
    "client_nan_rate": "training", "straggler_rate": "training", "client_deadline": "training",
    "seed": "seed", "out": "output", "log": "output", "log_args": "output", "executor": "execution",
    "max_parallel_clients": "execution", "stack_memory_gib": "execution", "device": "device", "channels_last": "execution", "train_compile": "execution", "dtype": "dtype",
    "threads": "runtime",
}

#: ``dataset: user:NAME`` (and ``partition``, ``model``) marks data or a model given from Python.
USER_PREFIX = "user"


def is_user_name(name: str) -> bool:
    """Whether a ``dataset``/``partition``/``model`` value names something given from Python."""
    return name.split(":", 1)[0].strip().lower() == USER_PREFIX and ":" in name


def fields_with_role(*roles: str) -> tuple[str, ...]:
    """The fields whose role is one of ``roles``, in the config's order."""
    unknown = [r for r in roles if r not in ROLES]
    if unknown:
        raise ValueError(f"unknown field role(s) {unknown}; roles are {', '.join(ROLES)}")
    return tuple(name for name, role in FIELD_ROLES.items() if role in roles)


#: What :func:`~fednorm.data.federated.federated_data_from_config` builds a run's client data
#: from (its ``recipe``): ``data_dir`` says only where the files are.
DATA_FIELDS = fields_with_role("data", "preprocessing", "partition", "seed")
#: What a repartition may change: only which client holds which sample.
SPLIT_FIELDS = fields_with_role("partition", "seed")
#: The partition's parameters that are config fields of their own (never keys of
#: ``partition_args``): the partition fields but the partitioner's name, its free-form options and
#: the client count every partitioner takes.
PARTITION_FIELDS = tuple(f for f in fields_with_role("partition") if f not in ("partition", "partition_args", "num_clients"))
#: What a built ``FederatedData`` object depends on, to reuse it between runs: its recipe, where it
#: was read from, and the dtype and device its tensors were moved to.
DATA_OBJECT_FIELDS = fields_with_role("data", "preprocessing", "partition", "seed", "data_source", "dtype", "device")
#: The fields that data given from Python (``fednorm.run(data=...)``) replaces: set to anything but
#: their default beside it they would be recorded without having applied, so they are refused.
USER_DATA_FIELDS = fields_with_role("data", "preprocessing", "partition", "data_source")
#: What data given from Python records about itself (:func:`fednorm.api.record_data`): its name,
#: description and fingerprint, its client count and its augmentation flag.
USER_DATA_DESCRIBED = ("dataset", "dataset_args", "partition", "num_clients", "augment")
#: The rest of :data:`USER_DATA_FIELDS`: they did not apply to a run of such data, so its
#: ``config.yaml`` leaves them out (read back, they take their defaults, which never applied either).
USER_DATA_NOT_APPLICABLE = tuple(f for f in USER_DATA_FIELDS if f not in USER_DATA_DESCRIBED)
#: What may change when a run is resumed: every other field must equal the checkpoint's.
RESUMABLE_FIELDS = fields_with_role("schedule", "evaluation", "output", "runtime", "device")
#: What may differ between a reproduce run's cached directory and the plan (a longer plan extends
#: a completed run; where the data is read from and how the run executes do not matter).
CACHE_IGNORED_FIELDS = fields_with_role("schedule", "output", "runtime", "device", "data_source")
#: How a run is executed, not what it computes: may differ between runs trained stacked together
#: (the device may not: a stack runs on one).
EXECUTION_FIELDS = fields_with_role("seed", "output", "runtime")
#: What every run trained stacked together must share (:mod:`fednorm.engine.stacked_runs`): the
#: data and how it is prepared, the model, the method and its local steps, and how they execute;
#: seed, partition, learning rate, server and schedule may differ.
STACK_SHARED_FIELDS = fields_with_role("data", "data_source", "preprocessing", "model", "local_training", "dtype", "device",
                                       "execution")
#: Settings that do not change a run's results: runs differing only in these are one variant.
NOT_RESULT_FIELDS = fields_with_role("seed", "output", "runtime", "device", "data_source", "execution")
#: What a Flower node's experiment does not depend on (its cache key leaves them out).
NODE_IRRELEVANT_FIELDS = fields_with_role("schedule", "output")
#: Fields a run writes about itself rather than options a user sets.
RECORDED_FIELDS = fields_with_role("record")
