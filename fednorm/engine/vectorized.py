"""The vectorized executor: a round's clients trained together as a client dimension.

The clients of a round (in chunks of at most ``max_clients``, capped by a memory budget:
:mod:`fednorm.engine.stack_memory`) are loaded into one stacked model
(:mod:`fednorm.nn.stacked`) and stepped in lockstep: at local step t every client that still
has a batch contributes it, the forward and backward passes run once for all of them, and a
vectorized SGD applies each client's own update. Results match the sequential executor up to
float rounding (tested in float64), because every client draws the same batches and
augmentation from the same seeded stream, and uses the same optimiser arithmetic:

- clients with fewer steps (smaller datasets, epochs mode) are masked: once they run out of
  batches their parameters, momentum and BatchNorm statistics no longer change;
- a step where clients' batch sizes differ (a last, partial batch) runs each batch size as its
  own group, through ``torch.func.functional_call`` on the group's slice of the parameters;
- SGD momentum, weight decay, gradient clipping and DSGD's dampened client momentum are
  applied per client, exactly as ``torch.optim.SGD``/``clip_grad_norm_`` would.

Dropout draws differ from the sequential executor (one generator for the chunk instead of one
per client), so models with dropout agree in distribution, not bit for bit.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from ..data.federated import FederatedData
from ..data.transforms import CropFlip, apply_crop_flip, draw_crop_flip
from ..errors import ConfigError, DivergenceError
from ..methods.base import ClientUpdates, Method, StackedClientContext, stack_rows
from ..nn.comm import ClientComm, CommTraffic, LocalClientComm
from ..nn.nf import adaptive_grad_clip_
from ..nn.stacked import (
    NotStackableError,
    set_client_comm,
    set_forward_clients,
    set_frozen_statistics,
    stack_model,
    to_client_layout,
)
from .bank import ClientStateBank
from .client_rows import ClientRows
from .executor import MOMENTUM_PREFIX, Executor, stack_uploads
from .feed import StepFeed, crop_rows, crop_source, to_device
from .local import LocalSpec, batch_plan, batch_sizes, train_local
from .lockstep import scale_client_grads, synced_loss
from .rng import derive_seed, torch_generator
from .stack_memory import COPIES_PER_CLIENT, client_bytes, clients_that_fit, lockstep_overflow, stack_budget

__all__ = ["VectorizedExecutor", "vectorization_blockers"]


def vectorization_blockers(method: Method) -> list[str]:
    """Reasons why a method cannot run vectorized (empty when it can).

    Client-side hooks act on one client's model, which a stacked model does not have: a method
    that overrides ``client_begin``/``client_end``/``client_loss``/``client_gradient`` runs
    vectorized only when it also gives their stacked form (``stacked_client_begin``/
    ``stacked_client_end``/``stacked_client_loss``/``stacked_client_gradient``, acting on the
    stacked model). Otherwise it runs on the sequential executor.
    """
    def overrides(m: Method, hook: str) -> bool:
        return getattr(type(m), hook) is not getattr(Method, hook)

    reasons = []
    inner = getattr(method, "inner", None)  # a method composed with client/server optimizers
    for hook, stacked in (("client_begin", "stacked_client_begin"), ("client_end", "stacked_client_end"),
                          ("client_loss", "stacked_client_loss")):
        if not overrides(method, hook) or (stacked is not None and overrides(method, stacked)):
            continue
        if inner is not None and (not overrides(inner, hook) or (stacked is not None and overrides(inner, stacked))):
            reasons.append(f"client optimizer '{method.client_opt.name}' uses {hook}")
        elif stacked is not None:
            reasons.append(f"method '{method.name}' overrides {hook} without a stacked form ({stacked})")
        else:
            reasons.append(f"method '{method.name}' overrides {hook}")
    if overrides(method, "client_gradient") and not overrides(method, "stacked_client_gradient"):
        who = (f"client optimizer '{method.client_opt.name}'" if inner is not None and not overrides(inner, "client_gradient")
               else f"method '{method.name}'")
        reasons.append(f"{who} replaces each step's gradient (client_gradient) without a stacked form (stacked_client_gradient)")
    if method.requires_lockstep and overrides(method, "client_loss"):
        reasons.append(f"method '{method.name}' synchronises local steps, which take no client loss term")
    if method.requires_lockstep and overrides(method, "client_gradient"):
        reasons.append(f"method '{method.name}' synchronises local steps, whose gradients no hook replaces")
    return reasons


class VectorizedExecutor(Executor):
    """Trains a round's clients together in a stacked model (see the module docstring).

    Args:
        model: the base model (its structure; its values are not used).
        method, data, bank, spec, seed: as for :class:`~fednorm.engine.executor.SequentialExecutor`.
        max_clients: the most clients held in one stacked model (config ``max_parallel_clients``).
        memory_budget: bytes allowed for the stacked parameters, gradients and optimiser state
            (config ``stack_memory_gib``; ``None``: the device's default,
            :func:`~fednorm.engine.stack_memory.stack_budget`); lowers ``max_clients`` for large
            models (at 2 GiB: ResNet-18 11 clients, AlexNet-BN 2).

    Raises:
        NotStackableError: the model or method cannot be vectorized.
    """

    name = "vectorized"

    def __init__(
        self,
        model: nn.Module,
        method: Method,
        data: FederatedData,
        bank: ClientStateBank,
        spec: LocalSpec,
        seed: int,
        max_clients: int = 64,
        memory_budget: int | None = None,
    ) -> None:
        blockers = vectorization_blockers(method)
        if blockers:
            raise NotStackableError("; ".join(blockers))
        # Verify once with two clients (the check does not depend on K), before the base class
        # warns about anything: a model that fails here runs on the sequential executor instead.
        example = data.train_x[: min(4, len(data.train_x))]
        if len(example) < 2:
            raise NotStackableError("need at least two training samples to verify the stacked model")
        stack_model(model, 2, example_input=example)
        super().__init__(model, method, data, bank, spec, seed)
        # Parameters, gradients and momentum of K clients live at once: cap K by a memory budget
        # (fednorm/engine/stack_memory.py).
        self.memory_budget = stack_budget(None, data.train_x.device) if memory_budget is None else memory_budget
        self.max_parallel = max_clients
        extra = getattr(getattr(method, "client_opt", None), "stacked_copies", 0)
        self.client_copies = COPIES_PER_CLIENT + extra  # model copies one client costs (a client optimizer's too)
        self.client_bytes = client_bytes(model, extra)
        self.max_clients = min(max_clients, clients_that_fit(model, self.memory_budget, extra))
        self._stacked: dict[int, nn.Module] = {}
        # Where the other clients of a synchronised step are: this chunk only, or other processes too
        # (fednorm.distributed sets DistributedClientComm).
        self.comm_factory: Callable[[], ClientComm] = LocalClientComm
        # All clients of the round when this executor trains only some of them (the distributed
        # runtime sets it): the synchronised step weights its clients by the whole round's batches.
        self.round_clients: list[int] | None = None
        # What the last round's synchronised steps exchanged, counted by its ClientComm.
        self.last_traffic = CommTraffic()
        # Run a lockstep method's unsynchronised steps (FedTAN's steps 2..E) client by client in
        # a plain model instead of stacked: the simulator sets it where one client's step is
        # large enough that a CPU runs it faster one by one (fednorm/engine/cost.py).
        self.sequential_after_sync = False
        self._plain: nn.Module | None = None
        self._trainable = {name for name, p in model.named_parameters() if p.requires_grad}
        # Gather each step's batch on the device by one index (fednorm/engine/feed.py); off: the
        # per-client gather and augmentation of ``_gather`` (the same bits, more host work).
        self.device_feed = True
        self._feed_source: torch.Tensor | None = None
        self._host_rows: dict[int, torch.Tensor] = {}  # each client's dataset rows, on the host
        # ``torch.compile`` of the stacked model's training forward (config ``train_compile``):
        # equal to eager to float rounding, not bit for bit; off by default.
        self.compile_step = False
        self._compiled: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {}

    # -- state movement ---------------------------------------------------------------------
    def _stacked_model(self, k: int) -> nn.Module:
        if k not in self._stacked:
            self._stacked[k] = stack_model(self.model, k, verify=False)
        return self._stacked[k]

    def _load_chunk(
        self, client_ids: list[int], global_state: dict[str, torch.Tensor]
    ) -> tuple[nn.Module, list[dict[str, torch.Tensor]]]:
        """The stacked model of ``client_ids`` loaded with the global shared tensors and each
        client's local ones, and the clients' persistent states (copies from the bank)."""
        net = self._stacked_model(len(client_ids))
        locals_ = [self.client_local(c, global_state) for c in client_ids]
        with torch.no_grad():
            for key, tensor in net.state_dict(keep_vars=True).items():
                if key in self.method.local_keys:
                    tensor.copy_(torch.stack([loc[key] for loc in locals_]))
                else:
                    tensor.copy_(global_state[key].unsqueeze(0).expand_as(tensor))
        return net, locals_

    def query_clients(
        self, server_round: int, client_ids: list[int], query: str, state: dict[str, torch.Tensor]
    ) -> dict[int, dict[str, torch.Tensor]] | None:
        """A method's client query (:meth:`Method.stacked_client_query`) for ``client_ids`` in
        stacked chunks; ``None`` when the method answers only one client at a time."""
        if type(self.method).stacked_client_query is Method.stacked_client_query:
            return None
        answers: dict[int, dict[str, torch.Tensor]] = {}
        data = self.data
        for start in range(0, len(client_ids), self.max_clients):
            chunk = client_ids[start : start + self.max_clients]
            net, locals_ = self._load_chunk(chunk, state)
            indices = [data.client_train[c] for c in chunk]
            ctx = self._context(server_round, chunk, net, indices, state, locals_, 0.0)
            result = self.method.stacked_client_query(query, ctx)
            if result is None:
                return None
            answers.update(zip(chunk, result))
        return answers

    def _context(self, server_round: int, client_ids: list[int], net: nn.Module, indices: list[torch.Tensor],
                 global_state: dict[str, torch.Tensor], locals_: list[dict[str, torch.Tensor]], lr: float) -> StackedClientContext:
        """The context a method's stacked hooks see for a chunk (its rows' samples gathered only
        if a hook reads them)."""
        data = self.data
        feed = self.device_feed and data.train_x.dim() == 4
        return StackedClientContext(
            server_round=server_round, client_ids=list(client_ids), model=net,
            x=ClientRows(data.train_x, indices), y=ClientRows(data.train_y, indices),
            global_state=global_state, local_states=locals_, lr=lr,
            rows=list(indices) if feed else (),
            crop_rows=self._crop_rows if feed else None,
        )

    def _crop_rows(self, rows: Sequence[torch.Tensor], generators: Sequence[torch.Generator], crop: CropFlip
                   ) -> list[torch.Tensor] | None:
        """:attr:`StackedClientContext.crop_rows`: :func:`~fednorm.engine.feed.crop_rows` on the
        training images."""
        return crop_rows(self.data.train_x, rows, generators, padding=crop.padding, fill=crop.fill)

    def _generators(self, server_round: int, client_ids: list[int]) -> list[torch.Generator]:
        """Each client's batch and augmentation stream, the one the sequential executor draws."""
        return [torch_generator(self.seed, "batches", server_round, c) for c in client_ids]

    def _module_seed(self, server_round: int, client_ids: list[int]) -> int:
        """The chunk's seed for module randomness (dropout)."""
        return derive_seed(self.seed, "module-rng-vectorized", server_round, client_ids[0])

    # -- the step's input and checks ---------------------------------------------------------
    def _step_feed(self, client_ids: list[int], plans: list[list[torch.Tensor]], gens: list[torch.Generator]) -> StepFeed | None:
        """The chunk's :class:`~fednorm.engine.feed.StepFeed` (``None``: gather as ``_gather`` does,
        for non-image data or a padded copy over its budget)."""
        data, spec = self.data, self.spec
        if not self.device_feed or data.train_x.dim() != 4:
            return None
        if self._feed_source is None:
            source = crop_source(data.train_x, spec.crop_padding, spec.crop_fill) if spec.augment else data.train_x
            if source is None:
                self.device_feed = False
                return None
            self._feed_source = source
        rows = []
        for c in client_ids:
            if c not in self._host_rows:
                self._host_rows[c] = data.client_train[c].cpu()
            rows.append(self._host_rows[c])
        return StepFeed(self._feed_source, data.train_y, rows, plans, gens, augment=spec.augment, padding=spec.crop_padding,
                        channels_last=spec.channels_last)

    def _train_forward(self, net: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        """The stacked model's training forward: the model itself, or with :attr:`compile_step`
        its ``torch.compile`` (built once per stacked size; a new batch shape recompiles)."""
        if not self.compile_step:
            return net
        key = id(net)
        if key not in self._compiled:
            self._compiled[key] = torch.compile(net)
        return self._compiled[key]

    @staticmethod
    def _note_nonfinite(bad_step: torch.Tensor, losses: torch.Tensor, rows: torch.Tensor | None, t: int) -> None:
        """Mark in ``bad_step`` (``[K]``, 0: none yet) step ``t + 1`` for the rows whose loss is not
        finite (``rows``: the losses' chunk rows, ``None`` for all), on the device: no wait."""
        nonfinite = ~torch.isfinite(losses.detach())
        current = bad_step if rows is None else bad_step.index_select(0, rows)
        marked = torch.where(nonfinite & (current == 0), torch.full_like(current, t + 1), current)
        if rows is None:
            bad_step.copy_(marked)
        else:
            bad_step.index_copy_(0, rows, marked)

    def _check_finite(self, bad_step: torch.Tensor, server_round: int, client_ids: list[int]) -> None:
        """Raise :class:`~fednorm.errors.DivergenceError` for the earliest non-finite step noted in
        ``bad_step`` (its first client; read from the device unless already on the host)."""
        marks = bad_step.cpu()
        if not bool((marks > 0).any()):
            return
        first = int(marks[marks > 0].min())
        row = int((marks == first).nonzero()[0])
        raise DivergenceError(
            f"non-finite training loss at round {server_round}, client {client_ids[row]}, method {self.method.name}, step {first}"
        )

    def _read_chunk(self, bad_step: torch.Tensor, loss_sum: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A chunk's divergence marks and summed losses (float64) on the host, read together once
        its steps are done (one wait for the device instead of two)."""
        book = torch.cat([bad_step.to(loss_sum.dtype), loss_sum]).cpu()
        return book[: len(bad_step)].long(), book[len(bad_step):]

    # -- one round --------------------------------------------------------------------------
    def run_round(
        self, server_round: int, client_ids: list[int], global_state: dict[str, torch.Tensor], lr: float | Sequence[float]
    ) -> ClientUpdates:
        """Train ``client_ids`` for one round; ``lr`` is the round's learning rate, or one per client
        (stacked runs of different learning rates, :mod:`fednorm.engine.stacked_runs`)."""
        parts = []
        self.last_samples_seen = 0
        self.last_traffic = CommTraffic()
        if self.method.requires_lockstep and len(client_ids) > self.max_clients:
            raise ConfigError(lockstep_overflow(self.method.name, len(client_ids), self.max_parallel, self.memory_budget,
                                                self.client_bytes, self.client_copies))
        for start in range(0, len(client_ids), self.max_clients):
            end = start + self.max_clients
            chunk_lr = lr if isinstance(lr, (int, float)) else list(lr)[start:end]
            parts.append(self._run_chunk(server_round, client_ids[start:end], global_state, chunk_lr))
        if len(parts) == 1:
            return parts[0]
        return ClientUpdates(
            client_ids=[c for p in parts for c in p.client_ids],
            states={k: torch.cat([p.states[k] for p in parts]) for k in parts[0].states},
            num_examples=torch.cat([p.num_examples for p in parts]),
            train_loss=torch.cat([p.train_loss for p in parts]),
            num_steps=torch.cat([p.num_steps for p in parts]),
            # per-client uploads, re-padded over the whole round (chunks may differ in steps)
            extras={k: stack_rows([row for p in parts for row in p.extras[k].unbind(0)]) for k in parts[0].extras},
        )

    def _run_chunk(
        self, server_round: int, client_ids: list[int], global_state: dict[str, torch.Tensor], lr: float | list[float]
    ) -> ClientUpdates:
        method, data, spec = self.method, self.data, self.spec
        k = len(client_ids)
        row_lr: torch.Tensor | None = None  # one learning rate per row, when the rows' runs differ in it
        if not isinstance(lr, (int, float)):
            if len(set(lr)) > 1:
                row_lr = to_device(torch.tensor(lr, dtype=torch.float64), data.train_x.device)
            lr = float(lr[0])
        net, locals_ = self._load_chunk(client_ids, global_state)
        net.train()
        # The chunk's tensors: rows = clients. ``cur`` is the working set (all clients at first,
        # then only those that still have batches), so finished clients cost nothing.
        full_params = {n: p for n, p in net.named_parameters() if n in self._trainable}
        full_buffers = dict(net.named_buffers())
        frozen = {n: p for n, p in net.named_parameters() if n not in self._trainable}

        # Each client's batches and augmentation come from its own stream, as in the sequential executor.
        gens = self._generators(server_round, client_ids)
        indices = [data.client_train[c] for c in client_ids]
        sizes = [len(ix) for ix in indices]
        # The plans stay on the host (drawn there, as always); the step feed maps them to rows once.
        plans = [self._batch_plan(n, g, device="cpu") for n, g in zip(sizes, gens)]
        plan_sizes = [[len(b) for b in plan] for plan in plans]
        feed = self._step_feed(client_ids, plans, gens)
        torch.manual_seed(self._module_seed(server_round, client_ids))

        full_momentum: dict[str, torch.Tensor | None] = {n: None for n in full_params}
        dev = data.train_x.device  # index and mask tensors live beside the data (CPU or GPU)
        index_cache: dict[tuple[int, ...], torch.Tensor] = {}

        def positions(values: list[int]) -> torch.Tensor:
            """``values`` as an index tensor on the device, copied once per chunk and set of rows."""
            key = tuple(values)
            if key not in index_cache:
                index_cache[key] = to_device(torch.tensor(values, dtype=torch.long), dev)
            return index_cache[key]

        # Which rows' momentum recursion has begun, on the device for the arithmetic and on the
        # host for the step's branch (reading the device's copy would wait for the device).
        full_started_host = [False] * k
        if spec.dsgd:
            for n, p in full_params.items():
                saved = [loc.get(MOMENTUM_PREFIX + n) for loc in locals_]
                if any(v is not None for v in saved):
                    full_momentum[n] = torch.stack([v if v is not None else torch.zeros_like(p[0]) for v in saved])
            full_started_host = [any(MOMENTUM_PREFIX + n in loc for n in full_params) for loc in locals_]
        full_started = to_device(torch.tensor(full_started_host, dtype=torch.bool), dev)

        rows = list(range(k))  # chunk positions of the working set
        params, buffers, momentum, started = full_params, full_buffers, dict(full_momentum), full_started.clone()
        started_host = list(full_started_host)
        on_net = True  # the working tensors are the stacked model's own

        def write_back() -> None:
            """Store the working set's tensors into the chunk's rows."""
            idx = positions(rows)
            for j, i in enumerate(rows):
                full_started_host[i] = started_host[j]
            with torch.no_grad():
                if not on_net:
                    for n, p in params.items():
                        full_params[n].index_copy_(0, idx, p.detach())
                    for n, b_ in buffers.items():
                        full_buffers[n].index_copy_(0, idx, b_)
                for n, m in momentum.items():
                    if m is not None:
                        if full_momentum[n] is None:
                            full_momentum[n] = torch.zeros_like(full_params[n])
                        full_momentum[n].index_copy_(0, idx, m)
                full_started[idx] = started

        loss_sum = torch.zeros(k, dtype=torch.float64, device=dev)
        # the first local step (1-based) whose loss was not finite, per row (0: none): checked once
        # the chunk's steps are done, so that no step waits for the device
        bad_step = torch.zeros(k, dtype=torch.long, device=dev)
        seen = [0] * k
        steps = [0] * k
        num_steps_max = max((len(p) for p in plans), default=0)
        synced = method.synced_steps(server_round) if method.requires_lockstep else 0
        set_frozen_statistics(net, method.frozen_statistics(server_round))
        ctx = self._context(server_round, client_ids, net, indices, global_state, locals_, lr)
        method.stacked_client_begin(ctx)
        has_loss_term = type(method).stacked_client_loss is not Method.stacked_client_loss
        has_gradient_hook = type(method).stacked_client_gradient is not Method.stacked_client_gradient
        self.comm = self.comm_factory()
        forward = self._train_forward(net)
        for t in range(num_steps_max):
            if t < synced:
                set_client_comm(net, self.comm, backward=method.sync_backward(server_round))
            elif t == synced and synced:
                set_client_comm(net, None)
            active = [i for i in rows if t < len(plans[i])]
            if active != rows:  # some clients ran out of batches: shrink the working set
                write_back()
                rows = active
                idx = positions(rows)
                params = {n: p.detach().index_select(0, idx).requires_grad_(True) for n, p in full_params.items()}
                buffers = {n: b_.index_select(0, idx) for n, b_ in full_buffers.items()}
                momentum = {n: None if m is None else m.index_select(0, idx) for n, m in full_momentum.items()}
                started = full_started.index_select(0, idx)
                started_host = [full_started_host[i] for i in rows]
                on_net = False
            frozen_now = frozen if on_net else {n: f.detach().index_select(0, positions(rows)) for n, f in frozen.items()}
            kw = len(rows)
            groups: dict[int, list[int]] = defaultdict(list)  # batch size -> positions in the working set
            for j, i in enumerate(rows):
                groups[plan_sizes[i][t]].append(j)
            for p in params.values():
                p.grad = None
            if t < synced:
                self._synced_step(net, params, buffers, frozen_now, rows, on_net, plans, indices, gens, t,
                                  loss_sum, seen, steps, server_round, client_ids, lr, momentum, started,
                                  bad_step=bad_step, positions=positions, started_host=started_host)
                started_host = [True] * kw
                if t == synced - 1 and method.reset_momentum_after_sync():
                    momentum = {n: None for n in momentum}
                    started[:] = False
                    started_host = [False] * kw
                if t == synced - 1 and self._split_after_sync(server_round, synced, has_loss_term or has_gradient_hook):
                    set_client_comm(net, None)
                    write_back()
                    self._check_finite(bad_step, server_round, client_ids)  # before the one-by-one steps, as each step did
                    self._train_rest_one_by_one(net, ctx, plans, gens, synced, lr, loss_sum, seen, steps)
                    on_net = True  # the stacked model now holds every client's result (momentum was reset above)
                    break
                continue
            # The step's batches are drawn once: a method's gradient hook (FedSAM) recomputes
            # the loss on the same (augmented) samples.
            step_batches = []
            for bsz, members in groups.items():
                chunk_rows = [rows[j] for j in members]
                x, y = feed.batch(chunk_rows, t) if feed is not None else self._gather(chunk_rows, plans, indices, gens, t)
                step_batches.append((bsz, members, chunk_rows, x, y))
            working = positions(rows)

            def step_loss(record: bool) -> torch.Tensor:
                """The step's loss summed over the working set's clients (each its mean data loss
                plus its client-loss term); ``record`` books it as the step's training loss."""
                total = None
                for bsz, members, chunk_rows, x, y in step_batches:
                    set_forward_clients(net, positions(chunk_rows))
                    if len(members) == kw:
                        logits = forward(x) if on_net else functional_call(net, {**params, **buffers, **frozen_now}, (x,))
                    else:
                        logits = self._subset_forward(net, params, buffers, frozen_now, positions(members), x)
                    kk = len(members)
                    losses = F.cross_entropy(
                        logits.reshape(bsz, kk, -1).transpose(0, 1).reshape(kk * bsz, -1), y, reduction="none"
                    ).view(kk, bsz).mean(dim=1)
                    self._note_nonfinite(bad_step, losses, None if kk == k else positions(chunk_rows), t)
                    if record:
                        weighted = losses.detach().double() * bsz
                        if kk == k:
                            loss_sum.add_(weighted)
                        else:
                            loss_sum.index_add_(0, positions(chunk_rows), weighted)
                        for i in chunk_rows:
                            seen[i] += bsz
                            steps[i] += 1
                    total = losses.sum() if total is None else total + losses.sum()
                if has_loss_term:
                    extra = method.stacked_client_loss(ctx, params, working)
                    if extra is not None:
                        total = total + extra
                return total  # type: ignore[return-value]

            step_loss(record=True).backward()
            if has_gradient_hook:

                def closure() -> None:
                    for p in params.values():
                        p.grad = None
                    step_loss(record=False).backward()

                method.stacked_client_gradient(ctx, params, buffers, working, closure)
            step_lr = lr if row_lr is None else (row_lr if kw == k else row_lr.index_select(0, working))
            self._sgd_step(params, momentum, started, step_lr, started_host=started_host)
            started[:] = True
            started_host = [True] * kw
        marks, loss_sum = self._read_chunk(bad_step, loss_sum)  # the chunk's one wait for the device
        self._check_finite(marks, server_round, client_ids)
        set_client_comm(net, None)
        set_frozen_statistics(net, False)
        set_forward_clients(net, None)
        self.last_traffic += self.comm.traffic
        write_back()
        ctx.num_steps = list(steps)
        method.stacked_client_end(ctx)

        seen_t = torch.tensor(seen, dtype=torch.int64)
        self.last_samples_seen += int(seen_t.sum())
        state = {key: t.detach() for key, t in net.state_dict().items()}
        for i, cid in enumerate(client_ids):
            keep = locals_[i]
            keep.update({key: state[key][i] for key in method.local_keys})
            if spec.dsgd:
                keep.update({MOMENTUM_PREFIX + n: m[i] for n, m in full_momentum.items() if m is not None})
            if keep:
                self.bank.put(cid, keep)
        return ClientUpdates(
            client_ids=list(client_ids),
            states={key: state[key].clone() for key in method.shared_keys},
            num_examples=torch.tensor(sizes, dtype=torch.float64),
            train_loss=torch.where(seen_t > 0, loss_sum / seen_t.clamp(min=1), torch.full_like(loss_sum, float("nan"))),
            num_steps=torch.tensor(steps, dtype=torch.int64),
            extras=stack_uploads(ctx.uploads, list(client_ids)),
        )

    def _split_after_sync(self, server_round: int, synced: int, client_hooks: bool) -> bool:
        """Whether this round's steps after the synchronised ones run client by client: only
        when they are plain local SGD that a fresh optimiser starts (FedTAN's reset after its
        synchronised step), so that nothing stacked has to carry over."""
        return (self.sequential_after_sync and synced > 0 and not client_hooks and not self.spec.dsgd
                and self.method.reset_momentum_after_sync() and not self.method.frozen_statistics(server_round))

    def _train_rest_one_by_one(self, net: nn.Module, ctx: StackedClientContext, plans, gens, start: int, lr: float,
                               loss_sum: torch.Tensor, seen: list[int], steps: list[int]) -> None:
        """Steps ``start..`` of every client of the chunk, one client at a time in a plain model
        (:func:`~fednorm.engine.local.train_local`, a fresh optimiser), continuing each client's
        batch plan and augmentation stream where the stacked steps left them; the results go
        back into the client's rows of the stacked model."""
        if self._plain is None:
            self._plain = copy.deepcopy(self.model)
        plain = self._plain
        stacked = net.state_dict(keep_vars=True)
        dev = self.data.train_x.device
        for i, cid in enumerate(ctx.client_ids):
            rest = [b.to(dev) for b in plans[i][start:]]
            if not rest:
                continue
            with torch.no_grad():
                plain.load_state_dict({key: t[i] for key, t in stacked.items()})
            result = train_local(plain, ctx.x[i], ctx.y[i], rest, lr=lr, spec=self.spec, generator=gens[i],
                                 where=f"round {ctx.server_round}, client {cid}, method {self.method.name}")
            with torch.no_grad():
                for key, value in plain.state_dict().items():
                    stacked[key][i].copy_(value)
            loss_sum[i] += result.loss_sum
            seen[i] += result.num_seen
            steps[i] += result.steps

    def _synced_step(self, net, params, buffers, frozen_now, rows, on_net, plans, indices, gens, t,
                     loss_sum, seen, steps, server_round, client_ids, lr, momentum, started, *,
                     bad_step: torch.Tensor, positions: Callable[[list[int]], torch.Tensor], started_host: list[bool]) -> None:
        """One local step of the working set with BatchNorm synchronised across clients (see
        :mod:`fednorm.engine.lockstep`); batch sizes may differ. A non-finite loss is noted in
        ``bad_step`` (checked once the chunk's steps are done)."""
        batches = [self._gather_samples([i], plans, indices, gens, t) for i in rows]
        working = positions(rows)
        set_forward_clients(net, working)
        xs = [x for x, _ in batches]
        ys = [y for _, y in batches]
        def forward(x):
            return net(x) if on_net else functional_call(net, {**params, **buffers, **frozen_now}, (x,))
        losses, total, p = synced_loss(forward, net, xs, ys, channels_last=self.spec.channels_last,
                                       total_batch=self._round_batch(t, rows, plans))
        self._note_nonfinite(bad_step, losses, working, t)
        total.backward()
        scale_client_grads(params, 1.0 / p)
        counts = torch.tensor([float(len(yb)) for yb in ys], dtype=torch.float64)
        loss_sum.index_add_(0, working, losses.detach().double() * to_device(counts, loss_sum.device))
        for j, i in enumerate(rows):
            seen[i] += len(ys[j])
            steps[i] += 1
        self._sgd_step(params, momentum, started, lr, started_host=started_host)
        started[:] = True

    def _round_batch(self, t: int, rows: list[int] | None = None, plans: list[list[torch.Tensor]] | None = None
                     ) -> int | torch.Tensor | None:
        """Samples at local step ``t`` over all of :attr:`round_clients` (``None`` when this
        executor trains the whole round). Batch sizes follow from the dataset sizes and the
        batch plan alone (the generator only picks which samples), so every process computes
        the same total without an exchange."""
        if self.round_clients is None:
            return None
        total = 0
        for c in self.round_clients:
            sizes = self._batch_sizes(len(self.data.client_train[c]))
            total += sizes[t] if t < len(sizes) else 0
        return total

    def _plan_shape(self) -> dict[str, Any]:
        """The local spec's batch settings, shared by :meth:`_batch_plan` and :meth:`_batch_sizes`."""
        spec = self.spec
        return {"epochs": spec.epochs, "steps": 1 if spec.dsgd else spec.steps, "drop_last": spec.drop_last}

    def _batch_sizes(self, num_samples: int) -> list[int]:
        """The sizes of :meth:`_batch_plan`'s batches for a client of ``num_samples``, drawn from no stream."""
        return batch_sizes(num_samples, self.spec.batch_size, **self._plan_shape())

    def _batch_plan(self, num_samples: int, generator: torch.Generator, device: torch.device | str | None = None) -> list[torch.Tensor]:
        return batch_plan(num_samples, self.spec.batch_size, **self._plan_shape(), generator=generator,
                          device=self.data.train_x.device if device is None else device)

    def _gather_samples(self, members, plans, indices, gens, t):
        """The step-``t`` samples of clients ``members``, concatenated, augmented from each
        client's own stream."""
        data, spec = self.data, self.spec
        rows = torch.cat([indices[i].index_select(0, plans[i][t].to(indices[i].device)) for i in members])
        x = data.train_x.index_select(0, rows)
        y = data.train_y.index_select(0, rows)
        if spec.augment:
            draws = [draw_crop_flip(len(plans[i][t]), padding=spec.crop_padding, generator=gens[i], device=x.device) for i in members]
            top, left, flip = (torch.cat(parts) for parts in zip(*draws))
            x = apply_crop_flip(x, top, left, flip, padding=spec.crop_padding, fill=spec.crop_fill)
        return x, y

    def _gather(self, members, plans, indices, gens, t):
        spec = self.spec
        x, y = self._gather_samples(members, plans, indices, gens, t)
        bsz = len(plans[members[0]][t])
        x = to_client_layout(x.view(len(members), bsz, *x.shape[1:]))
        if spec.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y

    @staticmethod
    def _subset_forward(net, params, buffers, frozen, members: torch.Tensor, x):
        """Forward of some rows of the working set (a step where batch sizes differ; ``members``:
        their positions in it, on the device).

        Parameters are gathered differentiably, so gradients land in the working tensors;
        BatchNorm statistics updated on the gathered copies are written back.
        """
        idx = members
        sub = {n: p.index_select(0, idx) for n, p in params.items()}
        sub_buffers = {n: b.index_select(0, idx) for n, b in buffers.items()}
        sub_frozen = {n: f.index_select(0, idx) for n, f in frozen.items()}
        out = functional_call(net, {**sub, **sub_frozen, **sub_buffers}, (x,))
        with torch.no_grad():
            for n, b in sub_buffers.items():
                buffers[n].index_copy_(0, idx, b)
        return out

    @torch.no_grad()
    def _sgd_step(self, params, momentum, started, lr: float | torch.Tensor, started_host: Sequence[bool] | None = None) -> None:
        """``torch.optim.SGD`` (or DSGD's dampened momentum) for every row of the working set (the
        executor drops a client from it once its batches run out); ``started``: which rows' momentum
        recursion has begun (``started_host``: the same flags on the host, which spares reading the
        device's); ``lr`` a float, or a ``[K]`` tensor of each row's learning rate."""
        if isinstance(lr, torch.Tensor):
            per_row = lr

            def descend(p: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
                return p - step * per_row.view(-1, *([1] * (p.dim() - 1))).to(p.dtype)
        else:

            def descend(p: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
                return torch.add(p, step, alpha=-lr)
        spec = self.spec
        k = len(started)
        if spec.agc_clip:  # per client and unit (the client axis kept apart)
            adaptive_grad_clip_([p for n, p in params.items() if n not in spec.agc_skip], spec.agc_clip, lead=1)
        if spec.max_grad_norm is not None:
            norms = torch.stack([
                torch.linalg.vector_norm(p.grad.reshape(k, -1), dim=1) if p.grad is not None else p.new_zeros(k)
                for p in params.values()
            ])
            total = torch.linalg.vector_norm(norms, dim=0)
            coef = (spec.max_grad_norm / (total + 1e-6)).clamp(max=1.0)
            for p in params.values():
                if p.grad is not None:
                    p.grad.mul_(coef.view(k, *([1] * (p.dim() - 1))).to(p.dtype))
        beta = spec.momentum
        if started_host is None:
            started_host = [bool(v) for v in started.tolist()]
        if all(started_host) or not any(started_host):
            # Fast path: every client steps and all are at the same point of the momentum recursion.
            first = not any(started_host)
            if beta and not first and not spec.dsgd and not spec.weight_decay and all(
                    p.grad is not None and momentum[n] is not None for n, p in params.items()):
                # the common step, as torch.optim.SGD's foreach kernels: three calls for all tensors
                ms = [momentum[n] for n in params]
                torch._foreach_mul_(ms, beta)
                torch._foreach_add_(ms, [p.grad for p in params.values()])
                if isinstance(lr, torch.Tensor):
                    torch._foreach_sub_(list(params.values()), [m * lr.view(-1, *([1] * (m.dim() - 1))).to(m.dtype) for m in ms])
                else:
                    torch._foreach_add_(list(params.values()), ms, alpha=-lr)
                return
            for name, p in params.items():
                g = p.grad if p.grad is not None else torch.zeros_like(p)
                if spec.weight_decay:
                    g = g.add(p, alpha=spec.weight_decay)
                if spec.dsgd:
                    prev = momentum[name]
                    m = g.clone() if beta == 0 else ((1 - beta) * g if first or prev is None else beta * prev + (1 - beta) * g)
                    momentum[name] = m
                    g = m
                elif beta:
                    prev = momentum[name]
                    if first or prev is None:
                        momentum[name] = g = g.clone()
                    else:
                        g = prev.mul_(beta).add_(g)
                if isinstance(lr, torch.Tensor):
                    p.copy_(descend(p, g))
                else:
                    p.add_(g, alpha=-lr)
            return
        # Rows at different points of the momentum recursion (a client whose first step this is)
        for name, p in params.items():
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            shape = (k, *([1] * (p.dim() - 1)))
            if spec.weight_decay:
                g = g.add(p, alpha=spec.weight_decay)
            if spec.dsgd:
                prev = momentum[name]
                first = (~started).view(shape)
                if prev is None:
                    prev = torch.zeros_like(p)
                momentum[name] = g.clone() if beta == 0 else torch.where(first, (1 - beta) * g, beta * prev + (1 - beta) * g)
                step = momentum[name]
            elif beta:
                prev = momentum[name]
                momentum[name] = g.clone() if prev is None else torch.where((~started).view(shape), g, prev * beta + g)
                step = momentum[name]
            else:
                step = g
            p.copy_(descend(p, step))
