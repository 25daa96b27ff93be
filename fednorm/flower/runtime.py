"""The simulator with its clients on Flower nodes: the server side of a Flower run.

:class:`FlowerSimulation` runs inside a ServerApp. It is the in-process
:class:`~fednorm.engine.simulator.Simulation` (sampling, screening, the method's ``aggregate``,
accounting, global evaluation on the server's test set) with two seams replaced:

- ``train_clients`` sends one ``"train"`` message per node with the global state and the
  method's server state; each node trains the round's clients it hosts and replies with their
  stacked updates, which are merged in sampled-client order (:func:`merge_updates`), so the
  server code sees exactly what the in-process run sees;
- ``query_clients`` sends ``"evaluate"`` (personalised evaluation) or ``"query"`` (HBN's
  statistics pass) messages and collects the answers of the hosting nodes.

Clients' local state stays on the nodes (their ``context.state``). It travels to the server only
for checkpoints and the summary (one ``"query.bank"`` exchange per checkpoint) and back to the
nodes once after a resume. A node that fails (a Flower error reply or no reply before the
timeout) makes its clients count as failed clients of the round (``min_clients`` decides);
a fednorm error on a node (divergence, bad config) is raised on the server as it would be
in-process.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import torch
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from ..config import ExperimentConfig
from ..data.federated import FederatedData
from ..engine.bank import ClientStateBank
from ..engine.remote import host_of, merge_updates, rebuild_error
from ..engine.simulator import Simulation
from ..engine.validation import EVALUATION_QUERIES
from ..errors import ConfigError, RoundFailedError
from ..methods.base import ClientUpdates
from . import protocol
from .appdir import check_round_based
from .records import bank_to_record, pack_tree, record_to_bank, record_to_updates, tensors_to_record

__all__ = ["FlowerSimulation", "wait_for_nodes", "send_and_receive", "simulation_factory"]



def wait_for_nodes(grid: Grid, num_nodes: int, timeout: float) -> list[int]:
    """The grid's node ids once ``num_nodes`` are connected (sorted); ConfigError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(int(n) for n in grid.get_node_ids())
        if len(nodes) >= num_nodes:
            return nodes
        if time.monotonic() > deadline:
            raise ConfigError(f"only {len(nodes)} of {num_nodes} SuperNodes connected within {timeout:.0f}s")
        time.sleep(0.05)


def send_and_receive(grid: Grid, messages: list[Message], timeout: float) -> list[Message]:
    """Push ``messages`` and pull their replies until all arrived or ``timeout`` passed.

    As ``Grid.send_and_receive``, but polling from 0.05 s up to 1 s instead of every 3 s (flwr
    1.41's HTTP grid), which saves seconds per exchange in a deployment.
    """
    pending = set(grid.push_messages(messages))
    deadline = time.monotonic() + timeout
    replies: list[Message] = []
    wait = 0.05
    while pending:
        got = list(grid.pull_messages(list(pending)))
        replies.extend(got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(wait)
        wait = min(1.0, wait * 1.5)
    return replies


class FlowerSimulation(Simulation):
    """A :class:`Simulation` whose clients live on the nodes of a Flower ``grid``.

    Args:
        config, data: as :class:`Simulation` (the server needs the test set for global evaluation).
        grid: the ServerApp's grid.
        nodes: the node ids to use (see :func:`wait_for_nodes`).
        timeout: seconds to wait for the replies of one exchange.
    """

    def __init__(self, config: ExperimentConfig, data: FederatedData | None = None, *, grid: Grid,
                 nodes: list[int], timeout: float = 600.0, secure: bool = False) -> None:
        super().__init__(config, data)
        check_round_based(config.method, self.method.requires_lockstep)
        self.secure = secure  # SecAgg+ of the updates and statistics (fednorm.flower.secure)
        self._secure_layout: dict[str, list[int]] = {}  # statistics prefix -> [channels, steps]
        if secure:
            from .secure import check_secure

            check_secure(self.method, config)
        self.grid = grid
        self.nodes = list(nodes)
        self.timeout = timeout
        self._push_bank: dict[int, dict[str, torch.Tensor]] | None = None  # after a resume, until
        self._push_to: set[int] = set()  # these nodes have answered a message that carried it
        self._gathered: tuple[int, dict[int, dict[str, torch.Tensor]]] | None = None
        self.exchanges = 0

    # -- messages ---------------------------------------------------------------------------
    def _content(self, clients: list[int], *, server_round: int, lr: float = 0.0, query: str = "",
                 state: dict[str, torch.Tensor] | None = None) -> RecordDict:
        tensors, skeleton = pack_tree(self.method.state_dict())
        content = RecordDict({
            "fednorm": ConfigRecord({
                "config": protocol.config_json(self.config), "server-round": server_round,
                "clients": [int(c) for c in clients], "lr": float(lr), "query": query, "method-state": skeleton,
            }),
            "global": tensors_to_record(self.global_state),
            "method": tensors_to_record(tensors),
        })
        if state is not None:  # only the tensors that differ from the global state
            content["state"] = tensors_to_record({k: v for k, v in state.items() if v is not self.global_state.get(k)})
        return content

    def _exchange(self, message_type: str, content: RecordDict, group: str) -> tuple[dict[int, RecordDict], dict[int, str]]:
        """Send ``content`` to every node; the replies by node, and the nodes that failed (reason).
        A fednorm error reported by a node is raised here."""
        restoring = content
        if self._push_bank is not None and message_type != protocol.BANK:  # after a resume
            restoring = RecordDict(dict(content.items()))
            restoring["bank"] = bank_to_record(self._push_bank)
        messages = [Message(restoring if n in self._push_to else content, dst_node_id=n, message_type=message_type,
                            group_id=group) for n in self.nodes]
        replies = send_and_receive(self.grid, messages, self.timeout)
        self.exchanges += 1
        got: dict[int, RecordDict] = {}
        failed: dict[int, str] = {}
        for reply in replies:
            node = int(reply.metadata.src_node_id)
            if reply.has_error():
                failed[node] = f"node {node}: Flower error {reply.error.code}: {reply.error.reason}"
                continue
            head = reply.content["fednorm"]
            if "error-type" in head:
                raise rebuild_error(str(head["error-type"]), str(head["error"]))
            got[node] = reply.content
        for node in self.nodes:
            if node not in got and node not in failed:
                failed[node] = f"node {node}: no reply within {self.timeout:.0f}s"
        parts = {}
        for node, content_ in got.items():
            head = content_["fednorm"]
            pid, num = int(head["partition-id"]), int(head["num-partitions"])
            if pid in parts:
                raise ConfigError(f"two SuperNodes have partition-id {pid}; give each a distinct one")
            parts[pid] = num
        if len(set(parts.values())) > 1:
            raise ConfigError(f"SuperNodes disagree on num-partitions: {sorted(set(parts.values()))}")
        if restoring is not content:
            self._push_to -= set(got)
            if not self._push_to:
                self._push_bank = None  # every node has its clients' state back
        return got, failed

    def _covered(self, content: RecordDict) -> set[int]:
        head = content["fednorm"]
        pid, num = int(head["partition-id"]), int(head["num-partitions"])
        return {c for c in range(self.config.num_clients) if host_of(c, num) == pid}

    # -- the seams --------------------------------------------------------------------------
    def train_clients(self, server_round: int, client_ids: list[int], lr: float) -> ClientUpdates:
        content = self._content(client_ids, server_round=server_round, lr=lr)
        if self.secure:
            content["fednorm"]["secure"] = True
        got, failed = self._exchange(protocol.TRAIN, content, str(server_round))
        parts: list[ClientUpdates | None] = []
        covered: set[int] = set()
        seen = 0
        for reply in got.values():
            covered |= self._covered(reply)
            seen += int(reply["fednorm"]["samples-seen"])
            parts.append(record_to_updates(reply["updates"], reply["fednorm"]) if "updates" in reply.array_records else None)
        self._last_samples_seen = seen
        merged = merge_updates(parts, client_ids)
        if merged is None:
            g = self.global_state
            merged = ClientUpdates(
                client_ids=[], states={k: g[k].new_empty((0, *g[k].shape)) for k in self.method.shared_keys},
                num_examples=torch.zeros(0, dtype=torch.float64), train_loss=torch.zeros(0, dtype=torch.float64),
                num_steps=torch.zeros(0, dtype=torch.int64),
            )
        if self.secure and len(merged):
            self._read_layout(got.values())
            merged = self._secure_rows(merged, [n for n, r in got.items() if "updates" in r.array_records], server_round)
        reason = "; ".join(failed.values()) or "no SuperNode hosts it (check partition-id / num-partitions)"
        for cid in client_ids:
            if cid not in covered:
                merged.failures[cid] = f"its SuperNode did not answer ({reason})"
        return merged

    def _secure_rows(self, merged: ClientUpdates, nodes: list[int], server_round: int) -> ClientUpdates:
        """Every client's row set to ``θ + the SecAgg+ weighted mean update`` (the nodes replied
        metadata only), so the method's weighted mean is that mean."""
        from .secure import apply_mean, fbn_rows_from_sums, layer_scales, pooled_from_sums, secure_mean, unscale

        weight = float(self.method.client_weights(merged).sum())
        # The statistics sums travel divided by the nodes' weights; each layer's scaled by the public
        # ΣW / (its smallest step count) they are back at the statistics' own magnitude, so the
        # protocol's quantization costs them no more than it costs the update.
        counts = {p: merged.extras[f"{p}.count"] for p in self._secure_layout}
        scales = layer_scales(self._secure_layout, counts, weight)
        mean = secure_mean(self.grid, nodes, server_round, max_weight=max(weight, 1.0), timeout=self.timeout,
                           stats_scales=scales)
        self.exchanges += 4  # the protocol's setup, share keys, collect masked vectors, unmask
        rows, rest = apply_mean(self.method, self.global_state, mean)
        rest = unscale(rest, self._secure_layout, scales)
        k = len(merged)
        states = {key: v.unsqueeze(0).expand(k, *v.shape).clone() for key, v in rows.items()}
        extras: dict[str, torch.Tensor] = dict(merged.extras)  # the clients' counts (public)
        layout = self._secure_layout
        for p, (_, mu, var) in pooled_from_sums(rest, layout, weight).items():  # HBN: the pooled statistics
            extras[f"{p}.mean"] = mu.unsqueeze(0).expand(k, -1).clone()
            extras[f"{p}.var"] = var.unsqueeze(0).expand(k, -1).clone()
        inner = getattr(self.method, "inner", self.method)
        momenta = {f"fbn.{n}": b for n, b in getattr(inner, "momenta", {}).items()}
        counts = {p: merged.extras[f"{p}.count"] for p, (_, steps) in layout.items() if steps}
        for p, (mu, var) in fbn_rows_from_sums(rest, layout, weight, counts, momenta).items():  # FBN: per step
            extras[f"{p}.mean"], extras[f"{p}.var"] = mu, var
        return dataclasses.replace(merged, states=states, extras=extras)

    def _read_layout(self, replies: Any) -> None:
        """The statistics layout (layers, channels) the nodes reported with a secure reply."""
        import json

        for reply in replies:
            head = reply["fednorm"]
            if "secure-stats" in head:
                self._secure_layout = json.loads(str(head["secure-stats"]))
                return

    def _secure_query(self, client_ids: list[int], query: str, state: dict[str, torch.Tensor] | None) -> dict[int, dict[str, torch.Tensor]]:
        """A statistics query under SecAgg+: the nodes keep their clients' statistics sums; the
        server unmasks their total, the pooled statistics, and answers every client with them
        (its own public count), so the method pools exactly what it would from plain answers."""
        from .secure import layer_scales, pooled_from_sums, secure_mean, unscale

        content = self._content(client_ids, server_round=self.server_round, query=query, state=state)
        content["fednorm"]["secure"] = True
        got, failed = self._exchange(protocol.QUERY, content, f"{self.server_round}.{query}")
        answers: dict[int, dict[str, torch.Tensor]] = {}
        nodes = []
        for node, reply in got.items():
            part = record_to_bank(reply["answers"], self.device)
            if part:
                nodes.append(node)
            answers.update(part)
        missing = [c for c in client_ids if c not in answers]
        if missing:
            raise RoundFailedError(f"query '{query}' after round {self.server_round}: no answer for clients {missing} "
                                   f"({'; '.join(failed.values()) or 'no SuperNode hosts them'})")
        self._read_layout(got.values())
        layers = list(self._secure_layout)
        total = sum(float(answers[c][f"{layers[0]}.count"]) for c in client_ids) if layers else 0.0
        counts = {p: torch.stack([answers[c][f"{p}.count"].double().reshape(()) for c in client_ids]) for p in layers}
        scales = layer_scales(self._secure_layout, counts, total)  # layers count values per channel differently
        mean = secure_mean(self.grid, nodes, self.server_round, max_weight=max(total, 1.0), timeout=self.timeout,
                           stats_scales=scales)
        self.exchanges += 4
        pooled = pooled_from_sums(unscale(torch.from_numpy(mean), self._secure_layout, scales), self._secure_layout, total)
        out = {}
        for c in client_ids:
            out[c] = dict(answers[c])
            for p, (_, mu, var) in pooled.items():
                out[c][f"{p}.mean"], out[c][f"{p}.var"] = mu.to(self.device), var.to(self.device)
        return out

    def query_clients(
        self, client_ids: list[int], query: str, state: dict[str, torch.Tensor] | None = None
    ) -> dict[int, dict[str, torch.Tensor]]:
        if self.secure and query not in EVALUATION_QUERIES:  # a score (test or validation split) is sent as it is
            return self._secure_query(client_ids, query, state)
        message_type = protocol.EVALUATE if query in EVALUATION_QUERIES else protocol.QUERY
        content = self._content(client_ids, server_round=self.server_round, query=query, state=state)
        got, failed = self._exchange(message_type, content, f"{self.server_round}.{query}")
        answers: dict[int, dict[str, torch.Tensor]] = {}
        for reply in got.values():
            answers.update(record_to_bank(reply["answers"], self.device))
        missing = [c for c in client_ids if c not in answers]
        if missing:
            raise RoundFailedError(
                f"query '{query}' after round {self.server_round}: no answer for clients {missing} "
                f"({'; '.join(failed.values()) or 'no SuperNode hosts them'})"
            )
        return {c: answers[c] for c in client_ids}

    # -- the clients' local state (checkpoints, summary) --------------------------------------
    def collect_bank(self) -> dict[int, dict[str, torch.Tensor]]:
        """Every client's local state, fetched from the nodes (once per round)."""
        if self._push_bank is not None and self._push_to == set(self.nodes):  # resumed, nothing sent yet
            return self._push_bank
        if self.server_round == 0:
            return {}
        if self._gathered is None or self._gathered[0] != self.server_round:
            content = self._content([], server_round=self.server_round)
            got, failed = self._exchange(protocol.BANK, content, f"{self.server_round}.bank")
            if failed:
                raise RoundFailedError(f"cannot collect the clients' local state: {'; '.join(failed.values())}")
            bank: dict[int, dict[str, torch.Tensor]] = {}
            for reply in got.values():
                bank.update(record_to_bank(reply["answers"]))
            if self._push_bank is not None:  # nodes that have not had theirs back yet: the checkpoint's
                bank = {**self._push_bank, **bank}
            self._gathered = (self.server_round, bank)
        return self._gathered[1]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._push_bank = {int(c): dict(s) for c, s in state["bank"].items()} or None
        self._push_to = set(self.nodes) if self._push_bank else set()
        self.bank = ClientStateBank(self.device)

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out["runtime"] = f"Flower ({len(self.nodes)} SuperNodes)"
        out["flower_exchanges"] = self.exchanges
        return out


def simulation_factory(grid: Grid, nodes: list[int], timeout: float, secure: bool = False) -> Callable[..., FlowerSimulation]:
    """What :func:`fednorm.api.run` takes as ``simulation=`` (``secure``: SecAgg+ of the updates)."""

    def build(config: ExperimentConfig, data: FederatedData | None = None) -> FlowerSimulation:
        return FlowerSimulation(config, data, grid=grid, nodes=nodes, timeout=timeout, secure=secure)

    return build
