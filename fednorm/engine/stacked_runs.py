"""Several runs as one computation: their clients trained together in one stacked model per round.

A paper's table is many runs of one small model (seeds, partitions, table cells). The vectorized
executor already trains a round's clients as a tensor dimension; :class:`StackedRunsExecutor`
stacks the runs' clients the same way: each round, the clients every run sampled are loaded into
one stacked model (each row with its own run's global weights and its own local state), trained
in lockstep, and their updates handed back to their runs, rows ordered by run and then client.
Everything else stays each run's own: its config, data partition, client sampling, method and
server state, state bank, evaluation, checkpoints and run directory. The driver that steps the
runs' rounds is :func:`fednorm.api.run_set.run_stacked` (one thread, runs as a dimension).

Each stacked run equals the same run alone to float rounding (tested in float64): the rows draw
the batches and augmentation of their own run's seeded streams. What stacks (:func:`stack_blockers`):
runs of one method, model, norm and local schedule on one dataset, whose method has no client-side
hooks (FedAvg with any norm, FedBN, SiloBN, FedFN, ...) or hooks that read each row's run from the
context (HBN, FBN, FixBN and the client optimizers: :attr:`~fednorm.methods.base.Method.stacks_across_runs`),
and FedTAN, whose synchronised step reduces over each run's clients only (one group per run); each row
steps at its own run's learning rate (seeds, partitions and learning rates stack: a sweep is one
computation). Anything else runs each run's round on its own executor, with the reason said once.
Runs that stand at different rounds (one resumed beside new ones) train in one group per round.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..config import ExperimentConfig
from ..config_roles import STACK_SHARED_FIELDS
from ..data.federated import FederatedData
from ..methods.base import ClientUpdates, Method
from ..nn.comm import CommTraffic, GroupedClientComm
from .rng import derive_seed, torch_generator
from .simulator import Simulation
from .stack_memory import stack_budget
from .vectorized import VectorizedExecutor

__all__ = ["stack_blockers", "StackedRunsExecutor"]

def stack_blockers(configs: Sequence[ExperimentConfig]) -> list[str]:
    """Why ``configs`` cannot run stacked (empty when they can); checked before any run starts."""
    from ..optim.compose import build_method

    reasons = []
    first = configs[0]
    for name in STACK_SHARED_FIELDS:  # they shape the stacked model and the local steps
        values = {repr(getattr(c, name)) for c in configs}
        if len(values) > 1:
            reasons.append(f"the runs differ in {name}")
    if first.executor == "sequential":
        reasons.append("executor sequential was asked for")
    for bad, why in ((first.client_deadline is not None, "client_deadline times each client alone"),
                     (first.diagnostics is not None, "diagnostics read each run's clients"),
                     (first.dp_clip is not None, "client-level DP noises each run's updates")):
        if bad:
            reasons.append(why)
    method = build_method(first)
    hooks = [h for h in ("stacked_client_begin", "stacked_client_end", "stacked_client_loss", "stacked_client_gradient",
                         "client_begin", "client_end", "client_loss", "client_gradient")
             if getattr(type(method), h) is not getattr(Method, h)]
    if hooks and not type(method).stacks_across_runs:
        reasons.append(f"method '{first.method}'" + (f" with client_opt '{first.client_opt}'" if first.client_opt != "none" else "")
                       + f" has client-side hooks ({', '.join(hooks[:2])}) that act on one run's state")
    return reasons


def _per_step(t: torch.Tensor, steps: torch.Tensor) -> bool:
    """Whether upload ``t`` (``[K, L, ...]``) holds one entry per local step, zero-padded to the
    most steps: each row is zero from its own steps on (a per-client tensor whose size happens to
    equal the steps is not)."""
    if t.dim() < 2 or t.shape[1] != int(steps.max()):
        return False
    positions = torch.arange(t.shape[1], device=t.device).view(1, -1, *([1] * (t.dim() - 2)))
    padding = positions >= steps.to(t.device).view(-1, 1, *([1] * (t.dim() - 2)))
    return bool((t.masked_select(padding.expand_as(t)) == 0).all())


def _own_padding(part: ClientUpdates, union: ClientUpdates, per_step: set[str]) -> ClientUpdates:
    """``part``'s per-step uploads padded as its run alone pads them: to its own clients' most
    local steps, not the union's (the padding is zeros, counted in the run's uplink bytes)."""
    if not per_step or not len(part):
        return part
    own = int(part.num_steps.max())
    part.extras = {k: t[:, :own] if k in per_step else t for k, t in part.extras.items()}
    return part


class _RowBank:
    """The stacked executor's bank: row ``v`` of the union is client ``c`` of run ``r``, whose
    state lives in that run's own bank (so each run's checkpoint holds its clients)."""

    def __init__(self, owner: "StackedRunsExecutor") -> None:
        self.owner = owner

    def get(self, v: int) -> dict[str, torch.Tensor] | None:
        r, c = self.owner.locate(v)
        return self.owner.sims[r].bank.get(c)

    def put(self, v: int, state: dict[str, torch.Tensor]) -> None:
        r, c = self.owner.locate(v)
        self.owner.sims[r].bank.put(c, state)


class StackedRunsExecutor(VectorizedExecutor):
    """The vectorized executor over the union of several runs' clients (module docstring).

    Client ``c`` of run ``r`` is row ``offsets[r] + c`` of a virtual federation whose data are the
    runs' (shared) tensors with every run's client index sets one after the other.
    """

    def __init__(self, sims: Sequence[Simulation]) -> None:
        built = [sim for sim in sims if sim is not None]  # None: a run that failed before it was built
        base = built[0]
        for sim in built[1:]:
            same = sim.data.train_x is base.data.train_x or torch.equal(sim.data.train_x, base.data.train_x)
            if not (same and torch.equal(sim.data.train_y, base.data.train_y)):
                raise ValueError("the runs' training tensors differ: their datasets cannot be stacked")
        self.sims = list(sims)
        self.offsets = [0]
        for sim in sims:
            self.offsets.append(self.offsets[-1] + (sim.data.num_clients if sim is not None else 0))
        union = FederatedData(info=base.data.info, train_x=base.data.train_x, train_y=base.data.train_y,
                              test_x=base.data.test_x, test_y=base.data.test_y,
                              client_train=[ix for sim in built for ix in sim.data.client_train],
                              client_test=[ix for sim in built for ix in sim.data.client_test], augment=base.data.augment)
        self._states: dict[int, dict[str, torch.Tensor]] = {}
        self._rates: dict[int, float] = {}
        self._groups: torch.Tensor | None = None  # each chunk row's run (lockstep methods: sync groups)
        self._group_list: list[int] = []  # the same on the host
        self.run_traffic: dict[int, CommTraffic] = {}  # each run's synchronised exchanges this round
        super().__init__(base.model, base.method, union, _RowBank(self), base.spec, base.config.seed,  # type: ignore[arg-type]
                         max_clients=base.config.max_parallel_clients * len(built),
                         # one budget for the whole stack: the runs share the device (and the field)
                         memory_budget=stack_budget(base.config.stack_memory_gib, base.device))
        self.compile_step = base.config.train_compile

    def locate(self, v: int) -> tuple[int, int]:
        """(run, client) of union row ``v``."""
        for r in range(len(self.sims)):
            if v < self.offsets[r + 1]:
                return r, v - self.offsets[r]
        raise IndexError(v)

    def client_local(self, client_id: int, global_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        r, c = self.locate(client_id)
        return self.sims[r].executor.client_local(c, self._states[r])

    def _context(self, server_round, client_ids, net, indices, global_state, locals_, lr):
        """The hooks see each row as its own run's client: its run-local id, seed and global state."""
        ctx = super()._context(server_round, client_ids, net, indices, global_state, locals_, lr)
        rows = [self.locate(v) for v in client_ids]
        ctx.client_ids = [c for _, c in rows]
        ctx.seeds = [self.sims[r].config.seed for r, _ in rows]
        ctx.global_states = [self._states[r] for r, _ in rows]
        ctx.methods = [self.sims[r].method for r, _ in rows]
        ctx.lrs = [self._rates.get(r, lr) for r, _ in rows]
        return ctx

    def _generators(self, server_round: int, client_ids: list[int]) -> list[torch.Generator]:
        rows = [self.locate(v) for v in client_ids]
        return [torch_generator(self.sims[r].config.seed, "batches", server_round, c) for r, c in rows]

    def _module_seed(self, server_round: int, client_ids: list[int]) -> int:
        r, c = self.locate(client_ids[0])
        return derive_seed(self.sims[r].config.seed, "module-rng-vectorized", server_round, c)

    def _load_chunk(self, client_ids: list[int], global_state: dict[str, torch.Tensor]):
        net = self._stacked_model(len(client_ids))
        locals_ = [self.client_local(v, global_state) for v in client_ids]
        runs = [self.locate(v)[0] for v in client_ids]
        with torch.no_grad():
            for key, tensor in net.state_dict(keep_vars=True).items():
                if key in self.method.local_keys:
                    tensor.copy_(torch.stack([loc[key] for loc in locals_]))
                else:  # each row its own run's global tensor
                    tensor.copy_(torch.stack([self._states[r][key] for r in runs]))
        return net, locals_

    def train(self, server_round: int, requests: dict[int, list[int]], lr: float | dict[int, float]) -> dict[int, ClientUpdates]:
        """Train ``requests`` (run -> its clients) of one round together, at one learning rate or
        each run's own (``lr``: run -> rate); each run's updates, with its own client ids.

        The rows are ordered by run and then by client whatever the order of ``requests``: the
        order decides which rows share a chunk, and so the bits of a float32 result. A method
        that synchronises a run's clients (FedTAN) gets whole runs per chunk, each run one
        synchronisation group (:class:`~fednorm.nn.comm.GroupedClientComm`)."""
        requests = {r: sorted(requests[r]) for r in sorted(requests)}
        self._states = {r: self.sims[r].global_state for r in requests}
        self._rates = {r: float(lr if isinstance(lr, (int, float)) else lr[r]) for r in requests}
        self.run_traffic = {}
        packs: list[list[int]] = [list(requests)]
        if self.method.requires_lockstep:  # never split a run's clients over two chunks
            packs, size = [], 0
            for r in requests:
                if not packs or size + len(requests[r]) > self.max_clients:
                    packs.append([])
                    size = 0
                packs[-1].append(r)
                size += len(requests[r])
        out: dict[int, ClientUpdates] = {}
        for runs in packs:
            union = [self.offsets[r] + c for r in runs for c in requests[r]]
            rates = [self._rates[r] for r in runs for _ in requests[r]]
            updates = self.run_round(server_round, union, self.sims[runs[0]].global_state, rates)
            per_step = {k for k, t in updates.extras.items() if _per_step(t, updates.num_steps)}
            position = 0
            for r in runs:
                part = updates.subset(list(range(position, position + len(requests[r]))))
                part.client_ids = list(requests[r])
                position += len(requests[r])
                out[r] = _own_padding(part, updates, per_step)
        return out

    def _run_chunk(self, server_round: int, client_ids: list[int], global_state: dict[str, torch.Tensor],
                   lr: float | list[float]) -> ClientUpdates:
        if not self.method.requires_lockstep:
            return super()._run_chunk(server_round, client_ids, global_state, lr)
        self._group_list = [self.locate(v)[0] for v in client_ids]
        self._groups = torch.tensor(self._group_list, dtype=torch.long)
        self.comm_factory = GroupedClientComm
        updates = super()._run_chunk(server_round, client_ids, global_state, lr)
        for r, traffic in self.comm.traffic_by_group.items():
            self.run_traffic[r] = self.run_traffic.get(r, CommTraffic()) + traffic
        return updates

    def _synced_step(self, net, params, buffers, frozen_now, rows, *args, **kwargs) -> None:
        assert self._groups is not None
        self.comm.groups = [self._group_list[i] for i in rows]  # the working set's runs: each synchronises its own
        return super()._synced_step(net, params, buffers, frozen_now, rows, *args, **kwargs)

    def _round_batch(self, t: int, rows: list[int] | None = None, plans: list[list[torch.Tensor]] | None = None
                     ) -> int | torch.Tensor | None:
        """Each working row's run's samples at step ``t``: every run's clients are a round of their own."""
        if rows is None or plans is None or self._groups is None:
            return super()._round_batch(t, rows, plans)
        groups = [self._group_list[i] for i in rows]  # on the host: a synchronised step reads no tensor
        totals: dict[int, int] = {}
        for i, g in zip(rows, groups):
            totals[g] = totals.get(g, 0) + (len(plans[i][t]) if t < len(plans[i]) else 0)
        return torch.tensor([totals[g] for g in groups], dtype=torch.long)

    def samples_seen(self, run: int, clients: list[int]) -> int:
        """The samples ``clients`` of ``run`` train in a round: their batch plans' sizes (the
        stream picks which samples, not how many)."""
        data = self.sims[run].data
        return sum(sum(self._batch_sizes(len(data.client_train[c]))) for c in clients)

    def snapshot(self, requests: dict[int, list[int]]) -> dict[int, dict[int, dict[str, torch.Tensor] | None]]:
        """Each requested client's local state before a joint round (the bank replaces a client's
        entry, never changes it in place, so references suffice)."""
        return {r: {c: self.sims[r].bank.get(c) for c in clients} for r, clients in requests.items()}

    def restore(self, saved: dict[int, dict[int, dict[str, torch.Tensor] | None]]) -> None:
        """Put back the local states of :meth:`snapshot`: a joint round that failed in a later chunk
        leaves no client of an earlier one trained."""
        for r, entries in saved.items():
            for c, state in entries.items():
                self.sims[r].bank.restore(c, state)
