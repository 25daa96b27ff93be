"""A Flower strategy that runs a fednorm method's server side in your own ServerApp.

:class:`MethodStrategy` is Flower's Message-API ``FedAvg`` (sampling, ``start()``, ``Result``,
metric aggregation, failure logging) with the round's tensor work replaced by the fednorm
method's own: it sends only what the method broadcasts, refuses replies that carry what the
method keeps on the client, and aggregates with the method's ``aggregate``, so the server
computes exactly what ``fednorm run`` computes for the same client updates:

- FedBN (Li et al., ICLR 2021, Algorithm 1) and SiloBN (Andreux et al., 2020): the BatchNorm
  tensors (SiloBN: its statistics) never leave the clients; the rest is averaged;
- HBN (Chen et al., ICML 2025): each round's statistics uploads are pooled exactly (Eq. 8) and
  smoothed (Eq. 11); the statistics-only exchanges of the method (the initial pass, the
  evaluation re-sync, round T+1) run as ``"query.fednorm"`` messages;
- FBN (Guerraoui et al., 2024): the clients' local copies of the running statistics are combined
  with the between-client correction (Eqs. 9-10), so the shared statistics are centralized
  BatchNorm's over the union of the clients' batches.

The clients run :class:`~fednorm.flower.method_client.MethodClient` (or, for methods that run
no code on the client, :func:`~fednorm.flower.method_client.keep_local_mod`).
"""

from __future__ import annotations

from logging import INFO
from types import SimpleNamespace
from typing import Any, Iterable

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result
from flwr.serverapp.strategy.strategy_utils import sample_nodes
from flwr.supercore import log
from torch import nn

from ..errors import ConfigError, InconsistentUpdateError, RoundFailedError
from ..engine.executor import stack_uploads
from ..methods.base import ClientUpdates, Method
from .compose import QUERY_KEY, QUERY_TYPE, UPLOAD_PREFIX, message_arrays, method_config, resolve_method
from .records import record_to_tensors, tensors_to_record
from .runtime import send_and_receive

__all__ = ["MethodStrategy"]


class MethodStrategy(FedAvg):
    """Flower's ``FedAvg`` driven by a fednorm method (FedBN, SiloBN, HBN, FBN, FedAvg, ...).

    Args:
        method: a registered method name (``"fedbn"``, ``"silobn"``, ``"hbn"``, ``"fbn"``, ...) or a
            :class:`~fednorm.methods.Method`. With a name, the nodes build the same method from
            the messages; with an instance, give every node's ``MethodClient`` the same method.
        model: your model (any ``nn.Module``; HBN needs HBN layers, e.g. ``convert_to_hybrid``, FBN
            needs FBN layers). The method reads its structure once, to split its tensors into
            shared, local (never sent by the clients) and recomputed ones (the server's, e.g. HBN's
            statistics); its values are not used: ``start`` takes the initial ones.
        method_args: the method's options with a method name, e.g. ``{"sync_pass": "layerwise"}``.
        **kwargs: Flower ``FedAvg``'s (``fraction_train``, ``min_available_nodes``, ...).

    The strategy holds the training state between rounds (HBN's smoothed statistics, FBN's shared
    statistics); the arrays it returns after each round are the state to evaluate and deploy (HBN:
    statistics re-synchronised under the new weights, and after the last round those of round
    T+1), which ``start`` passes to ``evaluate_fn`` and returns in ``Result.arrays``. For methods
    with local tensors (FedBN) these arrays hold the initial values of those tensors: each client's
    own stay on its node. Use one strategy per run.

    Returns:
        ``start`` returns Flower's ``Result``: ``arrays`` (the state to deploy, as above),
        ``train_metrics_clientapp``, ``evaluate_metrics_clientapp`` and
        ``evaluate_metrics_serverapp`` (dicts keyed by round).

    Raises:
        ConfigError: an unknown method name, a :class:`~fednorm.methods.Method` given with
            ``method_args``, or a model the method cannot serve (here); ``initial_arrays``
            without the model's tensors (in ``start``).
        ValueError: a train reply that carries a tensor the method keeps on the client (a
            handler without ``MethodClient`` or ``keep_local_mod``), with the fix.
        RuntimeError: ``start`` called a second time (one strategy per run).

    Example:
        >>> from torch import nn
        >>> from fednorm.flower import MethodStrategy
        >>> net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
        >>> strategy = MethodStrategy("fedbn", net, min_available_nodes=2, fraction_evaluate=0.0)
        >>> sorted(strategy.method.local_keys)  # FedBN's BatchNorm tensors never leave the nodes
        ['1.bias', '1.num_batches_tracked', '1.running_mean', '1.running_var', '1.weight']
        >>> # in the ServerApp's main(grid, context), with MethodClient in the ClientApp:
        >>> # result = strategy.start(grid, ArrayRecord(net.state_dict()), num_rounds=10,
        >>> #                         train_config=ConfigRecord({"lr": 0.05}))
    """

    def __init__(self, method: str | Method, model: nn.Module, *, method_args: dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.method, self._method_args = resolve_method(method, method_args)
        self.method.setup(model)
        self.global_state: dict[str, torch.Tensor] = {}
        self.server_round = 0
        self._initial_local: dict[str, torch.Tensor] = {}
        self._ready: set[int] = set()  # nodes known to hold their local state
        self._grid: Grid | None = None
        self._num_rounds: int | None = None
        self._timeout = 3600.0

    # -- Flower's Strategy -------------------------------------------------------------------
    def summary(self) -> None:
        super().summary()
        log(INFO, "\t└──> fednorm method: %s", self.method.summary())

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Any = None) -> Result:
        """Flower's ``Strategy.start``; also runs the method's exchanges before round 1 and after
        round ``num_rounds`` (HBN's initial pass and round T+1)."""
        if self._num_rounds is not None:
            raise RuntimeError("this MethodStrategy already ran: build a new one per run (it holds the method's "
                               "server state, e.g. HBN's statistics schedule)")
        self._grid, self._num_rounds, self._timeout = grid, num_rounds, float(timeout)
        return super().start(grid, initial_arrays, num_rounds=num_rounds, timeout=timeout, train_config=train_config,
                             evaluate_config=evaluate_config, evaluate_fn=evaluate_fn)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        self._grid = grid
        if not self.global_state:
            self._initialise(arrays)
        sampled = [m.metadata.dst_node_id for m in super().configure_train(server_round, arrays, config, grid)]
        self.method.configure_round(server_round, sampled)
        return self._messages(sampled, MessageType.TRAIN, self.global_state, config, keys=self.method.broadcast_keys)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid, failed = self._check_and_log_replies(list(replies), is_train=True)
        self._forget(failed)
        if not valid:
            return None, None
        valid.sort(key=lambda m: m.metadata.src_node_id)  # the sum's order, hence its rounding, does not depend on arrival
        updates = self._updates(valid)
        self.global_state = {**self.global_state, **self.method.aggregate(server_round, self.global_state, updates)}
        self._ready.update(updates.client_ids)
        self.server_round = server_round
        metrics = self.train_metrics_aggr_fn([m.content for m in valid], self.weighted_by_key)
        return tensors_to_record(self._deployed_state()), metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        sampled = [m.metadata.dst_node_id for m in super().configure_evaluate(server_round, arrays, config, grid)]
        # personalised methods: each node evaluates the broadcast tensors with its own local ones;
        # the others: one global model, which a plain evaluate handler can load as it is
        keys = self.method.broadcast_keys if self.method.personalized else None
        return self._messages(sampled, MessageType.EVALUATE, record_to_tensors(arrays), config, keys=keys)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        replies = list(replies)
        self._ready.update(m.metadata.src_node_id for m in replies if not m.has_error())
        self._forget([m for m in replies if m.has_error()])
        return super().aggregate_evaluate(server_round, replies)

    def _forget(self, failed: list[Message]) -> None:
        """Send the initial local values again to nodes that failed: a node that lost its
        ``context.state`` (a restarted SuperNode) starts over from them; one that kept it ignores them."""
        self._ready.difference_update(m.metadata.src_node_id for m in failed)

    # -- fednorm's side ----------------------------------------------------------------------
    def _initialise(self, arrays: ArrayRecord) -> None:
        """The training state from ``initial_arrays``, then the method's exchange before round 1."""
        state = record_to_tensors(arrays)
        missing = [k for k in self.method.state_keys if k not in state]
        if missing:
            raise ConfigError(f"initial_arrays lacks {missing[:3]}{'...' if len(missing) > 3 else ''}: pass "
                              "ArrayRecord(model.state_dict()) of the model given to MethodStrategy")
        self.global_state = {k: state[k] for k in self.method.state_keys}
        self._initial_local = {k: self.global_state[k] for k in self.method.local_keys}
        self.server_round = 0
        start = self.method.initial_state(self._view())  # HBN's and FBN's statistics pass under the initial weights
        if start is not None:
            self.global_state = dict(start)

    def _deployed_state(self) -> dict[str, torch.Tensor]:
        """The state to evaluate after a round: the method's (HBN's re-synced statistics) and, after
        the last round, the method's final exchange (HBN's round T+1) when it has one."""
        view = self._view()
        if self._num_rounds is not None and self.server_round >= self._num_rounds:
            final = self.method.final_state(view)
            if final is not None:
                return dict(final)
        return dict(self.method.evaluation_state(view))

    def _messages(self, nodes: list[int], message_type: str, tensors: dict[str, torch.Tensor], config: ConfigRecord,
                  keys: list[str] | None = None, extra: dict[str, Any] | None = None) -> list[Message]:
        """One message per node: ``tensors`` (``keys`` of them, default all) and ``config`` with the
        method's name; a node not yet known to hold its local state also gets their initial values."""
        cfg = ConfigRecord({**dict(config), **method_config(self.method, self._method_args), **(extra or {})})
        sent = {k: tensors[k] for k in (keys if keys is not None else tensors)}
        common = tensors_to_record(sent)
        first: ArrayRecord | None = None
        out = []
        for node in nodes:
            record = common
            if self._initial_local and node not in self._ready:
                first = first or tensors_to_record({**sent, **self._initial_local})
                record = first
            content = RecordDict({self.arrayrecord_key: record, self.configrecord_key: cfg})
            out.append(Message(content=content, message_type=message_type, dst_node_id=node))
        return out

    def _updates(self, replies: list[Message]) -> ClientUpdates:
        """The replies as the method's :class:`ClientUpdates` (one row per node)."""
        method = self.method
        ids, rows, uploads, counts, steps, losses = [], [], [], [], [], []
        for msg in replies:
            node = msg.metadata.src_node_id
            tensors = record_to_tensors(message_arrays(msg)[1])
            kept = sorted(set(tensors) & method.local_keys)
            if kept:
                raise InconsistentUpdateError(
                    f"node {node} sent {kept[:3]}{'...' if len(kept) > 3 else ''}, which method '{method.name}' keeps on "
                    "the client: reply with MethodClient's ClientRound.reply() or add keep_local_mod to the ClientApp")
            state = {k: v for k, v in tensors.items() if not k.startswith(UPLOAD_PREFIX)}
            unexpected, missing = sorted(set(state) - set(method.shared_keys)), sorted(set(method.shared_keys) - set(state))
            if unexpected or missing:
                raise InconsistentUpdateError(
                    f"node {node} sent tensors that method '{method.name}' does not share ({unexpected[:3]}) or lacks "
                    f"shared ones ({missing[:3]}): reply with MethodClient's ClientRound.reply()")
            metrics = next(iter(msg.content.metric_records.values()))
            ids.append(node)
            rows.append(state)
            uploads.append({k[len(UPLOAD_PREFIX):]: v for k, v in tensors.items() if k.startswith(UPLOAD_PREFIX)})
            counts.append(float(metrics[self.weighted_by_key]))  # type: ignore[arg-type]
            steps.append(int(metrics.get("num-steps", 0)))  # type: ignore[call-overload]
            losses.append(float(metrics.get("train-loss", 0.0)))  # type: ignore[arg-type]
        updates = ClientUpdates(
            client_ids=ids,
            states={k: torch.stack([r[k] for r in rows]) for k in method.shared_keys},
            num_examples=torch.tensor(counts, dtype=torch.float64),
            train_loss=torch.tensor(losses, dtype=torch.float64),
            num_steps=torch.tensor(steps, dtype=torch.int64),
            extras=stack_uploads(uploads, ids),
        )
        updates.check({k: self.global_state[k] for k in method.shared_keys})
        return updates

    def _view(self) -> "_GridView":
        if self._grid is None:
            raise RuntimeError("MethodStrategy has no grid yet: call start(grid, ...) or configure_train first")
        return _GridView(self, self._grid)

    def query(self, nodes: list[int], query: str, state: dict[str, torch.Tensor] | None = None) -> dict[int, dict[str, torch.Tensor]]:
        """Ask ``nodes`` the method's client query ``query`` (HBN's ``"statistics"``) on the model
        ``state`` (default: the training state) with each node's own local tensors."""
        if self._grid is None:
            raise RuntimeError("MethodStrategy has no grid yet: call start(grid, ...) first")
        tensors = self.global_state if state is None else state
        config = ConfigRecord({"server-round": self.server_round})
        messages = self._messages(list(nodes), QUERY_TYPE, tensors, config, keys=self.method.broadcast_keys,
                                  extra={QUERY_KEY: query})
        answers: dict[int, dict[str, torch.Tensor]] = {}
        for reply in send_and_receive(self._grid, messages, self._timeout):
            node = reply.metadata.src_node_id
            if reply.has_error():
                raise RoundFailedError(f"node {node} failed the method's '{query}' query: {reply.error.reason}; its "
                                       "ClientApp must answer @app.query(\"fednorm\") with MethodClient.answer()")
            answers[node] = record_to_tensors(message_arrays(reply)[1])
        silent = sorted(set(nodes) - set(answers))
        if silent:
            raise RoundFailedError(f"nodes {silent} did not answer the method's '{query}' query within {self._timeout:.0f}s")
        self._ready.update(answers)
        return answers


class _GridView:
    """fednorm's :class:`~fednorm.methods.base.ServerView` over a Flower grid: what a method's
    server hooks (``initial_state``, ``evaluation_state``, ``final_state``) may use."""

    # FBN's initial_pass="auto" asks whether the run is its DSGD: a ClientApp's own loop is not
    config = SimpleNamespace(dsgd=False)

    def __init__(self, strategy: MethodStrategy, grid: Grid) -> None:
        self._strategy = strategy
        self._grid = grid

    @property
    def global_state(self) -> dict[str, torch.Tensor]:
        return self._strategy.global_state

    @property
    def server_round(self) -> int:
        return self._strategy.server_round

    def sample_clients(self, server_round: int) -> list[int]:
        s = self._strategy
        size = max(int(len(list(self._grid.get_node_ids())) * s.fraction_train), s.min_train_nodes)
        return sorted(sample_nodes(self._grid, s.min_available_nodes, size)[0])

    def all_clients(self) -> list[int]:
        return sorted(int(n) for n in self._grid.get_node_ids())

    def query_clients(self, client_ids: list[int], query: str,
                      state: dict[str, torch.Tensor] | None = None) -> dict[int, dict[str, torch.Tensor]]:
        return self._strategy.query(client_ids, query, state)

    def collect_bank(self) -> dict[int, dict[str, torch.Tensor]]:
        return {}  # the clients' local state stays on their nodes
