"""Experiment configuration: one validated, fully resolved description of a federated run.

A run is reproducible from its ``config.yaml`` alone, so every setting lives here with its
default, and unknown keys are rejected (a typo must never silently fall back to a default).
The CLI builds its ``fednorm run`` options from these fields, so a YAML key and a command-line
option always mean the same thing (``local_epochs`` <-> ``--local-epochs``).
"""

from __future__ import annotations

import math
import os
import sys
import typing
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from . import yaml_io
from .config_roles import FIELD_ROLES, USER_DATA_NOT_APPLICABLE, is_user_name
from .errors import ConfigError

__all__ = ["ExperimentConfig", "load_config", "format_validation_error", "MAX_ROUNDS"]

#: The most rounds a run may ask for: far above any paper's (10,000), far below one that never reports.
MAX_ROUNDS = 1_000_000


class ExperimentConfig(BaseModel):
    """Everything that defines one federated experiment.

    Field groups: data and partition, model and norm, method, local training, evaluation, run.
    Method-, norm- and model-specific options go in ``method_args``, ``norm_args`` and
    ``model_args``; they are validated by the builder they are passed to. Each field's role
    (data, model, training, evaluation, runtime, ...) is stated once in
    ``fednorm.config_roles.FIELD_ROLES`` (:meth:`role`); the lists of fields that decide
    a run's data, may change on resume, or do not change results are derived from it.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # --- data and partition -----------------------------------------------------------------
    dataset: str = Field("digits", description="dataset name (`fednorm list datasets`)")
    data_dir: str | None = Field(None, description="folder holding the dataset files (default: $FEDNORM_DATA or ~/.cache/fednorm)")
    download: bool = Field(False, description="download the dataset when it is missing (needs a network)")
    dataset_args: dict[str, Any] = Field(
        default_factory=dict,
        description="options of the dataset, e.g. {domains: {a: path/a, b: b.npz}, image_size: 28, channels: 3} for 'domains' (docs/data.md)",
    )
    partition: str = Field("dirichlet", description="how training data is split over clients (`fednorm list partitions`)")
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration (dirichlet, dirichlet_client, quantity); smaller is more skewed")
    classes_per_client: int = Field(2, ge=1, description="classes per client (classes partition)")
    gamma: float = Field(0.5, ge=0, le=1, description="fraction of iid data (gamma partition, FBN paper)")
    min_size: int = Field(1, ge=0, description="minimum training samples per client (dirichlet, quantity)")
    partition_args: dict[str, Any] = Field(default_factory=dict, description="extra partition options, e.g. {mode: ring} for classes")
    num_clients: int = Field(10, ge=1, description="number of clients")
    clients_per_round: int | None = Field(None, ge=1, description="clients sampled per round (default: all)")
    augment: bool | None = Field(None, description="train-time random crop + flip (default: the dataset's default)")
    crop_fill: Literal["zero", "black"] = Field(
        "zero", description="what the random crop pads with: 'zero' (in standardised inputs, the normalisation's mean "
        "colour) or 'black' (a black pixel, as torchvision's RandomCrop before Normalize: the HBN and FedTAN released code)")
    input_norm: Literal["dataset", "none"] | dict[str, list[float]] = Field(
        "dataset",
        description="input standardisation: 'dataset' (its own per-channel mean/std), 'none' (pixels in [0, 1]), or "
        "{mean: [...], std: [...]} per channel (e.g. HBN's code: std 0.2023, 0.1994, 0.2010)",
    )

    # --- model and normalization ------------------------------------------------------------
    model: str = Field("simple_cnn", description="model architecture (`fednorm list models`)")
    model_args: dict[str, Any] = Field(default_factory=dict, description="extra keyword arguments for the model builder")
    norm: str = Field("bn", description="normalization layer (`fednorm list norms`)")
    norm_args: dict[str, Any] = Field(default_factory=dict, description="extra keyword arguments for the norm layer, e.g. num_groups")

    # --- method -----------------------------------------------------------------------------
    method: str = Field("fedavg", description="federated method (`fednorm list methods`)")
    method_args: dict[str, Any] = Field(default_factory=dict, description="method options, e.g. {weighting: uniform}")
    buffers: Literal["global", "local", "drop"] | None = Field(
        None, description="BatchNorm statistics under aggregation: global (averaged), local (kept per client), drop (not "
        "sent, recomputed by the method); default: the method's (`fednorm list methods --verbose`)")
    affine: Literal["global", "local", "drop"] | None = Field(
        None, description="BatchNorm affine weight/bias under aggregation: global, local or drop; default: the method's")

    # --- FL optimizers (fednorm.optim: client side FedProx/SCAFFOLD/MOON, server side FedAvgM/FedAdam/FedYogi) ---
    client_opt: str = Field("none", description="client optimizer or objective composed with the method (`fednorm list client_opts`): none, fedprox, scaffold, moon, fedlc, fedrs, feddecorr")
    client_opt_args: dict[str, Any] = Field(default_factory=dict, description="client optimizer options, e.g. {mu: 0.01}")
    server_opt: str = Field("none", description="server optimizer on the learnable parameters: none, fedavgm, fedadam, fedyogi")
    server_opt_args: dict[str, Any] = Field(default_factory=dict, description="server optimizer options, e.g. {server_lr: 0.01}")

    @field_validator("client_opt", "server_opt")
    @classmethod
    def _lowercase_optimizer_names(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("must not be empty (use 'none')")
        return value.lower().replace("-", "_")
    # --- end FL optimizers ---

    # --- local training ---------------------------------------------------------------------
    rounds: int = Field(30, ge=1, description="communication rounds")
    local_epochs: int = Field(1, ge=1, description="local epochs per round (ignored when local_steps is set)")
    local_steps: int | None = Field(None, ge=1, description="local SGD steps per round (overrides local_epochs)")
    batch_size: int = Field(32, ge=1, description="local mini-batch size")
    drop_last: bool = Field(False, description="drop each epoch's last incomplete batch")
    lr: float = Field(0.05, gt=0, description="client learning rate")
    momentum: float = Field(0.0, ge=0, lt=1, description="client SGD momentum (reset every round)")
    weight_decay: float = Field(0.0, ge=0, description="client L2 weight decay")
    max_grad_norm: float | None = Field(None, gt=0, description="clip the local gradient norm (HBN's code: 10)")
    agc_clip: float | None = Field(
        None, ge=0, description="adaptive gradient clipping lambda (NF-Nets/FedWon): each unit's gradient norm at most "
        "lambda*max(||W_unit||, 1e-3), the head excluded; default 0.01 under norm fedwon/hbn_sws, off otherwise; 0: off",
    )
    lr_decay: float = Field(1.0, gt=0, le=1, description="per-round multiplicative lr decay (HBN: 0.998)")
    lr_milestones: list[int] = Field(default_factory=list, description="rounds at which lr is multiplied by lr_gamma")
    lr_gamma: float = Field(0.1, gt=0, description="step-decay factor applied at each milestone")
    lr_values: list[float] = Field(
        default_factory=list,
        description="the learning rate from each milestone on, instead of lr_gamma's factors (one value per milestone; "
        "FBN's schedule 0.1, 0.05, 0.033: lr 0.1, lr_milestones [1001, 2001], lr_values [0.05, 0.033])",
    )
    lr_restarts: list[dict[str, int | float]] = Field(
        default_factory=list,
        description="learning-rate restarts a diverged run was resumed with (`fednorm run --resume RUN --lr X`): "
        "[{round: N, lr: X}] trains the rounds after N with base lr X (decay and milestones apply to it)",
    )
    dsgd: bool = Field(
        False,
        description="DSGD mode (FBN paper): one mini-batch gradient per client per round at the global weights, "
        "averaged by the server; momentum is then the clients' persistent momentum",
    )

    # --- Byzantine robustness (FBN issue: robust aggregators and attacks; docs/fbn.md) -------
    aggregator: str = Field(
        "mean", description="server rule for model updates and BN statistics: mean, median, trimmed_mean"
    )
    nnm: bool = Field(False, description="nearest-neighbour mixing (K - num_byzantine neighbours) before the aggregator")
    robust_targets: Literal["stats", "updates", "both"] = Field(
        "both", description="what the aggregator combines robustly: BN statistics, model updates, or both (others: mean)"
    )
    attack: str = Field("none", description="Byzantine attack: none, sign_flip, foe, alie")
    num_byzantine: int = Field(
        0, ge=0, description="f: Byzantine clients added to each round when attack is set (they hold no data), "
        "and the bound trimmed_mean/nnm assume",
    )
    attack_args: dict[str, Any] = Field(default_factory=dict, description="attack options, e.g. {tau: 3} (foe), {variance: true}")
    attack_targets: Literal["stats", "updates", "both"] = Field(
        "stats", description="what Byzantine clients corrupt: BN statistics (running means), model updates, or both"
    )

    @field_validator("aggregator", "attack")
    @classmethod
    def _robust_names(cls, value: str, info: ValidationInfo) -> str:
        from .robust import AGGREGATORS, ATTACKS

        value = value.strip().lower().replace("-", "_")
        if info.field_name == "attack" and value == "none":
            return value
        registry = AGGREGATORS if info.field_name == "aggregator" else ATTACKS
        try:
            registry.get_builder(value)
        except ValueError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("input_norm", mode="before")
    @classmethod
    def _parse_input_norm(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().startswith("{"):  # from the command line: a YAML mapping
            try:
                return yaml_io.safe_load(value)
            except yaml.YAMLError as exc:
                raise ValueError(f"input_norm is not a YAML mapping: {exc}") from None
        return value

    @model_validator(mode="after")
    def _check_input_norm(self) -> "ExperimentConfig":
        if isinstance(self.input_norm, dict):
            if set(self.input_norm) != {"mean", "std"}:
                raise ValueError(f"input_norm takes exactly the keys mean and std, got {sorted(self.input_norm)}")
            mean, std = self.input_norm["mean"], self.input_norm["std"]
            if len(mean) != len(std) or not mean:
                raise ValueError(f"input_norm mean and std need one value per channel, got {len(mean)} and {len(std)}")
            if any(not math.isfinite(v) for v in mean) or any(not (math.isfinite(v) and v > 0) for v in std):
                raise ValueError(f"input_norm std must be positive and every value finite, got {self.input_norm}")
        return self

    def _check_lr_restarts(self) -> None:
        last = -1.0
        for r in self.lr_restarts:
            if set(r) != {"round", "lr"} or not r["round"] >= 0 or not (math.isfinite(r["lr"]) and r["lr"] > 0):
                raise ValueError(f"lr_restarts entries are {{round: N >= 0, lr: X > 0}}, got {r}")
            if r["round"] <= last:
                raise ValueError(f"lr_restarts must be in increasing rounds, got {[x['round'] for x in self.lr_restarts]}")
            last = r["round"]

    @model_validator(mode="after")
    def _check_lr_values(self) -> "ExperimentConfig":
        self._check_lr_restarts()
        if self.lr_values and len(self.lr_values) != len(self.lr_milestones):
            raise ValueError(
                f"lr_values gives the learning rate from each milestone on: {len(self.lr_milestones)} milestone(s) "
                f"need as many values, got {len(self.lr_values)}"
            )
        if any(not math.isfinite(v) or v <= 0 for v in self.lr_values):
            raise ValueError(f"lr_values must be positive and finite, got {self.lr_values}")
        return self

    @model_validator(mode="after")
    def _default_eval_every(self) -> "ExperimentConfig":
        # Resolved once, so a run directory's config.yaml states the cadence that ran. On the HBN
        # paper's CIFAR-10 setting one evaluation (test set + HBN's re-sync) costs about half a
        # round: every round would be a third of a 500-round run, every 10th round 5%.
        if self.eval_every is None:
            self.eval_every = max(1, self.rounds // 50)
        return self

    @model_validator(mode="after")
    def _check_byzantine(self) -> "ExperimentConfig":
        if self.attack != "none" and self.num_byzantine < 1:
            raise ValueError(f"attack '{self.attack}' needs num_byzantine >= 1")
        if self.num_byzantine and self.num_byzantine >= self.sampled_per_round:
            raise ValueError(
                f"num_byzantine={self.num_byzantine} must be below the honest clients per round "
                f"({self.sampled_per_round}): robust aggregation needs f < n/2 of the n = honest + f clients"
            )
        return self

    # --- evaluation -------------------------------------------------------------------------
    eval_every: int | None = Field(
        None, ge=1,
        description="evaluate every N rounds (the last round is always evaluated); default: every round for runs "
        "of up to 50 rounds, else rounds // 50 (about 50 evaluations, so evaluation stays a small part of a long run)",
    )
    eval_last_rounds: int = Field(
        0, ge=0,
        description="also evaluate each of the last N rounds (the HBN code reports the mean of the last 10 "
        "evaluations, one per round; with eval_last_rounds 10 a run evaluating every 10th round has them too)",
    )
    eval_batch_size: int = Field(1024, ge=1, description="batch size for evaluation")
    eval_compile: bool = Field(
        False,
        description="evaluate the global model through torch.compile (the last batch padded, so one compilation): "
        "about 1.8x faster evaluations of Simple-CNN on CPU after a first one that compiles (about 20 s)",
    )
    train_compile: bool = Field(
        False,
        description="train the stacked clients' model through torch.compile (vectorized and stacked executors): equal "
        "to eager training to float rounding, not bit for bit; a first round that compiles; for GPUs, where it also "
        "fuses the step's small kernels",
    )
    personalized_test: Literal["own", "whole"] = Field(
        "own",
        description="what test_accuracy scores for a personalized method (FedBN, SiloBN): 'own', each client's model on "
        "its own test split, pooled; 'whole', each client's model on the whole test set, averaged over the clients "
        "(FedTAN's Table 1). mean_client_accuracy is the own splits' mean either way; no effect on a method with one global model",
    )
    validation_fraction: float = Field(
        0.0, ge=0, lt=1,
        description="hold out this share of each client's training samples (seeded per client; they never train) and "
        "score them at every evaluation: metrics.jsonl's val_accuracy (the clients' unweighted mean) and "
        "client_val_accuracies, summary.json's best_val_round and the test accuracies there (FedBN's Office/DomainNet "
        "model selection; docs/fedbn.md); 0: no validation split",
    )
    eval_autocast: Literal["none", "bfloat16"] = Field(
        "none", description="evaluate under torch.autocast in bfloat16 (for GPUs and CPUs with bf16 units; slower on others)"
    )

    diagnostics: str | None = Field(
        None,
        description="per-round normalization diagnostics written to metrics.jsonl ('every:N': at evaluated rounds that are "
        "multiples of N and the last; docs/diagnostics.md): statistics mismatch, gradient deviation, recalibrated accuracy",
    )

    @field_validator("diagnostics")
    @classmethod
    def _diagnostics_schedule(cls, value: str | None) -> str | None:
        if value is None or value.strip().lower() in ("", "off", "none"):
            return None
        from .diagnostics.runner import parse_schedule
        from .errors import ConfigError as _ConfigError

        try:
            return f"every:{parse_schedule(value)}"
        except _ConfigError as exc:
            raise ValueError(str(exc)) from None

    # --- differential privacy (issue 22, fednorm.privacy; docs/privacy.md) ---
    dp_noise: float = Field(0.0, ge=0, description="client-level DP: noise multiplier sigma of the Gaussian noise each client adds to its clipped update and bounded statistics (needs dp_clip and opacus)")
    dp_clip: float | None = Field(None, gt=0, description="client-level DP: L2 bound C of each client's update (DP-FedAvg clipping); turns DP on")
    dp_stats_bound: float = Field(1.0, gt=0, description="client-level DP: activation bound B of the uploaded statistics (means clamped to [-B, B], variances to [0, B^2])")
    dp_delta: float = Field(1e-5, gt=0, lt=1, description="client-level DP: the delta at which the privacy spent (epsilon) is reported")

    @model_validator(mode="after")
    def _check_dp(self) -> "ExperimentConfig":
        if self.dp_noise > 0 and self.dp_clip is None:
            raise ValueError("dp_noise needs dp_clip (the noise is sigma times the clipping bound C)")
        return self
    # --- end differential privacy ---

    # --- reliability ------------------------------------------------------------------------
    checkpoint_every: int = Field(10, ge=0, description="write a checkpoint every N rounds (0: only at the end and on SIGINT/SIGTERM)")
    min_clients: int = Field(1, ge=1, description="a round fails unless at least this many sampled clients answer")
    client_failure_rate: float = Field(0.0, ge=0, le=1, description="simulated fault: probability that a sampled client crashes before training")
    client_nan_rate: float = Field(0.0, ge=0, le=1, description="simulated fault: probability that a client uploads a NaN update")
    straggler_rate: float = Field(0.0, ge=0, le=1, description="probability that a client's update arrives too late and is dropped (HBN's stragglers)")
    client_deadline: float | None = Field(None, gt=0, description="drop a client whose local training takes longer (seconds, wall clock)")

    # --- run --------------------------------------------------------------------------------
    seed: int = Field(0, ge=0, description="seed of every random choice (partition, init, sampling, batches)")
    out: str | None = Field(None, description="run directory (default: runs/<method>-<norm>-<dataset>-<time>)")
    log: list[str] = Field(default_factory=list, description="loggers that follow the run: tensorboard, mlflow, wandb (comma-separated; fednorm/tracking)")
    log_args: dict[str, Any] = Field(default_factory=dict, description="options per logger, e.g. {mlflow: {tracking_uri: http://host:5000}}")
    executor: Literal["auto", "sequential", "vectorized"] = Field(
        "auto",
        description="how a round's clients run: one after another, or together as a client dimension "
        "(auto: vectorized when the model and method support it)",
    )
    max_parallel_clients: int = Field(64, ge=1, description="most clients trained together by the vectorized executor")
    stack_memory_gib: float | None = Field(
        None, gt=0,
        description="memory budget in GiB of the vectorized executor's stacked model: at most budget / (4 × the model's "
        "bytes) clients train together (parameters, gradients, momentum, a copy); a lockstep method (FedTAN) needs a "
        "round's clients to fit (default: 2 GiB on a CPU, on CUDA half the device's free memory when the run starts; "
        "fednorm/engine/stack_memory.py)",
    )
    device: str = Field("cpu", description="torch device")
    channels_last: bool = Field(
        True, description="feed convolutional models channels-last batches (faster pooling and convolution on CPU)"
    )
    dtype: Literal["float32", "float64"] = Field("float32", description="parameter dtype (float64 for exactness checks)")
    threads: int | None = Field(
        None, ge=1,
        description="torch intra-op threads (default: `fednorm run`/`compare` use the free cores, the usable cores "
        "minus the 1-minute load average, at least 1; `fednorm launch` cores/nproc per process; fednorm.run the "
        "process's setting; an explicit OMP_NUM_THREADS is kept)",
    )

    @field_validator("dataset", "partition", "model", "norm", "method")
    @classmethod
    def _lowercase_names(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("must not be empty")
        head, sep, rest = value.partition(":")
        if sep and head.lower() in ("hf", "flwr"):  # a path or a class name follows: kept as written
            return f"{head.lower()}:{rest}"
        return value.lower().replace("-", "_")

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        # Only the spelling: whether this machine has the device is checked when a run starts
        # (fednorm.api.check_device), so a config written on a GPU machine still loads elsewhere.
        import torch

        value = value.strip()
        try:
            torch.device(value)
        except (RuntimeError, ValueError):
            raise ValueError(f"unknown device '{value}'; expected a torch device such as cpu, cuda, cuda:1 or mps") from None
        return value

    @field_validator("lr", "alpha", "gamma", "lr_decay", "lr_gamma", "momentum", "weight_decay")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number, got {value}")
        return value

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # YAML reads yes/no/on/off/true/false as booleans; `rounds: yes` must not become 1.
        if isinstance(value, bool):
            ann = cls.model_fields[info.field_name].annotation
            types_ = set(typing.get_args(ann)) or {ann}
            if bool not in types_ and types_ & {int, float}:
                raise ValueError(f"expected a number, got the boolean {value}")
        return value

    @field_validator("rounds")
    @classmethod
    def _rounds_range(cls, value: int) -> int:
        # 1e20 rounds trained for ever without an evaluation or a progress line (the first comes
        # after rounds // 50 of them); the longest table of the papers has 10,000 (issue 50)
        if value > MAX_ROUNDS:
            raise ValueError(f"must be at most {MAX_ROUNDS:,}")
        return value

    @field_validator("out", "data_dir", mode="before")
    @classmethod
    def _path_as_text(cls, value: Any) -> Any:
        # fednorm.run(out=Path(...)) was refused with "Input should be a valid string"; a path is
        # recorded as its text, so config.yaml reads the same whichever form was given
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @field_validator("out")
    @classmethod
    def _out_not_empty(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():  # `--out ""` wrote to runs/<time> (issue 50)
            raise ValueError("is empty: pass a directory, or leave it out for runs/<method>-<norm>-<dataset>-<time>")
        return value

    @field_validator("seed")
    @classmethod
    def _seed_range(cls, value: int) -> int:
        if value >= 2**63:
            raise ValueError(f"must be below 2**63, got {value}")
        return value

    @field_validator("log", mode="before")
    @classmethod
    def _log_names(cls, value: Any) -> Any:
        from .tracking import LOGGERS  # names only: no logger package is imported

        if isinstance(value, str):  # "tensorboard,mlflow"
            value = value.split(",")
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = [v.strip().lower() for v in value if v.strip()]
            bad = [v for v in value if v not in LOGGERS]
            if bad:
                raise ValueError(f"unknown logger '{bad[0]}'; choose from {', '.join(LOGGERS)}")
        return value

    @field_validator("lr_milestones")
    @classmethod
    def _sorted_milestones(cls, value: list[int]) -> list[int]:
        if any(m < 1 for m in value):
            raise ValueError(f"rounds start at 1, got {value}")
        return sorted(value)

    @model_validator(mode="after")
    def _check_deadline(self) -> "ExperimentConfig":
        if self.client_deadline is not None and self.executor == "vectorized":
            raise ValueError(
                "client_deadline times each client's local training, which the vectorized executor runs together: "
                "use executor 'sequential' or 'auto' (auto then runs sequentially)"
            )
        return self

    @model_validator(mode="after")
    def _check_consistency(self) -> "ExperimentConfig":
        if self.clients_per_round is not None and self.clients_per_round > self.num_clients:
            raise ValueError(
                f"clients_per_round={self.clients_per_round} exceeds num_clients={self.num_clients}; "
                f"set clients_per_round to at most {self.num_clients} or raise num_clients"
            )
        return self

    @property
    def sampled_per_round(self) -> int:
        return self.num_clients if self.clients_per_round is None else self.clients_per_round

    def lr_at(self, server_round: int) -> float:
        """Learning rate of round ``server_round`` (1-based): exponential decay times step decay
        (``lr_gamma`` per milestone passed, or the milestone's own ``lr_values`` entry)."""
        steps = sum(1 for m in self.lr_milestones if server_round >= m)
        lr = self.lr
        for restart in self.lr_restarts:  # a diverged run resumed with a smaller lr (fednorm run --resume --lr)
            if server_round > restart["round"]:
                lr = restart["lr"]
        base = self.lr_values[steps - 1] if self.lr_values and steps else lr * self.lr_gamma**steps
        return base * self.lr_decay ** (server_round - 1)

    @staticmethod
    def role(field: str) -> str:
        """The role of ``field`` (``fednorm.config_roles.ROLES``), e.g. ``"partition"`` for ``alpha``."""
        return FIELD_ROLES[field]

    def recorded(self) -> dict[str, Any]:
        """The fields as a run records them (``config.yaml``, the loggers' parameters): all of
        them, but for data given from Python (``dataset: user:NAME``) without the fields that did
        not apply to it (``fednorm.config_roles.USER_DATA_NOT_APPLICABLE``: ``alpha``,
        ``partition_args``, ``data_dir``, ``input_norm``, ...), so the record says only what ran."""
        data = self.model_dump(mode="json")
        if is_user_name(self.dataset):
            for name in USER_DATA_NOT_APPLICABLE:
                data.pop(name, None)
        return data

    def to_yaml(self) -> str:
        text = yaml.safe_dump(self.recorded(), sort_keys=False)
        if is_user_name(self.dataset):
            text = (f"# dataset {self.dataset} was given from Python: {', '.join(USER_DATA_NOT_APPLICABLE)} did not apply "
                    "to it and are left out\n" + text)
        return text


# Fields that hold a registry name, and the `fednorm list` argument that shows the valid ones.
_NAME_FIELDS = {"dataset": "datasets", "partition": "partitions", "model": "models", "norm": "norms", "method": "methods"}
_GOT_MAX = 60  # characters of a bad value quoted back; a module's or a config's repr runs to pages


def _describe(value: Any) -> str:
    """A short rendering of a bad value: its repr when it is a short plain value, else its type."""
    if isinstance(value, (str, int, float, bool, type(None), list, tuple)):
        text = repr(value)
        return text if len(text) <= _GOT_MAX else text[: _GOT_MAX - 3] + "..."
    return f"a {type(value).__name__} object"


def _name_field_message(field: str, value: Any) -> str:
    """What to pass for a registry-name field given something that is not a string."""
    plural = _NAME_FIELDS[field]
    default = ExperimentConfig.model_fields[field].default
    msg = f"expected the name of a registered {field}, e.g. '{default}' (`fednorm list {plural}`)"
    torch = sys.modules.get("torch")
    if field == "model" and torch is not None and isinstance(value, torch.nn.Module):
        msg += "; pass your own nn.Module beside the config, as fednorm.run(model=net) or fednorm.compare(model=net)"
    return msg


def format_validation_error(err: ValidationError, source: str | None = None) -> str:
    """One line per bad field: ``field: message (got value)``; a single bad field is one line
    (``invalid configuration: alpha: ...``).

    The bad value is quoted only when short: a cross-field check's input is the whole config and a
    wrongly passed object may be an ``nn.Module``, whose reprs would bury the message.
    """
    where = f" in {source}" if source else ""
    lines = [f"invalid configuration{where}:"]
    errors = err.errors()
    for e in errors:
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (see `fednorm run --help` for valid fields)"
        elif e["type"] == "string_type" and len(e["loc"]) == 1 and loc in _NAME_FIELDS:
            msg = _name_field_message(loc, got)
        # Cross-field checks (no loc) name their fields in the message, and their input is the config.
        quote = bool(loc) and e["type"] != "extra_forbidden" and not isinstance(got, dict) and "got " not in msg
        got_txt = f" (got {_describe(got)})" if quote else ""
        lines.append(f"  {loc}: {msg}{got_txt}" if loc else f"  {msg}")
    if len(errors) == 1:
        return f"{lines[0]} {lines[1].strip()}"
    return "\n".join(lines)


def load_config(
    path: str | Path | None = None, overrides: Mapping[str, Any] | None = None
) -> ExperimentConfig:
    """Build a config from an optional YAML file and keyword overrides (overrides win).

    Raises:
        ConfigError: the file is missing or not a mapping, or a field is unknown or invalid.
    """
    data: dict[str, Any] = {}
    source = None
    if path is not None:
        source = str(path)
        p = Path(path)
        if p.is_dir():
            hint = f" (a run directory's config is {p / 'config.yaml'})" if (p / "config.yaml").is_file() else ""
            raise ConfigError(f"config file {p} is a directory, not a YAML file{hint}")
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            with open(p, encoding="utf-8") as stream:  # a file stream, so YAML errors name the file
                loaded = yaml_io.safe_load(stream)
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {p} is not UTF-8 text: {exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {p} is not valid YAML: {' '.join(str(exc).split())}") from None
        except RecursionError:
            raise ConfigError(f"config file {p} is nested too deeply to be a fednorm config") from None
        except OSError as exc:
            raise ConfigError(f"config file {p} cannot be read: {exc.strerror or exc}") from None
        if loaded is None:
            raise ConfigError(f"config file {p} is empty; it should map settings to values, e.g. 'rounds: 10'")
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p} must hold a mapping of fields, got {type(loaded).__name__}")
        data.update(loaded)
    if overrides:
        data.update({k: v for k, v in overrides.items() if v is not None})
    bad_keys = [k for k in data if not isinstance(k, str)]
    if bad_keys:
        where = f" in {source}" if source else ""
        raise ConfigError(f"invalid configuration{where}: field names must be strings, got {bad_keys!r}")
    try:
        return ExperimentConfig(**data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None
    except RecursionError:
        raise ConfigError("invalid configuration: values are nested too deeply") from None
