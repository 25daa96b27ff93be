"""The simulator with its clients spread over ``torch.distributed`` ranks.

Every rank builds the same experiment from the same config (data, partition, model and method
are deterministic functions of the seed) and hosts the clients ``c`` with ``c % world == rank``:
it trains them, keeps their local state (FedBN's BN tensors, HBN's alpha, SCAFFOLD's control
variates) in its own bank and answers queries about them. Rank 0 is also the server:

1. every rank samples the round's clients (seeded, so all agree) and trains the ones it hosts;
2. the updates are gathered to rank 0, put in sampled-client order and handed to the unchanged
   server code (screening, attacks, the method's ``aggregate``, accounting);
3. rank 0 broadcasts the new global state, the method's server state and the counters;
4. evaluation and method queries (HBN's statistics pass) run on the hosting ranks and are
   gathered, so a personalised evaluation uses each client's own tensors where they live.

Lockstep methods (FedTAN) reduce their BatchNorm statistics *during* the forward and backward
pass through :class:`~fednorm.distributed.comm.DistributedClientComm`, so the same layer code
aggregates over clients on other ranks; each rank counts its clients' share of those exchanges
and rank 0 adds the shares up, so the run reports the simulator's counted traffic. A failure
inside a rank's training (a divergence) is sent to the server and raised on every rank; a rank
that dies makes the others' collectives fail (or time out after ``timeout``), never hang.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..config import ExperimentConfig
from ..data.federated import FederatedData
from ..engine.remote import describe_error, host_of, merge_updates, rebuild_error
from ..engine.simulator import RoundRecord, Simulation
from ..errors import ConfigError
from ..methods.base import ClientUpdates
from ..nn.comm import CommTraffic
from .comm import DistributedClientComm

__all__ = ["DistributedSimulation", "init_distributed", "host_of"]

def _moved(obj: Any, device: Any) -> Any:
    """``obj`` (tensors in dicts, lists, ClientUpdates) on ``device``. Object collectives pickle
    tensors with their device, so everything crosses ranks on the CPU (cuda:1 means nothing on
    rank 0) and returns to the rank's device after."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _moved(v, device) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_moved(v, device) for v in obj]
    if isinstance(obj, ClientUpdates):
        return ClientUpdates(
            client_ids=obj.client_ids, states=_moved(obj.states, device), num_examples=obj.num_examples,
            train_loss=obj.train_loss, num_steps=obj.num_steps, extras=_moved(obj.extras, device),
            failures=obj.failures, seconds=obj.seconds,
        )
    return obj


def init_distributed(backend: str | None = None, timeout: float = 300.0) -> None:
    """Join the process group described by torchrun's environment (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``). ``timeout`` bounds every collective, so a rank that
    stops answering fails the run instead of hanging it."""
    if dist.is_initialized():
        return
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise ConfigError(
            f"torch.distributed environment not set ({', '.join(missing)}); start with "
            "`fednorm launch --nproc N ...` or `torchrun --nproc-per-node N -m fednorm.distributed ...`"
        )
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout))


class DistributedSimulation(Simulation):
    """A :class:`~fednorm.engine.simulator.Simulation` whose clients live on the ranks of the
    current process group; rank 0 aggregates and writes. Same config, same results as the
    in-process simulator (to float rounding in lockstep methods' cross-rank sums).

    Needs an initialised process group (``fednorm.distributed.init_distributed``).
    """

    def __init__(self, config: ExperimentConfig, data: FederatedData | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("DistributedSimulation needs an initialised torch.distributed process group")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        super().__init__(config, data)
        if self.method.requires_lockstep:
            self.executor.comm_factory = DistributedClientComm

    @property
    def is_main(self) -> bool:  # type: ignore[override]
        return self.rank == 0

    def hosted(self, client_ids: list[int]) -> list[int]:
        """The clients of ``client_ids`` that this rank hosts."""
        return [c for c in client_ids if host_of(c, self.world_size) == self.rank]

    # -- the round --------------------------------------------------------------------------
    def step(self) -> RoundRecord:
        plan = self.begin_round()
        if self.method.requires_lockstep:
            self._check_lockstep(plan.training)
        outcome: dict[str, Any] = {}
        try:
            # rank 0 raises here what any rank's training raised; the others have sent theirs
            updates = self.train_clients(plan.server_round, plan.training, plan.lr) if plan.training else None
        except Exception as exc:
            if not self.is_main:
                raise
            outcome = {"error": describe_error(exc)}
        if self.is_main and not outcome:
            try:
                record = self.server_update(plan, updates)
                outcome = {"record": record, "server": self._server_state()}
            except Exception as exc:  # every rank must hear of it, or the others wait for a broadcast
                outcome = {"error": describe_error(exc)}
        box = [outcome]
        dist.broadcast_object_list(box, src=0)
        outcome = box[0]
        if "error" in outcome:
            name, message = outcome["error"]
            raise rebuild_error(name, message)
        if not self.is_main:
            self._load_server_state(outcome["server"])
        record = outcome["record"]
        self.finish_round(record)
        return record

    def _check_lockstep(self, training: list[int]) -> None:
        """FedTAN's synchronised step is a collective: every rank must take part in it."""
        sizes = [len(self.data.client_train[c]) for c in training]
        for r in range(self.world_size):
            if not any(n > 0 for c, n in zip(training, sizes) if host_of(c, self.world_size) == r):
                raise ConfigError(
                    f"method '{self.config.method}' synchronises every round across ranks, but rank {r} hosts no "
                    f"non-empty client of this round; use at most as many processes as sampled clients "
                    f"({len(training)}) and sample all clients (clients_per_round = num_clients)"
                )

    def train_clients(self, server_round: int, client_ids: list[int], lr: float) -> ClientUpdates | None:
        """Train the hosted clients; rank 0 receives everyone's updates (``None`` elsewhere)."""
        mine = self.hosted(client_ids)
        payload: dict[str, Any] = {"seen": 0, "updates": None, "traffic": CommTraffic()}
        try:
            if mine:
                self.executor.round_clients = list(client_ids)  # the synchronised step weights by all of them
                payload["updates"] = _moved(self.executor.run_round(server_round, mine, self.global_state, lr), "cpu")
                payload["seen"] = self.executor.last_samples_seen
                payload["traffic"] = getattr(self.executor, "last_traffic", CommTraffic())
        except Exception as exc:  # reported through the server and raised on every rank, never a lone exit
            name, message = describe_error(exc)
            payload["error"] = (name, f"rank {self.rank}: {message}")
        gathered: list[Any] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(payload, gathered, dst=0)
        if not self.is_main:
            return None
        assert gathered is not None
        errors = [p["error"] for p in gathered if "error" in p]
        if errors:
            name, message = errors[0]
            raise rebuild_error(name, message)
        self._last_samples_seen = sum(p["seen"] for p in gathered)
        self._last_traffic = CommTraffic.across_ranks([p["traffic"] for p in gathered])
        return _moved(merge_updates([p["updates"] for p in gathered], client_ids), self.device)

    def _server_state(self) -> dict[str, Any]:
        return {
            "server_round": self.server_round,
            "global_state": _moved(self.global_state, "cpu"),
            "method_state": _moved(self.method.state_dict(), "cpu"),
            "counters": (self.uplink_bytes, self.downlink_bytes, self.downlink_bytes_broadcast, self.comm_rounds,
                         self.samples_trained, self.wall_seconds),
            "dropped": dict(self.dropped),
            "events": list(self.events),
            "pending_events": list(self._pending_events),
        }

    def _load_server_state(self, state: dict[str, Any]) -> None:
        self.server_round = int(state["server_round"])
        self.global_state = {k: v.to(self.device) for k, v in state["global_state"].items()}
        self.method.load_state_dict(state["method_state"])
        (self.uplink_bytes, self.downlink_bytes, self.downlink_bytes_broadcast, self.comm_rounds,
         self.samples_trained, self.wall_seconds) = state["counters"]
        self.dropped = state["dropped"]
        self.events = state["events"]
        self._pending_events = state["pending_events"]

    # -- client queries and evaluation --------------------------------------------------------
    def query_clients(
        self, client_ids: list[int], query: str, state: dict[str, torch.Tensor] | None = None
    ) -> dict[int, dict[str, torch.Tensor]]:
        """Each rank answers for the clients it hosts; every rank receives all answers."""
        mine = {cid: _moved(self.client_query(cid, query, state), "cpu") for cid in self.hosted(client_ids)}
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, mine)
        answers: dict[int, dict[str, torch.Tensor]] = {}
        for part in gathered:
            answers.update(_moved(part, self.device))
        return answers

    def evaluate_global(self, state: dict[str, torch.Tensor]) -> tuple[float, float, list[float | None]]:
        """Rank 0 evaluates the global model (it holds the test set) and shares the result."""
        box = [super().evaluate_global(state) if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def agree_to_stop(self, requested: bool) -> bool:
        """Stop when any rank got a signal, so all ranks leave the round loop together."""
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
        flag = torch.tensor([1 if requested else 0], dtype=torch.int64, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    # -- whole-run state ----------------------------------------------------------------------
    def collect_bank(self) -> dict[int, dict[str, torch.Tensor]]:
        """Every client's local state, gathered from the ranks that host them (a collective)."""
        own = {cid: _moved(s, "cpu") for cid, s in self.bank.state_dict().items() if host_of(cid, self.world_size) == self.rank}
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, own)
        full: dict[int, dict[str, torch.Tensor]] = {}
        for part in gathered:
            full.update(part)
        return full

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out["world_size"] = self.world_size
        out["runtime"] = f"torch.distributed ({dist.get_backend()}, {self.world_size} processes)"
        return out
