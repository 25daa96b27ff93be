"""The vectorized executor: a round's clients trained together as a client dimension.

The clients of a round (in chunks of at most ``max_clients``) are loaded into one stacked model
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

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from ..data.federated import FederatedData
from ..data.transforms import apply_crop_flip, draw_crop_flip
from ..errors import DivergenceError
from ..methods.base import ClientUpdates, Method
from ..nn.stacked import NotStackableError, stack_model, to_client_layout
from .bank import ClientStateBank
from .executor import MOMENTUM_PREFIX, Executor
from .local import LocalSpec, batch_plan
from .rng import derive_seed, torch_generator

__all__ = ["VectorizedExecutor", "vectorization_blockers"]


def vectorization_blockers(method: Method, spec: LocalSpec) -> list[str]:
    """Reasons why a method/settings combination cannot run vectorized (empty when it can)."""
    reasons = []
    for hook in ("client_begin", "client_end", "client_loss"):
        if getattr(type(method), hook) is not getattr(Method, hook) and not getattr(method, "vectorized_hooks", False):
            reasons.append(f"method '{method.name}' overrides {hook}")
    if method.requires_lockstep:
        reasons.append(f"method '{method.name}' needs cross-client reductions, not yet wired into the executor")
    return reasons


class VectorizedExecutor(Executor):
    """Trains a round's clients together in a stacked model (see the module docstring).

    Args:
        model: the base model (its structure; its values are not used).
        method, data, bank, spec, seed: as for :class:`~fednorm.engine.executor.SequentialExecutor`.
        max_clients: the most clients held in one stacked model.
        memory_budget: bytes allowed for the stacked parameters, gradients and optimiser state
            (default 2 GiB); lowers ``max_clients`` for large models (ResNet-18: 11 clients).

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
        memory_budget: int = 2 << 30,
    ) -> None:
        blockers = vectorization_blockers(method, spec)
        if blockers:
            raise NotStackableError("; ".join(blockers))
        self.model = model
        self.method = method
        self.data = data
        self.bank = bank
        self.spec = spec
        self.seed = seed
        # Parameters, gradients and momentum of K clients live at once: cap K by a memory budget.
        model_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        self.max_clients = max(1, min(max_clients, memory_budget // max(1, 4 * model_bytes)))
        self.last_samples_seen = 0
        self._stacked: dict[int, nn.Module] = {}
        # Verify once with two clients: the check does not depend on K.
        example = data.train_x[: min(4, len(data.train_x))]
        if len(example) < 2:
            raise NotStackableError("need at least two training samples to verify the stacked model")
        stack_model(model, 2, example_input=example)
        self._trainable = {name for name, p in model.named_parameters() if p.requires_grad}

    # -- state movement ---------------------------------------------------------------------
    def _stacked_model(self, k: int) -> nn.Module:
        if k not in self._stacked:
            self._stacked[k] = stack_model(self.model, k, verify=False)
        return self._stacked[k]

    # -- one round --------------------------------------------------------------------------
    def run_round(
        self, server_round: int, client_ids: list[int], global_state: dict[str, torch.Tensor], lr: float
    ) -> ClientUpdates:
        parts = []
        self.last_samples_seen = 0
        for start in range(0, len(client_ids), self.max_clients):
            parts.append(self._run_chunk(server_round, client_ids[start : start + self.max_clients], global_state, lr))
        if len(parts) == 1:
            return parts[0]
        return ClientUpdates(
            client_ids=[c for p in parts for c in p.client_ids],
            states={k: torch.cat([p.states[k] for p in parts]) for k in parts[0].states},
            num_examples=torch.cat([p.num_examples for p in parts]),
            train_loss=torch.cat([p.train_loss for p in parts]),
            num_steps=torch.cat([p.num_steps for p in parts]),
        )

    def _run_chunk(
        self, server_round: int, client_ids: list[int], global_state: dict[str, torch.Tensor], lr: float
    ) -> ClientUpdates:
        method, data, spec = self.method, self.data, self.spec
        k = len(client_ids)
        net = self._stacked_model(k)
        net.train()
        locals_ = [self.client_local(c, global_state) for c in client_ids]
        with torch.no_grad():
            for key, tensor in net.state_dict(keep_vars=True).items():
                if key in method.local_keys:
                    tensor.copy_(torch.stack([loc[key] for loc in locals_]))
                else:
                    tensor.copy_(global_state[key].unsqueeze(0).expand_as(tensor))
        params = {n: p for n, p in net.named_parameters() if n in self._trainable}
        buffers = dict(net.named_buffers())

        # Each client's batches and augmentation come from its own stream, as in the sequential executor.
        gens = [torch_generator(self.seed, "batches", server_round, c) for c in client_ids]
        indices = [data.client_train[c] for c in client_ids]
        sizes = [len(ix) for ix in indices]
        plans = [
            batch_plan(n, spec.batch_size, epochs=spec.epochs, steps=1 if spec.dsgd else spec.steps,
                       drop_last=spec.drop_last, generator=g)
            for n, g in zip(sizes, gens)
        ]
        torch.manual_seed(derive_seed(self.seed, "module-rng-vectorized", server_round, client_ids[0]))

        momentum: dict[str, torch.Tensor | None] = {n: None for n in params}
        started = torch.zeros(k, dtype=torch.bool)
        if spec.dsgd:
            for n, p in params.items():
                saved = [loc.get(MOMENTUM_PREFIX + n) for loc in locals_]
                if any(s is not None for s in saved):
                    momentum[n] = torch.stack([s if s is not None else torch.zeros_like(p[0]) for s in saved])
            started = torch.tensor([any(MOMENTUM_PREFIX + n in loc for n in params) for loc in locals_])

        loss_sum = torch.zeros(k, dtype=torch.float64)
        seen = torch.zeros(k, dtype=torch.int64)
        steps = torch.zeros(k, dtype=torch.int64)
        num_steps_max = max((len(p) for p in plans), default=0)
        for t in range(num_steps_max):
            groups: dict[int, list[int]] = defaultdict(list)
            for i, plan in enumerate(plans):
                if t < len(plan):
                    groups[len(plan[t])].append(i)
            active = torch.zeros(k, dtype=torch.bool)
            for p in params.values():
                p.grad = None
            total = None
            for bsz, members in groups.items():
                x, y = self._gather(members, plans, indices, gens, t)
                if len(members) == k:
                    logits = net(x)
                else:
                    logits = self._subset_forward(net, params, buffers, members, x)
                kk = len(members)
                losses = F.cross_entropy(
                    logits.reshape(bsz, kk, -1).transpose(0, 1).reshape(kk * bsz, -1), y, reduction="none"
                ).view(kk, bsz).mean(dim=1)
                if not torch.isfinite(losses).all():
                    bad = members[int((~torch.isfinite(losses)).nonzero()[0])]
                    raise DivergenceError(
                        f"non-finite training loss at round {server_round}, client {client_ids[bad]}, "
                        f"method {method.name}, step {t + 1}"
                    )
                idx = torch.tensor(members)
                loss_sum[idx] += losses.detach().double() * bsz
                seen[idx] += bsz
                steps[idx] += 1
                active[idx] = True
                total = losses.sum() if total is None else total + losses.sum()
            total.backward()  # type: ignore[union-attr]
            self._sgd_step(params, momentum, started, active, lr)
            started |= active

        self.last_samples_seen += int(seen.sum())
        state = {key: t.detach() for key, t in net.state_dict().items()}
        for i, cid in enumerate(client_ids):
            keep = locals_[i]
            keep.update({key: state[key][i] for key in method.local_keys})
            if spec.dsgd:
                keep.update({MOMENTUM_PREFIX + n: m[i] for n, m in momentum.items() if m is not None})
            if keep:
                self.bank.put(cid, keep)
        return ClientUpdates(
            client_ids=list(client_ids),
            states={key: state[key].clone() for key in method.shared_keys},
            num_examples=torch.tensor(sizes, dtype=torch.float64),
            train_loss=torch.where(seen > 0, loss_sum / seen.clamp(min=1), torch.full_like(loss_sum, float("nan"))),
            num_steps=steps,
        )

    def _gather(self, members, plans, indices, gens, t):
        data, spec = self.data, self.spec
        rows = torch.cat([indices[i].index_select(0, plans[i][t]) for i in members])
        x = data.train_x.index_select(0, rows)
        y = data.train_y.index_select(0, rows)
        if spec.augment:
            draws = [draw_crop_flip(len(plans[i][t]), padding=spec.crop_padding, generator=gens[i], device=x.device) for i in members]
            top, left, flip = (torch.cat(parts) for parts in zip(*draws))
            x = apply_crop_flip(x, top, left, flip, padding=spec.crop_padding)
        bsz = len(plans[members[0]][t])
        return to_client_layout(x.view(len(members), bsz, *x.shape[1:])), y

    @staticmethod
    def _subset_forward(net, params, buffers, members, x):
        """Forward of a subset of the stacked clients; BN statistics are written back to the full buffers."""
        idx = torch.tensor(members)
        sub = {n: p.index_select(0, idx) for n, p in params.items()}
        sub_buffers = {n: b.index_select(0, idx) for n, b in buffers.items()}
        frozen = {n: p.detach().index_select(0, idx) for n, p in net.named_parameters() if n not in params}
        out = functional_call(net, {**sub, **frozen, **sub_buffers}, (x,))
        with torch.no_grad():
            for n, b in sub_buffers.items():
                buffers[n].index_copy_(0, idx, b)
        return out

    @torch.no_grad()
    def _sgd_step(self, params, momentum, started, active, lr):
        """``torch.optim.SGD`` (or DSGD's dampened momentum) for the active clients only."""
        spec = self.spec
        k = len(active)
        if spec.max_grad_norm is not None:
            norms = torch.stack([
                torch.linalg.vector_norm(p.grad.reshape(k, -1), dim=1) if p.grad is not None else torch.zeros(k, dtype=p.dtype)
                for p in params.values()
            ])
            total = torch.linalg.vector_norm(norms, dim=0)
            coef = (spec.max_grad_norm / (total + 1e-6)).clamp(max=1.0)
            for p in params.values():
                if p.grad is not None:
                    p.grad.mul_(coef.view(k, *([1] * (p.dim() - 1))).to(p.dtype))
        for name, p in params.items():
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            shape = (k, *([1] * (p.dim() - 1)))
            mask = active.view(shape)
            if spec.weight_decay:
                g = g.add(p, alpha=spec.weight_decay)
            beta = spec.momentum
            if spec.dsgd:
                prev = momentum[name]
                first = (~started).view(shape)
                if prev is None:
                    prev = torch.zeros_like(p)
                new_m = g.clone() if beta == 0 else torch.where(first, (1 - beta) * g, beta * prev + (1 - beta) * g)
                momentum[name] = torch.where(mask, new_m, prev)
                step = momentum[name]
            elif beta:
                prev = momentum[name]
                if prev is None:
                    new_m = g.clone()
                else:
                    new_m = torch.where((~started).view(shape), g, prev.mul(beta).add_(g))
                momentum[name] = new_m if prev is None else torch.where(mask, new_m, prev)
                step = momentum[name]
            else:
                step = g
            p.copy_(torch.where(mask, torch.add(p, step, alpha=-lr), p))
