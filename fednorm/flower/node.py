"""What a Flower node (SuperNode) computes for fednorm: train or query the clients it hosts.

A node hosts the clients ``c`` with ``host_of(c, num-partitions) == partition-id`` (its
``node_config``). It rebuilds the experiment from the config in the message (data, model and
method are deterministic functions of the seed; cached per process), loads the global state and
the method's server state sent with the message, and its clients' local state (FedBN's BN
tensors, HBN's alpha, SCAFFOLD's control variates) from the node's persistent
``context.state``. It then runs the engine's own executor or client query, and writes the local
state back. Nothing here depends on Flower's runtime: :mod:`fednorm.flower.client_app` wires it
to a ClientApp.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, MetricRecord, RecordDict

from ..config import ExperimentConfig
from ..engine.remote import describe_error, host_of
from ..engine.simulator import Simulation
from ..errors import ConfigError, DivergenceError, FednormError, RoundFailedError
from . import protocol
from .records import bank_to_record, record_to_bank, record_to_tensors, unpack_tree, updates_to_record

__all__ = ["handle", "node_partition", "BANK_KEY"]

BANK_KEY = "fednorm.bank"  # the hosted clients' local state in context.state

_cache: dict[str, Simulation] = {}


def _experiment(config_text: str) -> Simulation:
    """The node's copy of the experiment (one per process: a deployment starts a process per
    message, the simulation engine reuses its actors)."""
    key = protocol.config_key(config_text)
    sim = _cache.get(key)
    if sim is None:
        _cache.clear()
        from ..plugins import load_plugins

        load_plugins()  # a plugin's method or model, named in the config (FEDNORM_PLUGINS on the SuperNode)
        sim = _cache[key] = Simulation(ExperimentConfig(**json.loads(config_text)))
    return sim


def node_partition(node_config: Any) -> tuple[int, int]:
    """``(partition-id, num-partitions)`` from a node's config."""
    try:
        pid, num = int(node_config["partition-id"]), int(node_config["num-partitions"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(
            "this SuperNode has no integer partition-id / num-partitions; start it with "
            "--node-config 'partition-id=I num-partitions=N' (I = 0..N-1, N = the number of SuperNodes)"
        ) from None
    if not 0 <= pid < num:
        raise ConfigError(f"partition-id={pid} is not in 0..num-partitions-1 (num-partitions={num})")
    return pid, num


def _load(sim: Simulation, content: RecordDict, state: RecordDict, pid: int, num: int) -> None:
    """Put the server's view (global state, method state) and the node's clients' local state
    into the node's experiment."""
    head = content["fednorm"]
    sim.global_state = {k: v.to(sim.device) for k, v in record_to_tensors(content["global"]).items()}
    sim.method.load_state_dict(unpack_tree(record_to_tensors(content["method"]), str(head["method-state"])))
    if "bank" in content.array_records:  # the first message after a resume: the checkpoint's local state
        bank = {c: s for c, s in record_to_bank(content["bank"], sim.device).items() if host_of(c, num) == pid}
    else:
        bank = record_to_bank(state[BANK_KEY], sim.device) if BANK_KEY in state else {}
    sim.bank.load_state_dict(bank)


def _hosted(clients: list[int], pid: int, num: int) -> list[int]:
    return [c for c in clients if host_of(c, num) == pid]


def handle(message_type: str, content: RecordDict, state: RecordDict, node_config: Any) -> RecordDict:
    """The reply content to one server message; updates ``state`` (the node's context.state)."""
    head = content["fednorm"]
    meta: dict[str, Any] = {"samples-seen": 0}
    reply = RecordDict()
    pid = None
    try:
        pid, num = node_partition(node_config)
        meta.update({"partition-id": pid, "num-partitions": num})
        if message_type == protocol.BANK:  # no experiment needed
            own = record_to_bank(state[BANK_KEY]) if BANK_KEY in state else {}
            reply["answers"] = bank_to_record({c: s for c, s in own.items() if host_of(c, num) == pid})
            reply["fednorm"] = ConfigRecord(meta)
            return reply
        sim = _experiment(str(head["config"]))
        clients = [int(c) for c in head["clients"]]
        mine = _hosted(clients, pid, num)
        _load(sim, content, state, pid, num)
        server_round = int(head["server-round"])
        if message_type == protocol.TRAIN:
            sim.server_round = server_round - 1
            sim.method.configure_round(server_round, clients)  # as every rank does in a distributed run
            updates = sim.executor.run_round(server_round, mine, sim.global_state, float(head["lr"])) if mine else None
            if updates is not None:
                if "secure" in head and bool(head["secure"]):  # SecAgg+: keep the node's sum, reply metadata only
                    from .secure import keep_vector, node_vector, secure_layout, secure_steps

                    steps = secure_steps(sim.config)
                    keep_vector(state, *node_vector(sim.method, updates, sim.global_state, steps))
                    meta["secure-stats"] = secure_layout(updates.extras, steps)
                    counts = {k: v for k, v in updates.extras.items() if k.endswith(".count")}  # public metadata
                    updates = dataclasses.replace(updates, states={}, extras=counts)
                reply["updates"], extra = updates_to_record(updates)
                meta.update(extra)
                meta["samples-seen"] = int(sim.executor.last_samples_seen)
                reply["metrics"] = MetricRecord({"num-examples": int(updates.num_examples.sum())})
        else:
            sim.server_round = server_round
            over = record_to_tensors(content["state"], sim.device) if "state" in content.array_records else None
            model_state = None if over is None else {**sim.global_state, **over}
            query = str(head["query"])
            answers = {c: sim.client_query(c, query, model_state) for c in mine}
            if "secure" in head and bool(head["secure"]) and answers:  # SecAgg+ of the pooled statistics
                from .secure import keep_vector, secure_layout, statistics_layers, statistics_sums

                rows = [answers[c] for c in mine]
                layers = statistics_layers(rows[0])
                counts = sum(float(r[f"{layers[0]}.count"]) for r in rows) if layers else 0.0
                sums = [statistics_sums(rows, [p], max(counts, 1e-300)) for p in layers]
                keep_vector(state, torch.cat(sums).numpy() if sums else np.zeros(0), counts, [0] + [len(x) for x in sums])
                meta["secure-stats"] = secure_layout(rows[0])
                answers = {c: {k: v for k, v in a.items() if k.endswith(".count")} for c, a in answers.items()}
            reply["answers"] = bank_to_record(answers)
        state[BANK_KEY] = bank_to_record({c: s for c, s in sim.bank.state_dict().items() if host_of(c, num) == pid})
    except (FednormError, DivergenceError, RoundFailedError) as exc:  # raised the same way on the server
        where = "a SuperNode" if pid is None else f"the SuperNode with partition-id {pid}"
        name, message = describe_error(exc)
        meta.update({"error-type": name, "error": f"{where}: {message}"})
    reply["fednorm"] = ConfigRecord(meta)
    return reply
