"""Compose any method with a client optimizer and a server optimizer.

``compose(HBN(), Scaffold(), FedYogi())`` is one :class:`~fednorm.methods.base.Method`: its client
hooks call the wrapped method's hook and then the client optimizer's; its ``aggregate`` runs the
wrapped method's aggregation, lets the client optimizer update its server state (SCAFFOLD's
``c``), then moves the learnable parameters with the server optimizer while every buffer (BN
statistics, counters, HBN's pooled statistics) keeps its aggregated value. Everything else (what
stays local, personalized evaluation, HBN's evaluation protocol, the report) is the wrapped
method's.

A hook is overridden only when the wrapped method or the client optimizer uses it, so a server
optimizer alone keeps a method on the vectorized executor; a client optimizer keeps it there when
it has a stacked form of its hooks (every built-in one has).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..methods.base import ClientContext, ClientUpdates, Method, ServerView, StackedClientContext
from ..methods.registry import get_method
from .client import ClientOptimizer, NoClientOptimizer, get_client_optimizer
from .server import NoServerOptimizer, ServerOptimizer, get_server_optimizer

if TYPE_CHECKING:  # pragma: no cover
    from ..config import ExperimentConfig
    from ..data.transforms import CropFlip

__all__ = ["OptimizedMethod", "compose", "build_method"]


class OptimizedMethod(Method):
    """A method run with a client optimizer and a server optimizer (build it with :func:`compose`).

    Attributes:
        inner: the wrapped method; ``name``, ``personalized`` and the shared/local split are its.
        client_opt, server_opt: the optimizers.
        param_keys: shared keys of learnable parameters, the only ones the server optimizer moves.
    """

    def __init__(
        self, inner: Method, client_opt: ClientOptimizer, server_opt: ServerOptimizer, num_clients: int, local_momentum: float = 0.0
    ) -> None:
        super().__init__()
        self.local_momentum = local_momentum
        self.inner = inner
        self.client_opt = client_opt
        self.server_opt = server_opt
        self.num_clients = num_clients
        self.name = inner.name  # type: ignore[misc]  # the norm layers' requires_method checks this
        self.personalized = inner.personalized  # type: ignore[misc]
        self.requires_lockstep = inner.requires_lockstep  # type: ignore[misc]
        self.param_keys: list[str] = []

    # -- model policy -----------------------------------------------------------------------
    def setup(self, model: nn.Module) -> None:
        self.inner.setup(model)
        self.state_keys = list(self.inner.state_keys)
        self.local_keys = set(self.inner.local_keys)
        self.shared_keys = list(self.inner.shared_keys)
        self.dropped_keys = list(self.inner.dropped_keys)
        self.policy = self.inner.policy
        params = {n for n, _ in model.named_parameters()}
        self.param_keys = [k for k in self.shared_keys if k in params]
        self.client_opt.setup(model, self.inner, self.num_clients, self.local_momentum)

    def select_local_keys(self, model: nn.Module) -> set[str]:
        return self.inner.select_local_keys(model)

    def initial_client_state(self, client_id: int, global_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.inner.initial_client_state(client_id, global_state)

    # -- client hooks: installed per instance by compose() where needed -----------------------
    def _begin(self, ctx: ClientContext) -> None:
        if self.client_opt.begin_first:
            self.client_opt.begin(ctx)
        self.inner.client_begin(ctx)
        if not self.client_opt.begin_first:
            self.client_opt.begin(ctx)

    def _gradient(self, ctx: ClientContext, model: nn.Module, closure: Any) -> None:
        self.inner.client_gradient(ctx, model, closure)
        self.client_opt.gradient(ctx, model, closure)

    def _loss(self, ctx: ClientContext, model: nn.Module, loss: torch.Tensor) -> torch.Tensor:
        return self.client_opt.loss(ctx, model, self.inner.client_loss(ctx, model, loss))

    def _end(self, ctx: ClientContext) -> None:
        self.inner.client_end(ctx)
        self.client_opt.end(ctx)

    # The stacked hooks: the wrapped method's, then the client optimizer's stacked form (a
    # client optimizer without one keeps the composition off the vectorized executor).
    def _stacked_begin(self, ctx: StackedClientContext) -> None:
        first = self.client_opt.uses_begin and self.client_opt.begin_first
        if first:
            self.client_opt.stacked_begin(ctx)
        self.inner.stacked_client_begin(ctx)
        if self.client_opt.uses_begin and not first:
            self.client_opt.stacked_begin(ctx)

    def _stacked_loss(
        self, ctx: StackedClientContext, params: dict[str, torch.Tensor], rows: torch.Tensor
    ) -> torch.Tensor | None:
        terms = [t for t in (self.inner.stacked_client_loss(ctx, params, rows),
                             self.client_opt.stacked_loss(ctx, params, rows) if self.client_opt.uses_loss else None)
                 if t is not None]
        return sum(terms[1:], terms[0]) if terms else None

    def _stacked_gradient(
        self, ctx: StackedClientContext, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
        rows: torch.Tensor, closure: Any,
    ) -> None:
        self.inner.stacked_client_gradient(ctx, params, buffers, rows, closure)
        if self.client_opt.uses_gradient:
            self.client_opt.stacked_gradient(ctx, params, buffers, rows, closure)

    def _stacked_end(self, ctx: StackedClientContext) -> None:
        self.inner.stacked_client_end(ctx)
        if self.client_opt.uses_end:
            self.client_opt.stacked_end(ctx)

    # -- server -----------------------------------------------------------------------------
    def configure_round(self, server_round: int, client_ids: list[int]) -> None:
        self.inner.configure_round(server_round, client_ids)

    def client_weights(self, updates: ClientUpdates) -> torch.Tensor:
        return self.inner.client_weights(updates)

    def aggregate(
        self, server_round: int, global_state: dict[str, torch.Tensor], updates: ClientUpdates
    ) -> dict[str, torch.Tensor]:
        new = self.inner.aggregate(server_round, global_state, updates)
        self.client_opt.server_update(server_round, updates)
        params = {k: new[k] for k in self.param_keys if k in new}
        new.update(self.server_opt.step(global_state, params))  # buffers keep the aggregated value
        self.client_opt.server_moved(server_round, global_state, new)
        return new

    def evaluation_state(self, sim: ServerView) -> dict[str, torch.Tensor]:
        return self.inner.evaluation_state(sim)

    def report(self, sim: ServerView) -> dict[str, Any]:
        return self.inner.report(sim)

    def comm_rounds_per_round(self, model: nn.Module) -> int:
        return self.inner.comm_rounds_per_round(model)

    def extra_bytes_per_client(self, model: nn.Module) -> tuple[int, int]:
        up, down = self.inner.extra_bytes_per_client(model)
        return up, down + self.client_opt.download_bytes()  # uploads (e.g. SCAFFOLD's delta c) are counted from ctx.uploads

    def statistics_keys(self) -> dict[str, list[str]]:
        return self.inner.statistics_keys()

    def initial_state(self, sim: ServerView) -> dict[str, torch.Tensor] | None:
        return self.inner.initial_state(sim)

    def final_state(self, sim: ServerView) -> dict[str, torch.Tensor] | None:
        return self.inner.final_state(sim)

    def client_query(self, query: str, ctx: ClientContext) -> dict[str, torch.Tensor]:
        return self.inner.client_query(query, ctx)

    def stacked_client_query(self, query: str, ctx: StackedClientContext) -> list[dict[str, torch.Tensor]] | None:
        return self.inner.stacked_client_query(query, ctx)

    # -- lockstep execution: the wrapped method's -------------------------------------------
    def synced_steps(self, server_round: int) -> int:
        return self.inner.synced_steps(server_round)

    def sync_backward(self, server_round: int) -> bool:
        return self.inner.sync_backward(server_round)

    def reset_momentum_after_sync(self) -> bool:
        return self.inner.reset_momentum_after_sync()

    def frozen_statistics(self, server_round: int) -> bool:
        return self.inner.frozen_statistics(server_round)

    @property
    def seed(self) -> int:  # type: ignore[override]
        return self.inner.seed

    @seed.setter
    def seed(self, value: int) -> None:
        self.inner.seed = value

    @property
    def train_augmentation(self) -> CropFlip | None:  # type: ignore[override]
        return self.inner.train_augmentation

    @train_augmentation.setter
    def train_augmentation(self, value: CropFlip | None) -> None:
        self.inner.train_augmentation = value

    @property
    def channels_last(self) -> bool:  # type: ignore[override]
        return self.inner.channels_last

    @channels_last.setter
    def channels_last(self, value: bool) -> None:
        self.inner.channels_last = value

    # -- checkpointing ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "method": self.inner.state_dict(),
            "client_opt": self.client_opt.state_dict(),
            "server_opt": self.server_opt.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state.get("method", {}))
        self.client_opt.load_state_dict(state.get("client_opt", {}))
        self.server_opt.load_state_dict(state.get("server_opt", {}))

    # -- reporting --------------------------------------------------------------------------
    def hparams(self) -> dict[str, Any]:
        return self.inner.hparams()

    def summary(self) -> str:
        parts = [self.inner.summary()]
        for opt in (self.client_opt, self.server_opt):
            if opt.name != "none":
                hp = ", ".join(f"{k}={v}" for k, v in opt.hparams().items())
                parts.append(f"{opt.name}({hp})")
        return " + ".join(parts)


def _overrides(method: Method, hook: str) -> bool:
    return getattr(type(method), hook) is not getattr(Method, hook)


def compose(
    method: Method,
    client_opt: ClientOptimizer | None = None,
    server_opt: ServerOptimizer | None = None,
    *,
    num_clients: int,
    local_momentum: float = 0.0,
) -> Method:
    """``method`` with a client and a server optimizer; ``method`` itself when both are none.

    Args:
        method: any method (not yet set up).
        client_opt: FedProx, SCAFFOLD, MOON or None.
        server_opt: FedAvgM, FedAdam, FedYogi or None.
        num_clients: N, SCAFFOLD's ``|S|/N`` scaling of the control-variate update.
        local_momentum: the clients' SGD momentum (SCAFFOLD's momentum-aware update).
    """
    client_opt = client_opt or NoClientOptimizer()
    server_opt = server_opt or NoServerOptimizer()
    if client_opt.name == "none" and server_opt.name == "none":
        return method
    hooks: dict[str, Any] = {}
    for hook, impl, used in (
        ("client_begin", OptimizedMethod._begin, client_opt.uses_begin),
        ("client_loss", OptimizedMethod._loss, client_opt.uses_loss),
        ("client_end", OptimizedMethod._end, client_opt.uses_end),
        ("client_gradient", OptimizedMethod._gradient, client_opt.uses_gradient),
    ):
        if used or _overrides(method, hook):
            hooks[hook] = impl
    for hook, impl, used in (
        ("stacked_client_begin", OptimizedMethod._stacked_begin, client_opt.uses_begin),
        ("stacked_client_loss", OptimizedMethod._stacked_loss, client_opt.uses_loss),
        ("stacked_client_end", OptimizedMethod._stacked_end, client_opt.uses_end),
        ("stacked_client_gradient", OptimizedMethod._stacked_gradient, client_opt.uses_gradient),
    ):
        if (used and client_opt.stacked) or (not used and _overrides(method, hook)):
            hooks[hook] = impl
    # The executors decide by the class's hooks (vectorization_blockers, has_client_loss), so
    # the composition is a class with exactly the hooks it needs; it stacks across runs when
    # both parts do (a method without client hooks always does).
    inner_hooks = any(_overrides(method, h) for h in ("client_begin", "client_end", "client_loss", "client_gradient",
                                                      "stacked_client_begin", "stacked_client_end",
                                                      "stacked_client_loss", "stacked_client_gradient"))
    hooks["stacks_across_runs"] = ((not client_opt.uses_begin and not client_opt.uses_loss and not client_opt.uses_end
                                    and not client_opt.uses_gradient) or client_opt.stacks_across_runs) and (
        not inner_hooks or type(method).stacks_across_runs)
    cls = type(f"Optimized{type(method).__name__}", (OptimizedMethod,), hooks)
    return cls(method, client_opt, server_opt, num_clients, local_momentum)


def build_method(config: "ExperimentConfig") -> Method:
    """The method of an experiment: ``method`` with ``client_opt`` and ``server_opt`` (and their args)."""
    method = get_method(config.method, **config.method_args)
    method.set_policy(config.buffers, config.affine)  # --buffers / --affine (fednorm/methods/policy.py)
    return compose(
        method,
        get_client_optimizer(config.client_opt, **config.client_opt_args),
        get_server_optimizer(config.server_opt, **config.server_opt_args),
        num_clients=config.num_clients,
        local_momentum=0.0 if config.dsgd else config.momentum,  # DSGD's persistent momentum is an average, not heavy ball
    )
