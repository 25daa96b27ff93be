"""Client-side FL optimizers: FedProx, SCAFFOLD and MOON, as add-ons to any method.

A client optimizer changes what a client minimises or remembers, never what is shared: it acts
through the method hooks (``begin`` before local training, ``loss`` on each step's data loss,
``end`` after training) and, on the server, ``server_update`` after aggregation. The composition
in :mod:`fednorm.optim.compose` calls them after the wrapped method's own hooks, so FedProx or
SCAFFOLD runs unchanged on top of FedAvg, FedBN or HBN.

Which tensors they touch: the trainable parameters. SCAFFOLD corrects only *shared* parameters
(a client-local parameter, such as FedBN's BN affine or HBN's alpha, has no server model to
drift from); FedProx anchors every trainable parameter to its value at the start of the round
(for local parameters, the client's own previous value).
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from ..errors import ConfigError
from ..methods.base import ClientContext, ClientUpdates, Method, StackedClientContext
from ..nn.stacked import forward_clients, stack_model
from ..registry import Registry
from .checks import check_number


def head_name(model: nn.Module, optimizer: str) -> str:
    """The module name of ``model``'s classifier (:func:`fednorm.nn.classifier_head`: ``model.head``,
    else its last ``nn.Linear``), whose input is the penultimate feature vector a client objective
    reads; the same name finds it in the stacked copy (:func:`fednorm.nn.stacked.stack_model`
    keeps module names). A model without one is refused in one line."""
    from ..nn.state import classifier_head

    try:
        head = classifier_head(model)
    except ValueError:
        raise ConfigError(f"client optimizer '{optimizer}' reads the input of the model's classifier, and "
                          f"{type(model).__name__} has none: give it an nn.Linear classifier (model.head, or its last "
                          "nn.Linear)") from None
    return next(name for name, module in model.named_modules() if module is head)

__all__ = [
    "CLIENT_OPTIMIZERS",
    "ClientOptimizer",
    "FedProx",
    "Scaffold",
    "Moon",
    "get_client_optimizer",
    "list_client_optimizers",
    "register_client_optimizer",
]

CLIENT_OPTIMIZERS: Registry[type["ClientOptimizer"]] = Registry("client optimizer")
register_client_optimizer = CLIENT_OPTIMIZERS.register


def list_client_optimizers(include: Any = None, exclude: Any = None) -> list[str]:
    return CLIENT_OPTIMIZERS.list(include, exclude)


def get_client_optimizer(name: str, **config: Any) -> "ClientOptimizer":
    """Build a client optimizer from its name and its options (``client_opt_args``)."""
    return CLIENT_OPTIMIZERS.build_from_config(name, "client_opt_args", config)



class ClientOptimizer:
    """Base class: does nothing. Subclasses set the ``uses_*`` flags of the hooks they override,
    so the composition only overrides the method hooks that are needed (a method without client
    hooks keeps the vectorized executor).

    Hooks run inside the sequential executor, one client at a time: ``begin``, then ``loss`` once
    per local step, then ``end`` (not reached when the client's training raises). A subclass
    that also gives ``stacked_begin``/``stacked_loss``/``stacked_end`` (the same for a chunk of
    clients in one stacked model, :class:`~fednorm.methods.base.StackedClientContext`) sets
    ``stacked`` and runs on the vectorized executor.
    """

    name: ClassVar[str] = "none"
    uses_begin: ClassVar[bool] = False
    uses_loss: ClassVar[bool] = False
    uses_end: ClassVar[bool] = False
    uses_gradient: ClassVar[bool] = False
    stacked: ClassVar[bool] = False
    #: Model-sized copies per client that the stacked hooks hold beside the stacked model's own
    #: (FedProx's anchor, SCAFFOLD's correction, MOON's global and previous models): the
    #: vectorized executor's memory budget counts them (:mod:`fednorm.engine.stack_memory`).
    stacked_copies: ClassVar[int] = 0
    #: Whether the stacked hooks keep nothing of one run's server state (each row's anchor, labels,
    #: features and gradients come from the chunk), so several runs' clients may share a chunk
    #: (:mod:`fednorm.engine.stacked_runs`), or read each row's own run's server state through
    #: :meth:`peer` (SCAFFOLD's control variate, FedACG's momentum).
    stacks_across_runs: ClassVar[bool] = False
    # ``begin`` runs before the wrapped method's ``client_begin`` (FedACG moves the model to its
    # look-ahead start, which HBN's statistics pass must see), instead of after it.
    begin_first: ClassVar[bool] = False

    def setup(self, model: nn.Module, method: Method, num_clients: int, local_momentum: float = 0.0) -> None:
        """Once, after the wrapped method's ``setup``: the shared/local split is known.

        Args:
            local_momentum: the clients' SGD momentum (fresh every round), 0 in DSGD mode.
        """
        shared = set(method.shared_keys)
        self.trainable_keys = [n for n, p in model.named_parameters() if p.requires_grad]
        self.shared_trainable_keys = [n for n in self.trainable_keys if n in shared]
        self.num_clients = num_clients
        self.local_momentum = float(local_momentum)

    def begin(self, ctx: ClientContext) -> None: ...

    def peer(self, ctx: StackedClientContext, i: int) -> "ClientOptimizer":
        """Row ``i``'s run's instance of this client optimizer, which holds that run's server
        state (``self`` when the chunk is one run's)."""
        owner = ctx.method_of(i, None)
        return self if owner is None else owner.client_opt

    def loss(self, ctx: ClientContext, model: nn.Module, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def end(self, ctx: ClientContext) -> None: ...

    def gradient(self, ctx: ClientContext, model: nn.Module, closure: Any) -> None:
        """After each step's backward pass: may replace ``p.grad`` (``uses_gradient``; see
        :meth:`~fednorm.methods.base.Method.client_gradient`)."""

    def stacked_begin(self, ctx: StackedClientContext) -> None: ...

    def stacked_loss(self, ctx: StackedClientContext, params: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor | None:
        """The sum over the clients at chunk positions ``rows`` of what :meth:`loss` adds."""
        return None

    def stacked_end(self, ctx: StackedClientContext) -> None: ...

    def stacked_gradient(
        self, ctx: StackedClientContext, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
        rows: torch.Tensor, closure: Any,
    ) -> None:
        """:meth:`gradient` for the clients at chunk positions ``rows`` (see
        :meth:`~fednorm.methods.base.Method.stacked_client_gradient`)."""

    def server_update(self, server_round: int, updates: ClientUpdates) -> None:
        """Server side, after aggregation (SCAFFOLD's global control variate)."""

    def server_moved(self, server_round: int, old: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> None:
        """Server side, once the new global state is final (after the server optimizer): ``old``
        and ``new`` are the global states before and after the round (FedACG's momentum)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def download_bytes(self) -> int:
        """Bytes each client receives per round besides the model (SCAFFOLD: the server's c)."""
        return 0

    def hparams(self) -> dict[str, Any]:
        return {}


@register_client_optimizer("none")
class NoClientOptimizer(ClientOptimizer):
    """Plain local SGD (the method's own local training)."""


@register_client_optimizer("fedprox")
class FedProx(ClientOptimizer):
    """FedProx (Li et al. 2020, arXiv:1812.06127): local loss + (mu/2)·||w − w_start||².

    ``w_start`` is the model the client starts the round with (the downloaded global model, plus
    its own local tensors); the term covers every trainable parameter.

    Args:
        mu: proximal weight. The LN paper picks it by a sweep on Dir(0.1) (Zhang et al., 2024,
            App. C.4; its released code defaults to 1.0); FedBN's paper uses 0.01 (Li et al., 2021,
            App. D.2). mu = 0 is FedAvg (a warning says so). (default: 0.01)
    """

    name = "fedprox"
    uses_begin = True
    uses_loss = True
    stacked = True
    stacked_copies = 1  # the anchor: each client's start parameters
    stacks_across_runs = True  # the anchor is each row's own start

    def __init__(self, mu: float = 0.01) -> None:
        self.mu = check_number("fedprox mu", mu, 0.0)
        if self.mu == 0:
            warnings.warn("fedprox with mu=0 is equivalent to FedAvg", stacklevel=3)
        self._anchor: list[tuple[nn.Parameter, torch.Tensor]] = []

    def begin(self, ctx: ClientContext) -> None:
        params = dict(ctx.model.named_parameters())
        self._anchor = [(params[k], params[k].detach().clone()) for k in self.trainable_keys]

    def loss(self, ctx: ClientContext, model: nn.Module, loss: torch.Tensor) -> torch.Tensor:
        prox = sum(((p - w0) ** 2).sum() for p, w0 in self._anchor)
        return loss + 0.5 * self.mu * prox

    def end(self, ctx: ClientContext) -> None:
        self._anchor = []

    def stacked_begin(self, ctx: StackedClientContext) -> None:
        params = dict(ctx.model.named_parameters())
        self._stacked_anchor = {k: params[k].detach().clone() for k in self.trainable_keys}

    def stacked_loss(self, ctx: StackedClientContext, params: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        every = len(rows) == len(ctx)
        prox = sum(((params[k] - (w0 if every else w0.index_select(0, rows))) ** 2).sum()
                   for k, w0 in self._stacked_anchor.items())
        return 0.5 * self.mu * prox

    def stacked_end(self, ctx: StackedClientContext) -> None:
        self._stacked_anchor = {}

    def hparams(self) -> dict[str, Any]:
        return {"mu": self.mu}


SCAFFOLD_PREFIX = "scaffold.c."
SCAFFOLD_UPLOAD = "scaffold.dc."


@register_client_optimizer("scaffold")
class Scaffold(ClientOptimizer):
    """SCAFFOLD (Karimireddy et al. 2020, arXiv:1910.06378) with Option II control variates.

    Each local step descends ``g − c_i + c`` (the client's drift correction): the loss gets the
    linear term ``Σ_p <c_p − c_i,p, w_p>``, whose gradient is exactly the constant correction.
    After training, ``c_i⁺ = c_i − c + (x − y_i)/(K·lr)`` with ``K`` the local steps actually
    taken; the client uploads ``Δc_i = c_i⁺ − c_i`` and the server sets
    ``c ← c + (|S|/N)·mean_{i∈S} Δc_i``. The LN paper's released code never updates its control
    variates (SCAFFOLD ≡ FedAvg there; the paper names Option II, Zhang et al., 2024, App. C.4); here
    they change every round.

    ``c_i`` lives in the client state bank (``"scaffold.c.<param>"``, zero before a client's first
    round), ``c`` on the server (checkpointed). Only shared trainable parameters are corrected.

    Client momentum β (the HBN paper trains every method with 0.9): the correction is part of
    the gradient that momentum accumulates (and that weight decay and clipping act on, as when an
    implementation adds it to ``p.grad``). Option II divides the displacement by ``K·lr``, the
    displacement per unit gradient of K plain SGD steps; with heavy-ball momentum K steps of a
    constant gradient move ``lr·K_eff`` per unit with ``K_eff = Σ_{k=1..K} (1 − β^k)/(1 − β)``, so
    ``K·lr`` overstates the gradient up to 1/(1 − β) = 10× at β = 0.9 and the run diverges. By
    default (``momentum_aware=True``) the update divides by ``K_eff·lr``, which equals ``K·lr`` at
    β = 0 (the paper's setting); ``momentum_aware=False`` is the literal Option II. Weight decay
    and clipping are not compensated.
    A client dropped after training (straggler, deadline) has already updated its ``c_i`` while
    the server did not receive its ``Δc_i``, as in a real deployment.

    Args:
        momentum_aware: normalise by ``K_eff`` under client momentum (see above). (default: True)
    """

    name = "scaffold"
    uses_begin = True
    uses_loss = True
    uses_end = True
    stacked = True
    stacked_copies = 1  # the correction c - c_i of each client's parameters
    stacks_across_runs = True  # each row's c from its own run (peer), its lr and start from the chunk

    def __init__(self, momentum_aware: bool = True) -> None:
        if not isinstance(momentum_aware, bool):
            raise ConfigError(f"scaffold momentum_aware must be true or false, got {momentum_aware!r}")
        self.momentum_aware = momentum_aware
        self.c: dict[str, torch.Tensor] = {}
        self._params: list[tuple[str, nn.Parameter]] = []
        self._correction: list[torch.Tensor] = []
        self._steps = 0

    def setup(self, model: nn.Module, method: Method, num_clients: int, local_momentum: float = 0.0) -> None:
        super().setup(model, method, num_clients, local_momentum)
        params = dict(model.named_parameters())
        self.c = {k: torch.zeros_like(params[k]).detach() for k in self.shared_trainable_keys}
        if not self.c:
            warnings.warn("scaffold: no shared trainable parameter, so there is nothing to correct", stacklevel=3)

    def client_variate(self, ctx: ClientContext, key: str) -> torch.Tensor:
        ci = ctx.local_state.get(SCAFFOLD_PREFIX + key)
        return torch.zeros_like(self.c[key]) if ci is None else ci

    def begin(self, ctx: ClientContext) -> None:
        params = dict(ctx.model.named_parameters())
        self._params = [(k, params[k]) for k in self.c]
        self._correction = [(self.c[k] - self.client_variate(ctx, k)).to(params[k].dtype) for k in self.c]
        self._steps = 0

    def loss(self, ctx: ClientContext, model: nn.Module, loss: torch.Tensor) -> torch.Tensor:
        self._steps += 1  # called once per local step
        linear = sum((d * p).sum() for d, (_, p) in zip(self._correction, self._params))
        return loss + linear

    def effective_steps(self, steps: int) -> float:
        """K, or K_eff = Σ_{k=1..K} (1 − β^k)/(1 − β) under client momentum β (momentum_aware)."""
        beta = self.local_momentum if self.momentum_aware else 0.0
        if beta == 0.0:
            return float(steps)
        return sum((1.0 - beta**k) / (1.0 - beta) for k in range(1, steps + 1))

    def end(self, ctx: ClientContext) -> None:
        steps, lr = self._steps, ctx.lr
        k_eff = self.effective_steps(steps)
        for key, p in self._params:
            ci = self.client_variate(ctx, key)
            if steps > 0:
                drift = (ctx.global_state[key].double() - p.detach().double()) / (k_eff * lr)
                new = (ci.double() - self.c[key].double() + drift).to(ci.dtype)
            else:  # a client without samples took no step: nothing to learn from
                new = ci.clone()
            ctx.uploads[SCAFFOLD_UPLOAD + key] = new - ci
            ctx.local_state[SCAFFOLD_PREFIX + key] = new
        self._params, self._correction = [], []

    def stacked_begin(self, ctx: StackedClientContext) -> None:
        params = dict(ctx.model.named_parameters())
        peers = [self.peer(ctx, i) for i in range(len(ctx))]
        self._stacked_correction = {
            k: torch.stack([(peer.c[k] - self._variate(local, k)).to(params[k].dtype) for peer, local in zip(peers, ctx.local_states)])
            for k in self.c
        }

    def _variate(self, local: dict[str, torch.Tensor], key: str) -> torch.Tensor:
        ci = local.get(SCAFFOLD_PREFIX + key)
        return torch.zeros_like(self.c[key]) if ci is None else ci

    def stacked_loss(self, ctx: StackedClientContext, params: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        every = len(rows) == len(ctx)
        return sum(((d if every else d.index_select(0, rows)) * params[k]).sum() for k, d in self._stacked_correction.items())

    def stacked_end(self, ctx: StackedClientContext) -> None:
        state = dict(ctx.model.named_parameters())
        for i, local in enumerate(ctx.local_states):
            steps = ctx.num_steps[i]
            k_eff = self.effective_steps(steps)
            c, start, lr = self.peer(ctx, i).c, ctx.global_state_of(i), ctx.lr_of(i)
            for key in self.c:
                ci = self._variate(local, key)
                if steps > 0:
                    drift = (start[key].double() - state[key][i].detach().double()) / (k_eff * lr)
                    new = (ci.double() - c[key].double() + drift).to(ci.dtype)
                else:
                    new = ci.clone()
                ctx.uploads[i][SCAFFOLD_UPLOAD + key] = new - ci
                local[SCAFFOLD_PREFIX + key] = new
        self._stacked_correction = {}

    def server_update(self, server_round: int, updates: ClientUpdates) -> None:
        if len(updates) == 0:
            return
        scale = len(updates) / self.num_clients
        for key, c in self.c.items():
            delta = updates.extras[SCAFFOLD_UPLOAD + key].double().mean(dim=0)
            self.c[key] = (c.double() + scale * delta).to(c.dtype)

    def hparams(self) -> dict[str, Any]:
        return {"momentum_aware": self.momentum_aware}

    def download_bytes(self) -> int:
        return sum(c.numel() * c.element_size() for c in self.c.values())

    def state_dict(self) -> dict[str, Any]:
        return {"c": {k: v.detach().cpu().clone() for k, v in self.c.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "c" in state:
            self.c = {k: state["c"][k].to(device=v.device, dtype=v.dtype) for k, v in self.c.items()}


MOON_PREFIX = "moon.prev."


@register_client_optimizer("moon")
class Moon(ClientOptimizer):
    """MOON (Li, He & Song, CVPR 2021, arXiv:2103.16257): model-contrastive local loss.

    ``loss += mu · −log( e^{sim(z, z_glob)/τ} / (e^{sim(z, z_glob)/τ} + e^{sim(z, z_prev)/τ}) )`` with
    ``z`` the representation (the input of the model's classifier, :func:`fednorm.nn.classifier_head`) of the
    model being trained, ``z_glob`` that of the downloaded model and ``z_prev`` that of this
    client's model at the end of its previous round (kept in the bank as ``"moon.prev.*"``; the
    downloaded model before a client's first round, as MOON's code initialises it), ``sim`` the
    cosine similarity. The two frozen models run in train mode without gradients, on the same
    (augmented) batch. fednorm models have no projection head, so the representation is the
    penultimate feature vector (MOON's "no projection head" ablation).

    On the vectorized executor the two frozen models are stacked copies of the base model
    holding every client of the chunk (built once per chunk size, without hooks), run on the
    same client-layout batches as the trained stacked model.

    Args:
        mu: weight of the contrastive term; MOON uses 5 on CIFAR-10 and 1 on CIFAR-100 and
            Tiny-ImageNet (its code's default is 1). (default: 1.0)
        temperature: tau. (default: 0.5, the paper's)
    """

    name = "moon"
    uses_begin = True
    uses_loss = True
    uses_end = True
    stacked = True
    stacked_copies = 2  # the frozen global and previous models of every client
    stacks_across_runs = True  # its frozen models start from each row's own start and previous model

    def __init__(self, mu: float = 1.0, temperature: float = 0.5) -> None:
        self.mu = check_number("moon mu", mu, 0.0)
        self.temperature = check_number("moon temperature", temperature, 0.0, low_open=True)
        self._global: nn.Module | None = None
        self._prev: nn.Module | None = None
        self._hooks: list[Any] = []
        self._batch: torch.Tensor | None = None
        self._features: torch.Tensor | None = None
        self._stacked_frozen: dict[int, tuple[nn.Module, nn.Module]] = {}  # chunk size -> (global, prev)
        self._passes: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []  # (x, z, clients)
        self._pending: torch.Tensor | None = None
        self._head = "head"

    def setup(self, model: nn.Module, method: Method, num_clients: int, local_momentum: float = 0.0) -> None:
        super().setup(model, method, num_clients, local_momentum)
        self._head = head_name(model, self.name)
        self._global = copy.deepcopy(model)
        self._prev = copy.deepcopy(model)
        for frozen in (self._global, self._prev):
            frozen.requires_grad_(False)

    def _remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def begin(self, ctx: ClientContext) -> None:
        self._remove_hooks()  # a client whose training raised never reached end()
        model = ctx.model
        start = {k: v.detach().clone() for k, v in model.state_dict().items()}
        prev = {k[len(MOON_PREFIX):]: v for k, v in ctx.local_state.items() if k.startswith(MOON_PREFIX)}
        assert self._global is not None and self._prev is not None
        self._global.load_state_dict(start)
        self._prev.load_state_dict(prev if prev else start)

        def grab_input(module: nn.Module, args: tuple) -> None:
            self._batch = args[0]

        def grab_features(module: nn.Module, args: tuple) -> None:
            self._features = args[0]

        self._hooks = [model.register_forward_pre_hook(grab_input),
                       model.get_submodule(self._head).register_forward_pre_hook(grab_features)]

    def _representation(self, frozen: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """A frozen model's representation of ``x``: its ``forward_features`` (fednorm's models),
        else the input of its classifier, caught on a full forward pass (a user's model)."""
        if hasattr(frozen, "forward_features"):
            return frozen.forward_features(x)
        grabbed: list[torch.Tensor] = []
        handle = frozen.get_submodule(self._head).register_forward_pre_hook(lambda _m, args: grabbed.append(args[0]))
        try:
            frozen(x)
        finally:
            handle.remove()
        return grabbed[0]

    def contrastive(self, z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor) -> torch.Tensor:
        """MOON Eq. 3 averaged over the batch."""
        pos = F.cosine_similarity(z, z_glob, dim=1) / self.temperature
        neg = F.cosine_similarity(z, z_prev, dim=1) / self.temperature
        logits = torch.stack([pos, neg], dim=1)
        return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))

    def loss(self, ctx: ClientContext, model: nn.Module, loss: torch.Tensor) -> torch.Tensor:
        assert self._batch is not None and self._features is not None and self._global is not None and self._prev is not None
        with torch.no_grad():
            self._global.train()
            self._prev.train()
            z_glob = self._representation(self._global, self._batch)
            z_prev = self._representation(self._prev, self._batch)
        z = self._features
        self._batch = self._features = None
        return loss + self.mu * self.contrastive(z, z_glob, z_prev)

    def end(self, ctx: ClientContext) -> None:
        self._remove_hooks()
        self._batch = self._features = None
        ctx.local_state.update({MOON_PREFIX + k: v.detach().clone() for k, v in ctx.model.state_dict().items()})

    # -- the stacked form ------------------------------------------------------------------------
    def _frozen_stacks(self, k: int) -> tuple[nn.Module, nn.Module]:
        if k not in self._stacked_frozen:
            assert self._global is not None
            pair = tuple(stack_model(self._global, k, verify=False) for _ in range(2))
            for frozen in pair:
                frozen.requires_grad_(False)
            self._stacked_frozen[k] = pair  # type: ignore[assignment]
        return self._stacked_frozen[k]

    def stacked_begin(self, ctx: StackedClientContext) -> None:
        self._remove_hooks()
        self._passes, self._pending = [], None
        model = ctx.model
        start = {k: v.detach().clone() for k, v in model.state_dict().items()}
        glob, prev = self._frozen_stacks(len(ctx))
        glob.load_state_dict(start)
        prev_state = {}
        for key, rows in start.items():
            saved = [local.get(MOON_PREFIX + key) for local in ctx.local_states]
            prev_state[key] = torch.stack([rows[i] if v is None else v.to(rows.dtype) for i, v in enumerate(saved)])
        prev.load_state_dict(prev_state)

        def grab_input(module: nn.Module, args: tuple) -> None:
            if module.training:
                self._pending = args[0]

        def grab_features(module: nn.Module, args: tuple) -> None:
            if module.training and self._pending is not None:
                self._passes.append((self._pending, args[0], forward_clients(model)))
                self._pending = None

        self._hooks = [model.register_forward_pre_hook(grab_input),
                       model.get_submodule(self._head).register_forward_pre_hook(grab_features)]

    def _frozen_features(self, frozen: nn.Module, x: torch.Tensor, clients: torch.Tensor | None, k: int) -> torch.Tensor:
        """The frozen stacked model's head input on ``x`` for the chunk positions ``clients``."""
        frozen.train()
        if clients is None or (len(clients) == k and bool((clients == torch.arange(k, device=clients.device)).all())):
            return self._representation(frozen, x)
        idx = clients.to(torch.long)
        state = {n: t.index_select(0, idx) for n, t in frozen.state_dict().items()}
        grabbed: list[torch.Tensor] = []
        handle = frozen.get_submodule(self._head).register_forward_pre_hook(lambda _m, args: grabbed.append(args[0]))
        try:
            functional_call(frozen, state, (x,))
        finally:
            handle.remove()
        # Statistics the pass updated (FBN normalises with them in training too) go back to
        # their rows, as the sequential frozen model keeps its own from step to step.
        for name, buf in frozen.named_buffers():
            buf.index_copy_(0, idx, state[name])
        return grabbed[0]

    def stacked_loss(self, ctx: StackedClientContext, params: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor | None:
        passes, self._passes = self._passes, []
        if not passes:
            return None
        glob, prev = self._frozen_stacks(len(ctx))
        d = ctx.model.get_submodule(self._head).in_features
        total = None
        for x, z, clients in passes:
            with torch.no_grad():
                z_glob = self._frozen_features(glob, x, clients, len(ctx))
                z_prev = self._frozen_features(prev, x, clients, len(ctx))
            b = z.shape[0]
            kk = z.shape[1] // d
            # [B, kk·d] client-concatenated -> [kk·B, d], client-major: each client's batch mean
            per = [t.reshape(b, kk, d).transpose(0, 1).reshape(kk * b, d) for t in (z, z_glob, z_prev)]
            pos = F.cosine_similarity(per[0], per[1], dim=1) / self.temperature
            neg = F.cosine_similarity(per[0], per[2], dim=1) / self.temperature
            logits = torch.stack([pos, neg], dim=1)
            term = F.cross_entropy(logits, torch.zeros(kk * b, dtype=torch.long, device=z.device), reduction="none")
            term = term.view(kk, b).mean(dim=1).sum()
            total = term if total is None else total + term
        return self.mu * total

    def stacked_end(self, ctx: StackedClientContext) -> None:
        self._remove_hooks()
        self._passes, self._pending = [], None
        state = ctx.model.state_dict()
        for i, local in enumerate(ctx.local_states):
            local.update({MOON_PREFIX + k: v[i].detach().clone() for k, v in state.items()})

    def hparams(self) -> dict[str, Any]:
        return {"mu": self.mu, "temperature": self.temperature}
