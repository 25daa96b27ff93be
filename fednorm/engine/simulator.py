"""The in-process federated simulator: the round loop that every method plugs into.

A round: sample clients (seeded per round), run their local training through an executor,
let the method aggregate, account communication, evaluate every ``eval_every`` rounds.
Server rounds start at 1, as in Flower. The evaluation phase and the run's summary are in
:mod:`fednorm.engine.round_evaluation`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import nn

from ..config import ExperimentConfig
from ..data.federated import FederatedData, crop_fill_values, federated_data_from_config
from ..data.transforms import CropFlip
from ..data.validation import hold_out_validation
from ..diagnostics import Diagnostics
from ..errors import ConfigError, DivergenceError, RoundFailedError
from ..methods import Method
from ..methods.base import ClientContext, ClientUpdates
from ..models import get_model
from ..nn.comm import CommTraffic
from ..nn.nf import default_agc_clip, head_parameter_names
from ..nn.stacked import NotStackableError
from ..optim.compose import build_method
from ..privacy import ClientLevelDP, require_opacus
from ..robust import get_aggregator, get_attack
from .bank import ClientStateBank
from .cost import prefers_sequential
from .evaluation import evaluate
from .round_evaluation import evaluate_global_model, evaluate_simulation, simulation_summary
from .validation import EVALUATION_QUERIES, VALIDATION_QUERY
from .executor import SequentialExecutor
from .vectorized import VectorizedExecutor
from .local import LocalSpec
from .rng import derive_seed, numpy_rng
from .stack_memory import stack_budget

__all__ = ["Simulation", "check_names", "tensor_bytes"]


def tensor_bytes(state: dict[str, torch.Tensor], keys: list[str] | None = None) -> int:
    keys = list(state) if keys is None else keys
    return sum(state[k].numel() * state[k].element_size() for k in keys)


def check_names(config: ExperimentConfig) -> None:
    """Fail fast, before loading any data, on unknown registry names."""
    from ..data.datasets import DATASETS
    from ..data.partition import PARTITIONS
    from ..methods import METHODS
    from ..models import MODELS
    from ..nn.norms import NORMS
    from ..optim import CLIENT_OPTIMIZERS, SERVER_OPTIMIZERS

    for registry, value, field_name in (
        (DATASETS, config.dataset, "dataset"),
        (PARTITIONS, config.partition, "partition"),
        (MODELS, config.model, "model"),
        (NORMS, config.norm, "norm"),
        (METHODS, config.method, "method"),
        (CLIENT_OPTIMIZERS, config.client_opt, "client_opt"),
        (SERVER_OPTIMIZERS, config.server_opt, "server_opt"),
    ):
        try:
            registry.get_builder(value)
        except ValueError as exc:
            raise ConfigError(f"{field_name}: {_optimizer_hint(value, field_name) or exc}") from None


def _finite_rows(stacked: dict[str, torch.Tensor]) -> dict[str, list[bool]]:
    """Of each floating tensor ``[K, ...]`` of ``stacked``: whether each row ``k`` is all finite,
    read from the device once for all tensors and rows (a read per row and tensor would make the
    host wait for the device that many times).

    A row is finite exactly when its largest and smallest entries are: both reductions propagate
    NaN, +inf is the largest and -inf the smallest. Two reductions read the tensor without writing
    a mask of its size (``isfinite(x).all()`` does), which is ~10x faster on a CPU for a large model
    (the check runs every round on every client's state)."""
    by_device: dict[torch.device, list[str]] = {}
    for key, value in stacked.items():
        if value.is_floating_point():
            by_device.setdefault(value.device, []).append(key)
    out: dict[str, list[bool]] = {}
    for keys in by_device.values():
        rows = []
        for k in keys:
            value = stacked[k].detach()
            if value.dim() > 1 and value.numel() > 0:
                flat = value.flatten(1)
                rows.append(torch.isfinite(flat.amax(dim=1)) & torch.isfinite(flat.amin(dim=1)))
            elif value.dim() > 1:  # an empty row is vacuously finite
                rows.append(torch.ones(value.shape[0], dtype=torch.bool, device=value.device))
            else:
                rows.append(torch.isfinite(value))
        flags = torch.stack(rows).tolist()
        out.update(zip(keys, flags))
    return {key: out[key] for key in stacked if key in out}  # in the order of ``stacked``


def _optimizer_hint(value: str, field_name: str) -> str | None:
    """For a method name that is a client or server optimizer (FedProx, SCAFFOLD, FedAdam...),
    where it goes instead: optimizers compose with a method rather than replace it."""
    from ..optim import CLIENT_OPTIMIZERS, SERVER_OPTIMIZERS

    if field_name != "method" or value == "none":
        return None
    for registry, option in ((CLIENT_OPTIMIZERS, "client_opt"), (SERVER_OPTIMIZERS, "server_opt")):
        if value in registry:
            kind = "a client optimizer" if option == "client_opt" else "a server optimizer"
            return (f"'{value}' is {kind}, composed with a method: use method='fedavg', {option}='{value}' "
                    f"(--method fedavg --{option.replace('_', '-')} {value}), or with fedbn, hbn, ... as the method")
    return None


def _round_failure(server_round: int, answered: int, sampled: int, min_clients: int, events: list[dict[str, Any]],
                   faults: dict[int, str]) -> Exception:
    """One line on a round too few clients answered: the causes counted by kind with one example
    each (a list of every client runs to pages with many clients). When every client's update
    was NaN/Inf by itself (no injected fault) the training diverged: a :class:`DivergenceError`."""
    if events and all(e["kind"] == "non_finite_update" and faults.get(e["client"]) != "nan" for e in events):
        e = events[0]
        return DivergenceError(f"round {server_round}: the updates of {len(events)} of {sampled} sampled clients are "
                               f"NaN/Inf (client {e['client']}: {e['detail']})")
    kinds: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        kinds.setdefault(e["kind"], []).append(e)
    causes = "; ".join(f"{len(es)} {kind} (e.g. client {es[0]['client']}: {es[0]['detail']})" for kind, es in kinds.items())
    return RoundFailedError(f"round {server_round}: only {answered} of {sampled} sampled clients answered, fewer than "
                            f"min_clients={min_clients} ({causes or 'no client was sampled'})")


@dataclass
class RoundRecord:
    server_round: int
    client_ids: list[int]
    train_loss: float
    lr: float
    seconds: float
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class RoundPlan:
    """A round before training: its clients, learning rate and simulated faults."""

    server_round: int
    clients: list[int]
    lr: float
    faults: dict[int, str]
    start: float

    @property
    def training(self) -> list[int]:
        """The clients that start training (simulated crashes do not)."""
        return [c for c in self.clients if self.faults.get(c) != "crash"]


class Simulation:
    """One federated experiment, run in this process.

    Args:
        config: the experiment.
        data: a prepared :class:`FederatedData` (default: built from the config).

    Example:
        >>> sim = Simulation(ExperimentConfig(rounds=5))
        >>> for record in sim.rounds():
        ...     print(record.server_round, record.metrics.get("test_accuracy"))
    """

    is_main = True  # the process that aggregates and writes (a distributed runtime's rank 0)

    def __init__(self, config: ExperimentConfig, data: FederatedData | None = None) -> None:
        check_names(config)
        self.config = config
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        self.device = torch.device(config.device)
        self.dtype = torch.float64 if config.dtype == "float64" else torch.float32
        if data is None:
            data = federated_data_from_config(config)
        elif data.num_clients != config.num_clients:
            raise ConfigError(f"num_clients={config.num_clients} but the data has {data.num_clients} clients")
        # validation_fraction: each client's validation split leaves its training samples here, so every
        # executor, method query and runtime (a Flower node builds its Simulation too) trains without it
        self.data = hold_out_validation(data.to(self.device, self.dtype), config.validation_fraction, config.seed)
        if self.data.client_sizes().sum() == 0:
            raise ConfigError("every client is empty; check the partition settings")

        torch.manual_seed(derive_seed(config.seed, "model-init"))
        info = self.data.info
        try:
            self.model: nn.Module = get_model(
                config.model,
                num_classes=info.num_classes,
                in_channels=info.in_channels,
                input_size=info.image_size,
                norm=config.norm,
                norm_args=config.norm_args,
                **config.model_args,
            )
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(
                f"model '{config.model}' with norm '{config.norm}' rejected its options "
                f"(model_args={config.model_args}, norm_args={config.norm_args}): {exc}"
            ) from None
        self.model.to(device=self.device, dtype=self.dtype)
        self.method: Method = build_method(config)  # the method, composed with client_opt / server_opt
        self.method.seed = config.seed
        augmentation = CropFlip(info.crop_padding, crop_fill_values(config, self.data)) if self.data.augment else None
        self.method.train_augmentation = augmentation
        self.method.setup(self.model)
        for module in self.model.modules():
            needed = getattr(module, "requires_method", None)
            if needed is not None and self.method.name != needed:
                raise ConfigError(
                    f"norm '{config.norm}' ({type(module).__name__}) only works under method '{needed}', which "
                    f"supplies its statistics; got method '{config.method}'"
                )
        # Byzantine robustness (FBN issue): the server's aggregation rule and the attack, if any.
        # The rule belongs to the aggregating method (the wrapped one under client/server optimizers).
        rule = get_aggregator(config.aggregator, f=config.num_byzantine, nnm=config.nnm)
        aggregating = getattr(self.method, "inner", self.method)
        aggregating.aggregator = rule if config.robust_targets in ("updates", "both") else None
        aggregating.stats_aggregator = rule if config.robust_targets in ("stats", "both") else None
        self.attack = get_attack(config.attack, config.num_byzantine, config.attack_targets, config.attack_args, first_id=config.num_clients)
        self.global_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.bank = ClientStateBank(self.device)
        agc_clip = default_agc_clip(config.norm, config.agc_clip)
        self.spec = LocalSpec(
            batch_size=config.batch_size,
            epochs=config.local_epochs,
            steps=config.local_steps,
            drop_last=config.drop_last,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
            max_grad_norm=config.max_grad_norm,
            agc_clip=agc_clip,
            agc_skip=head_parameter_names(self.model) if agc_clip else frozenset(),
            dsgd=config.dsgd,
            augment=self.data.augment,
            crop_padding=info.crop_padding,
            crop_fill=augmentation.fill if augmentation else None,
            channels_last=config.channels_last and any(isinstance(m, nn.Conv2d) for m in self.model.modules()),
        )
        self.method.channels_last = self.spec.channels_last
        self._check_batches_of_one()
        self.executor_note = ""
        self.executor = self._make_executor()
        self._eval_forward: Any = None
        self.eval_compile_seconds: float | None = None
        self.top_class_share: float | None = None  # of the global model's last evaluation (a stuck start reads 1.0)
        self.server_round = 0
        self.uplink_bytes = 0
        self.downlink_bytes = 0  # every client's download counted (a broadcast once per client)
        self.downlink_bytes_broadcast = 0  # each broadcast counted once (FedTAN paper's Tables 3-5)
        self.comm_rounds = 0
        self._last_traffic = CommTraffic()  # exchanges inside the round's training (FedTAN), counted there
        self.samples_trained = 0
        self.wall_seconds = 0.0
        self.eval_seconds = 0.0  # the part of wall_seconds spent evaluating (with the method's evaluation state)
        self.history: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        # the code that trained this run, one entry per start or resume (fednorm.code_version.code_record)
        self.code: list[dict[str, Any]] = []
        self._pending_events: list[dict[str, Any]] = []
        self.dropped: dict[str, int] = {}
        self._last_samples_seen = 0
        self.diagnostics = Diagnostics.from_config(config)  # issue 22: per-round normalization diagnostics
        if self.diagnostics is not None and type(self).query_clients is not Simulation.query_clients:
            raise ConfigError("diagnostics run in the in-process simulator only: they read every client's data and "
                              "local state, which this runtime keeps elsewhere")
        self.privacy = ClientLevelDP.from_config(config)  # issue 22: client-level differential privacy
        if self.privacy is not None:
            self.privacy.check_method(self.method)
            if type(self).query_clients is not Simulation.query_clients:
                raise ConfigError("dp_clip/dp_noise run in the in-process simulator only: this runtime answers the "
                                  "methods' statistics queries elsewhere, without the privacy mechanism")
            if config.dp_noise > 0:
                require_opacus()

    def _check_batches_of_one(self) -> None:
        """One line before round 1, not PyTorch's "Expected more than 1 value per channel" mid-run:
        BatchNorm1d normalises each feature over the batch, which one sample cannot give (a trailing
        batch of one is already dropped by the batch plan; a client of one sample is left)."""
        if not any(isinstance(m, nn.BatchNorm1d) for m in self.model.modules()):
            return
        lone = [c for c, ix in enumerate(self.data.client_train) if len(ix) == 1]
        if lone:
            raise ConfigError(f"client {lone[0]} holds one training sample{f' ({len(lone)} clients do)' if len(lone) > 1 else ''}, "
                              "which the model's BatchNorm1d cannot normalise (it needs two values per feature): give every "
                              "client at least two samples (fednorm's partitions: --min-size 2)")

    def _make_executor(self) -> SequentialExecutor | VectorizedExecutor:
        cfg = self.config
        args = (self.model, self.method, self.data, self.bank, self.spec, cfg.seed)
        lockstep = self.method.requires_lockstep
        if cfg.client_deadline is not None and cfg.executor != "sequential":
            # A deadline times each client's local training; stacked clients train together.
            why = "client_deadline times each client's local training, which the vectorized executor runs together"
            if lockstep:
                raise ConfigError(f"client_deadline does not work with method '{cfg.method}', whose clients train in lockstep ({why})")
            if cfg.executor == "vectorized":
                raise ConfigError(f"client_deadline needs executor 'sequential' or 'auto': {why}")
            self.executor_note = f"sequential because {why}"
            return SequentialExecutor(*args)
        one_by_one = None  # why a CPU would rather run these clients one by one
        if cfg.executor == "auto":
            example = self.data.train_x[:1].to(device=self.device, dtype=self.dtype)
            one_by_one = prefers_sequential(self.model, example, cfg.batch_size, self.device)
            if one_by_one is not None and not lockstep:
                self.executor_note = f"sequential because {one_by_one}"
                return SequentialExecutor(*args)
        if cfg.executor == "sequential":
            if lockstep:
                raise ConfigError(
                    f"method '{cfg.method}' runs all clients of a round in lockstep, which needs executor "
                    "'vectorized' (or 'auto'), not 'sequential'"
                )
            return SequentialExecutor(*args)
        try:
            executor = VectorizedExecutor(*args, max_clients=cfg.max_parallel_clients,
                                          memory_budget=stack_budget(cfg.stack_memory_gib, self.device))
            executor.compile_step = cfg.train_compile
            if lockstep and one_by_one is not None:
                # The synchronised steps need the stacked model; the rest need not.
                executor.sequential_after_sync = True
                self.executor_note = f"synchronised steps stacked, the other local steps client by client because {one_by_one}"
            return executor
        except NotStackableError as exc:
            if lockstep:
                raise ConfigError(
                    f"method '{cfg.method}' runs all clients of a round in lockstep in a stacked model, "
                    f"which this model does not allow: {exc}"
                ) from None
            if cfg.executor == "vectorized":
                raise ConfigError(f"executor 'vectorized' is not possible here: {exc}") from None
            self.executor_note = f"sequential because {exc}"
            return SequentialExecutor(*args)

    # -- one round --------------------------------------------------------------------------
    def all_clients(self) -> list[int]:
        """Every client of the federation, in order."""
        return list(range(self.config.num_clients))

    def sample_clients(self, server_round: int) -> list[int]:
        """The round's clients: all, or a seeded sample without replacement (sorted)."""
        k, m = self.config.num_clients, self.config.sampled_per_round
        if m >= k:
            return list(range(k))
        rng = numpy_rng(self.config.seed, "client-sampling", server_round)
        return sorted(int(c) for c in rng.choice(k, size=m, replace=False))

    def _fault_plan(self, server_round: int, clients: list[int]) -> dict[int, str]:
        """Simulated faults of this round (seeded): client -> "crash" | "nan" | "straggler"."""
        cfg = self.config
        if not (cfg.client_failure_rate or cfg.client_nan_rate or cfg.straggler_rate):
            return {}
        rng = numpy_rng(cfg.seed, "faults", server_round)
        plan: dict[int, str] = {}
        for cid in clients:  # three draws per client, so one rate does not shift the others
            crash, nan, late = rng.random(3)
            if crash < cfg.client_failure_rate:
                plan[cid] = "crash"
            elif nan < cfg.client_nan_rate:
                plan[cid] = "nan"
            elif late < cfg.straggler_rate:
                plan[cid] = "straggler"
        return plan

    def step(self) -> RoundRecord:
        """Run the next round (train, drop failed clients, aggregate, evaluate when due).

        Raises:
            RoundFailedError: fewer than ``min_clients`` clients answered.
            DivergenceError: a training loss or an aggregated parameter became NaN/Inf.
        """
        plan = self.begin_round()
        updates = self.train_clients(plan.server_round, plan.training, plan.lr) if plan.training else None
        record = self.server_update(plan, updates)
        self.finish_round(record)
        return record

    # The seams of a round. A remote runtime (fednorm.distributed, fednorm.flower) replaces
    # ``train_clients`` and ``query_clients``, and runs the rest unchanged.
    def begin_round(self) -> "RoundPlan":
        """Sample the round's clients, let the method configure the round, draw simulated faults."""
        server_round = self.server_round + 1
        if server_round == 1:  # the method's exchange before round 1, if it has one
            start = self.method.initial_state(self)
            if start is not None:
                self.global_state = start
        clients = self.sample_clients(server_round)
        self.method.configure_round(server_round, clients)
        faults = self._fault_plan(server_round, clients)
        return RoundPlan(server_round, clients, self.config.lr_at(server_round), faults, time.perf_counter())

    def train_clients(self, server_round: int, client_ids: list[int], lr: float) -> ClientUpdates:
        """Local training of ``client_ids`` from the global state: here, in this process."""
        updates = self.executor.run_round(server_round, client_ids, self.global_state, lr)
        self._last_samples_seen = self.executor.last_samples_seen
        self._last_traffic = getattr(self.executor, "last_traffic", CommTraffic())  # only lockstep steps exchange
        return updates

    def note_training(self, samples: int, traffic: CommTraffic | None = None) -> None:
        """What the round's clients trained when another executor trained them (a run set's
        stacked executor): the samples and the exchanges the round's accounting counts."""
        self._last_samples_seen = samples
        self._last_traffic = traffic if traffic is not None else CommTraffic()

    def query_clients(
        self, client_ids: list[int], query: str, state: dict[str, torch.Tensor] | None = None
    ) -> dict[int, dict[str, torch.Tensor]]:
        """Run the named client-side computation on each client's model (the global ``state``
        plus the client's own tensors): ``"evaluate"`` (its test split), ``"validate"`` (its
        validation split, ``validation_fraction``) or a method query such
        as HBN's ``"statistics"`` (see :meth:`Method.client_query`). Here, in this process:
        in stacked chunks where the executor and the method can (:meth:`Method.stacked_client_query`)."""
        stacked = getattr(self.executor, "query_clients", None)
        if query not in EVALUATION_QUERIES and stacked is not None and client_ids:
            answers = stacked(self.server_round, client_ids, query, self.global_state if state is None else state)
            if answers is not None:
                return self._private_answers(query, answers)
        return self._private_answers(query, {cid: self.client_query(cid, query, state) for cid in client_ids})

    def _private_answers(self, query: str, answers: dict[int, dict[str, torch.Tensor]]) -> dict[int, dict[str, torch.Tensor]]:
        """A method query's answers as the clients send them under DP (fednorm.privacy)."""
        if self.privacy is None or query in EVALUATION_QUERIES:
            return answers
        return self.privacy.privatize_answers(answers, self.server_round, query)

    def client_query(self, client_id: int, query: str, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """One client's answer to :meth:`query_clients` (runs where the client lives)."""
        data = self.data
        model = self.client_model(client_id, state)
        if query in EVALUATION_QUERIES:  # its test split, or its validation split (held out of its training data)
            x, y, ix = ((data.test_x, data.test_y, data.client_test[client_id]) if query != VALIDATION_QUERY
                        else (data.train_x, data.train_y, data.client_val[client_id]))
            res = evaluate(model, x[ix], y[ix], batch_size=self.config.eval_batch_size, channels_last=self.spec.channels_last)
            return {
                "correct": torch.tensor(float(res.correct.sum()), dtype=torch.float64),
                "num": torch.tensor(float(res.num_samples), dtype=torch.float64),
                "loss_sum": torch.tensor(res.loss * res.num_samples if res.num_samples else 0.0, dtype=torch.float64),
            }
        idx = data.client_train[client_id]
        own = dict(self.bank.get(client_id) or {})  # a copy: a query reads the client's state, never writes it
        return self.method.client_query(
            query, ClientContext(self.server_round, client_id, model, data.train_x.index_select(0, idx),
                                 data.train_y.index_select(0, idx), self.global_state, own)
        )

    def server_update(self, plan: "RoundPlan", updates: ClientUpdates | None) -> RoundRecord:
        """Screen the updates (faults, deadlines, non-finite rows), attack, aggregate, account."""
        cfg = self.config
        server_round, clients, faults = plan.server_round, plan.clients, plan.faults
        events: list[dict[str, Any]] = []
        for cid in clients:
            if faults.get(cid) == "crash":
                events.append({"round": server_round, "client": cid, "kind": "crash", "detail": "simulated failure before training"})
        keep: list[int] = []
        if updates is not None:
            for cid, reason in updates.failures.items():
                events.append({"round": server_round, "client": cid, "kind": "error", "detail": reason})
            for row, cid in enumerate(updates.client_ids):
                if faults.get(cid) == "nan":
                    for value in updates.states.values():
                        if value.is_floating_point():
                            value[row].fill_(float("nan"))
            finite = _finite_rows(updates.states)
            for row, cid in enumerate(updates.client_ids):
                kind = faults.get(cid)
                if kind == "straggler":
                    events.append({"round": server_round, "client": cid, "kind": "straggler", "detail": "update arrived after the round closed"})
                    continue
                if cfg.client_deadline is not None and updates.seconds is not None and float(updates.seconds[row]) > cfg.client_deadline:
                    events.append({"round": server_round, "client": cid, "kind": "deadline",
                                   "detail": f"trained {float(updates.seconds[row]):.2f}s > client_deadline={cfg.client_deadline}s"})
                    continue
                bad = [k for k, ok in finite.items() if not ok[row]]
                if bad:
                    events.append({"round": server_round, "client": cid, "kind": "non_finite_update",
                                   "detail": f"{len(bad)} tensors hold NaN/Inf, e.g. '{bad[0]}'"})
                    continue
                keep.append(row)
        self.events.extend(events)
        for e in events:
            self.dropped[e["kind"]] = self.dropped.get(e["kind"], 0) + 1
        if len(keep) < cfg.min_clients:
            raise _round_failure(server_round, len(keep), len(clients), cfg.min_clients, events, faults)
        assert updates is not None
        if len(keep) < len(updates):
            updates = updates.subset(keep)
        updates.check({k: self.global_state[k] for k in self.method.shared_keys})
        if self.privacy is not None:  # clipped, bounded and noised as the clients upload them (fednorm.privacy)
            updates = self.privacy(updates, self.global_state, self.method, server_round)
        if self.attack is not None:  # Byzantine rows, computed from the honest ones (fednorm.robust.attacks)
            updates = self.attack(updates, self.global_state, self.method)
        new_shared = self.method.aggregate(server_round, self.global_state, updates)
        finite = _finite_rows({k: v.unsqueeze(0) for k, v in new_shared.items()})
        for key, value in new_shared.items():
            if key in finite and not finite[key][0]:
                raise DivergenceError(
                    f"aggregated parameter '{key}' is not finite after round {server_round} "
                    f"(method {self.method.name}); lower the learning rate or clip gradients (max_grad_norm)"
                )
            self.global_state[key] = value
        answered = len(updates) + sum(1 for e in events if e["kind"] in ("straggler", "deadline", "non_finite_update"))
        shared_bytes = tensor_bytes(self.global_state, self.method.shared_keys)
        down_bytes = tensor_bytes(self.global_state, self.method.broadcast_keys)  # + the recomputed (dropped) statistics
        extra_up, extra_down = self.method.extra_bytes_per_client(self.model)
        traffic, self._last_traffic = self._last_traffic, CommTraffic()
        self.downlink_bytes += (down_bytes + extra_down) * len(clients) + traffic.downlink_bytes
        self.downlink_bytes_broadcast += down_bytes + extra_down + traffic.broadcast_bytes
        self.uplink_bytes += (
            shared_bytes + extra_up + sum(t[0].numel() * t.element_size() for t in updates.extras.values())
        ) * answered + traffic.uplink_bytes
        self.comm_rounds += self.method.comm_rounds_per_round(self.model) + traffic.exchanges
        self.samples_trained += self._last_samples_seen
        w = updates.num_examples
        valid = torch.isfinite(updates.train_loss) & (w > 0)
        train_loss = float((updates.train_loss[valid] * w[valid]).sum() / w[valid].sum()) if valid.any() else math.nan
        self.wall_seconds += time.perf_counter() - plan.start
        self.server_round = server_round
        self._pending_events.extend(events)
        return RoundRecord(server_round, clients, train_loss, plan.lr, time.perf_counter() - plan.start)

    def finish_round(self, record: RoundRecord) -> None:
        """Evaluate when due (every ``eval_every`` rounds, each of the last ``eval_last_rounds``
        rounds, and after the last) and log the metrics."""
        cfg = self.config
        r = record.server_round
        if r % cfg.eval_every == 0 or r == cfg.rounds or r > cfg.rounds - cfg.eval_last_rounds:
            record.metrics = self.evaluate()
            record.metrics.update(
                {
                    "round": record.server_round,
                    "train_loss": record.train_loss,
                    "lr": record.lr,
                    "wall_seconds": self.wall_seconds,
                    "uplink_bytes": self.uplink_bytes,
                    "downlink_bytes": self.downlink_bytes,
                    "downlink_bytes_broadcast": self.downlink_bytes_broadcast,
                    "comm_rounds": self.comm_rounds,
                    "samples_trained": self.samples_trained,
                    "dropped_clients": dict(self.dropped),
                    "events": self._pending_events,
                }
            )
            self._pending_events = []
            if self.privacy is not None:
                record.metrics.update(self.privacy.metrics(cfg.dp_delta))
            if self.diagnostics is not None and self.diagnostics.due(r, cfg.rounds):
                record.metrics.update(self.diagnostics(self, record.seconds))
            self.history.append(record.metrics)

    # -- checkpointing ----------------------------------------------------------------------
    def collect_bank(self) -> dict[int, dict[str, torch.Tensor]]:
        """Every client's local state, wherever the clients live (checkpoints, reports). Here the
        bank itself; remote runtimes fetch it from the ranks or nodes that host the clients."""
        return self.bank.state_dict()

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue bit for bit (see ``fednorm.engine.checkpoint``).

        Random streams are derived from (seed, round, client), so no generator state is saved.
        """
        return {
            "server_round": self.server_round,
            "config": self.config.model_dump(mode="json"),
            "global_state": {k: v.detach().cpu().clone() for k, v in self.global_state.items()},
            "bank": {cid: {k: v.cpu() for k, v in s.items()} for cid, s in sorted(self.collect_bank().items())},
            "method_state": self.method.state_dict(),
            "privacy": self.privacy.state_dict() if self.privacy is not None else {},
            "counters": {
                "uplink_bytes": self.uplink_bytes,
                "downlink_bytes": self.downlink_bytes,
                "downlink_bytes_broadcast": self.downlink_bytes_broadcast,
                "comm_rounds": self.comm_rounds,
                "samples_trained": self.samples_trained,
                "wall_seconds": self.wall_seconds,
                "eval_seconds": self.eval_seconds,
                "dropped": dict(self.dropped),
            },
            "history": self.history,
            "events": self.events,
            "pending_events": self._pending_events,
            "code": self.code,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint written by :meth:`state_dict`."""
        self.server_round = int(state["server_round"])
        self.global_state = {k: v.to(self.device) for k, v in state["global_state"].items()}
        self.bank.load_state_dict(state["bank"])
        self.method.load_state_dict(state.get("method_state", {}))
        if self.privacy is not None:
            self.privacy.load_state_dict(state.get("privacy", {}))
        c = state["counters"]
        self.uplink_bytes, self.downlink_bytes = int(c["uplink_bytes"]), int(c["downlink_bytes"])
        self.downlink_bytes_broadcast = int(c.get("downlink_bytes_broadcast", 0))
        self.comm_rounds, self.samples_trained = int(c["comm_rounds"]), int(c["samples_trained"])
        self.wall_seconds = float(c["wall_seconds"])
        self.eval_seconds = float(c.get("eval_seconds", 0.0))
        self.dropped = dict(c.get("dropped", {}))
        self.history = list(state["history"])
        self.events = list(state.get("events", []))
        self._pending_events = list(state.get("pending_events", []))
        self.code = list(state.get("code", []))  # a checkpoint written before runs recorded their code: []

    def agree_to_stop(self, requested: bool) -> bool:
        """Whether to stop after this round (a signal arrived); a distributed runtime decides
        the same on every rank."""
        return requested

    def rounds(self) -> Iterator[RoundRecord]:
        """Run the remaining rounds, yielding each round's record."""
        while self.server_round < self.config.rounds:
            yield self.step()

    # -- evaluation -------------------------------------------------------------------------
    def client_model(self, client_id: int, state: dict[str, torch.Tensor] | None = None) -> nn.Module:
        """The working model loaded with ``client_id``'s model (global + its local tensors)."""
        self.model.load_state_dict(self.executor.client_state(client_id, self.global_state if state is None else state))
        return self.model

    def global_model(self, state: dict[str, torch.Tensor] | None = None) -> nn.Module:
        """The working model loaded with the global state."""
        self.model.load_state_dict(self.global_state if state is None else state)
        return self.model

    def evaluate(self, state: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
        """Global test accuracy/loss and each client's accuracy on its own test split.

        For personalized methods (local tensors, e.g. FedBN) there is no single global model:
        each client is evaluated with its own model on its split, and ``test_accuracy`` is the
        sample-weighted accuracy over all clients' splits.
        """
        return evaluate_simulation(self, state)

    def _compiled_forward(self) -> Any:
        """``torch.compile`` of the working model for evaluation (``eval_compile``), built once."""
        if not self.config.eval_compile:
            return None
        if self._eval_forward is None:
            self._eval_forward = torch.compile(self.model, dynamic=False)
        return self._eval_forward

    def evaluate_global(self, state: dict[str, torch.Tensor]) -> tuple[float, float, list[float | None]]:
        """Accuracy and loss of the global model on the whole test set, and each client's accuracy
        on its own test split (slices of the same predictions)."""
        return evaluate_global_model(self, state)

    # -- summary ----------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """The run's figures for ``summary.json``: final, best and last-10 accuracy, traffic,
        timing, the executor and the method's own report."""
        return simulation_summary(self)
