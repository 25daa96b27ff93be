"""Executors run one round's local training for the sampled clients.

The sequential executor reuses one working model for every client (no deep copies): it loads
the global shared tensors and the client's own tensors from the bank, trains, and writes the
shared result into a stacked ``[K, ...]`` buffer, which is what methods aggregate over.
"""

from __future__ import annotations

import time
import warnings

import torch
from torch import nn

from ..data.federated import FederatedData
from ..errors import DivergenceError, InconsistentUpdateError
from ..methods.base import ClientUpdates, Method, stack_rows
from .bank import ClientStateBank
from .client_rows import LazyClientContext
from .local import LocalResult, LocalSpec, batch_plan, read_losses, small_clients_message, train_local
from .rng import derive_seed, torch_generator

__all__ = ["Executor", "SequentialExecutor", "MOMENTUM_PREFIX", "stack_uploads"]

MOMENTUM_PREFIX = "dsgd.momentum."


class Executor:
    """Shared by executors: where a client's state comes from."""

    name = "base"

    def __init__(
        self,
        model: nn.Module,
        method: Method,
        data: FederatedData,
        bank: ClientStateBank,
        spec: LocalSpec,
        seed: int,
    ) -> None:
        self.model = model
        self.method = method
        self.data = data
        self.bank = bank
        self.spec = spec
        self.seed = seed
        self.last_samples_seen = 0
        # Said once per run (an executor is built once; the vectorized one checks what can fail first).
        message = small_clients_message([len(idx) for idx in data.client_train], spec.batch_size)
        if message is not None:
            warnings.warn(message, stacklevel=3)

    def client_local(self, client_id: int, global_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The client's persistent state: from the bank, or the method's initial state."""
        local = self.bank.get(client_id)
        if local is None:
            local = self.method.initial_client_state(client_id, global_state)
        return dict(local)

    def client_state(self, client_id: int, global_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Full model state of a client: global shared tensors plus its own local ones."""
        state = dict(global_state)
        if self.method.local_keys:
            local = self.client_local(client_id, global_state)
            state.update({k: local[k] for k in self.method.local_keys})
        return state


class SequentialExecutor(Executor):
    """Trains clients one after another on a shared working model."""

    name = "sequential"

    def run_round(
        self, server_round: int, client_ids: list[int], global_state: dict[str, torch.Tensor], lr: float
    ) -> ClientUpdates:
        """Train ``client_ids`` one by one. A client whose training raises (other than a
        divergence, which stops the run) is left out of the updates and listed in ``failures``.

        The clients' step losses stay on the device until the round's clients are trained, then
        are read in one copy (:func:`~fednorm.engine.local.read_losses`): the same sums, and the
        first diverged client's DivergenceError, raised after the round's training instead of
        after that client's."""
        method = self.method
        rows: list[dict[str, torch.Tensor]] = []
        kept: list[int] = []
        stats: list[tuple[float, LocalResult, int, float]] = []
        uploads: list[dict[str, torch.Tensor]] = []
        failures: dict[int, str] = {}
        self.last_samples_seen = 0
        for cid in client_ids:
            start = time.perf_counter()
            try:
                row, upload, n, result = self._train_client(server_round, cid, global_state, lr)
            except (DivergenceError, KeyboardInterrupt):
                read_losses([s[1] for s in stats])  # an earlier client's divergence comes first
                raise
            except Exception as exc:  # a crashing client is dropped from the round, not the run
                failures[cid] = f"{type(exc).__name__}: {exc}"
                continue
            rows.append(row)
            kept.append(cid)
            uploads.append(upload)
            stats.append((n, result, result.steps, time.perf_counter() - start))
        read_losses([s[1] for s in stats])  # the round's one read of its losses
        states = {
            key: torch.stack([r[key] for r in rows]) if rows else global_state[key].new_empty((0, *global_state[key].shape))
            for key in method.shared_keys
        }
        col = list(zip(*stats)) if stats else [(), (), (), ()]
        return ClientUpdates(
            client_ids=kept,
            states=states,
            num_examples=torch.tensor(col[0], dtype=torch.float64),
            train_loss=torch.tensor([r.mean_loss for r in col[1]], dtype=torch.float64),
            num_steps=torch.tensor(col[2], dtype=torch.int64),
            extras=stack_uploads(uploads, kept),
            failures=failures,
            seconds=torch.tensor(col[3], dtype=torch.float64),
        )

    def _train_client(
        self, server_round: int, cid: int, global_state: dict[str, torch.Tensor], lr: float
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int, LocalResult]:
        method, model, data, spec = self.method, self.model, self.data, self.spec
        local = self.client_local(cid, global_state)
        model_state = dict(global_state)
        model_state.update({key: local[key] for key in method.local_keys})
        model.load_state_dict(model_state)
        idx = data.client_train[cid]
        n = len(idx)
        ctx = LazyClientContext(  # x, y gathered only if a method reads them; training reads the dataset
            data.train_x, data.train_y, idx,
            server_round=server_round,
            client_id=cid,
            model=model,
            global_state=global_state,
            local_state=local,
            lr=lr,
        )
        gen = torch_generator(self.seed, "batches", server_round, cid)
        plan = batch_plan(
            n, spec.batch_size, epochs=spec.epochs, steps=1 if spec.dsgd else spec.steps,
            drop_last=spec.drop_last, generator=gen, device=data.train_x.device,
        )
        # Dropout and any other module randomness draw from the global RNG: seed it per client.
        torch.manual_seed(derive_seed(self.seed, "module-rng", server_round, cid))
        method.client_begin(ctx)
        momentum = {n_[len(MOMENTUM_PREFIX):]: v for n_, v in local.items() if n_.startswith(MOMENTUM_PREFIX)}
        result = train_local(
            model, data.train_x, data.train_y, [idx.index_select(0, b) for b in plan],  # batches as dataset rows
            lr=lr, spec=spec, generator=gen, momentum=momentum or None,
            loss_hook=(lambda m, loss: method.client_loss(ctx, m, loss)) if method.has_client_loss else None,
            grad_hook=(lambda m, closure: method.client_gradient(ctx, m, closure)) if method.has_client_gradient else None,
            where=f"round {server_round}, client {cid}, method {method.name}", read=False,
        )
        method.client_end(ctx)
        self.last_samples_seen += result.num_seen
        state = model.state_dict()
        row = {key: state[key].detach().clone() for key in method.shared_keys}
        ctx.local_state.update({key: state[key] for key in method.local_keys})
        if result.momentum is not None:
            ctx.local_state.update({MOMENTUM_PREFIX + n_: v for n_, v in result.momentum.items()})
        if ctx.local_state:
            self.bank.put(cid, ctx.local_state)
        return row, ctx.uploads, n, result


def stack_uploads(uploads: list[dict[str, torch.Tensor]], client_ids: list[int]) -> dict[str, torch.Tensor]:
    """Stack the clients' extra uploads over a client axis; every client must send the same keys."""
    if not uploads or not uploads[0]:
        if any(uploads):
            raise InconsistentUpdateError("some clients uploaded extra tensors and others did not")
        return {}
    keys = set(uploads[0])
    for cid, up in zip(client_ids, uploads):
        if set(up) != keys:
            raise InconsistentUpdateError(f"client {cid} uploaded {sorted(up)}, expected {sorted(keys)}")
    return {key: stack_rows([up[key].detach() for up in uploads]) for key in sorted(keys)}
