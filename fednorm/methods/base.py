"""The method interface: what a federated algorithm decides, and nothing the engine owns.

Like Flower's ``Strategy``, a method is small: which model tensors are shared and which stay
on each client (selected by module type), how the server aggregates the shared ones, whether
each client is evaluated with its own model, and which extra phases it needs. The engine owns
the round loop, client sampling, local training and evaluation, so one method runs unchanged
under every executor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol, Sequence

import torch
from torch import nn

from ..errors import InconsistentUpdateError
from ..nn.state import state_keys
from .policy import NormPolicy, resolve_policy

if TYPE_CHECKING:  # pragma: no cover
    from ..data.transforms import CropFlip

__all__ = [
    "ClientContext", "ClientUpdates", "Method", "ServerView", "StackedClientContext", "stack_rows", "weighted_average",
]



class ServerView(Protocol):
    """What a method may see of the engine running it (the server's side of a run).

    Methods are handed this view instead of importing the engine: the engine imports every
    method, so a method importing the engine would close an import circle. Every runtime
    (simulation, torch.distributed, Flower) provides it.
    """

    global_state: dict[str, torch.Tensor]
    server_round: int

    def sample_clients(self, server_round: int) -> list[int]: ...

    def all_clients(self) -> list[int]: ...

    def query_clients(
        self, client_ids: list[int], query: str, state: dict[str, torch.Tensor] | None = None
    ) -> dict[int, dict[str, torch.Tensor]]: ...

    def collect_bank(self) -> dict[int, dict[str, torch.Tensor]]: ...


@dataclass
class ClientContext:
    """One client's view of a round, handed to the method's client-side hooks.

    Attributes:
        server_round: the round (1-based).
        client_id: the client.
        model: the working model, already loaded with the global shared tensors and this
            client's local ones; hooks may run it (e.g. a statistics pass) or change it.
        x, y: the client's training samples.
        global_state: the downloaded global state (read-only).
        local_state: the client's persistent state from the bank (mutable; saved after the
            round together with the model's local tensors). Method-specific entries use a
            ``"<method>."`` key prefix.
        uploads: tensors sent to the server besides the shared weights (e.g. statistics);
            every client of a round must upload the same keys and shapes, except that a
            per-step upload may differ in its leading dimension (clients take different numbers
            of local steps): ``stack_rows`` zero-pads it to the longest, so the method must
            read an all-zero row as "no such step" (e.g. a zero count).
        lr: this round's learning rate.
    """

    server_round: int
    client_id: int
    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    global_state: dict[str, torch.Tensor]
    local_state: dict[str, torch.Tensor]
    uploads: dict[str, torch.Tensor] = field(default_factory=dict)
    lr: float = 0.0

    @property
    def num_examples(self) -> int:
        return len(self.x)


@dataclass
class StackedClientContext:
    """A chunk of a round's clients as the vectorized executor holds them: one stacked model
    (``fednorm.nn.stacked``, every tensor ``[K, ...]``, activations client-concatenated),
    handed to the method's stacked client hooks (:meth:`Method.stacked_client_begin`,
    :meth:`Method.stacked_client_end`). Position ``i`` of every list is client ``client_ids[i]``,
    row ``i`` of every stacked tensor.

    Attributes:
        server_round: the round (1-based).
        client_ids: the chunk's clients (K of them).
        model: the stacked model, loaded with the global shared tensors and each client's
            local ones; hooks may run it or change it (e.g. attach recorders to its layers).
            During training each forward pass runs the clients that still have a batch; the
            executor tells the stacked norm layers which rows those are
            (``fednorm.nn.stacked.set_forward_clients``).
        x, y: each client's training samples (a sequence gathered on first access: read only what the method needs).
        global_state: the downloaded global state (read-only).
        local_states: each client's persistent state from the bank (mutable, as
            :attr:`ClientContext.local_state`).
        uploads: each client's tensors sent besides the shared weights, exactly what the
            sequential hooks would put in :attr:`ClientContext.uploads`.
        lr: this round's learning rate.
        num_steps: each client's local steps, set by the executor once training is over
            (for :meth:`Method.stacked_client_end`).
        seeds, global_states, lrs, methods: each row's run seed, downloaded global state,
            learning rate and method object (with its server state) when the chunk holds the
            clients of several runs (``fednorm.engine.stacked_runs``); empty for one run. Hooks
            read them through :meth:`seed_of`, :meth:`global_state_of`, :meth:`lr_of` and
            :meth:`method_of`: ``global_state``, ``lr`` and the hook's own object are the first
            row's run's.
        rows, crop_rows: where the executor gathers batches by index on the data's device
            (fednorm/engine/feed.py): each client's dataset rows (on the data's device), and
            ``crop_rows(rows, generators, crop)``, which crops and flips the dataset's samples
            ``rows[i]`` from ``generators[i]`` as ``crop(x[rows[i]], generators[i])`` does, bit for
            bit, by one gather (``None`` when it cannot); a method's own augmented pass over the
            training data (HBN's statistics) uses them instead of ``x``. Empty / ``None`` otherwise.
    """

    server_round: int
    client_ids: list[int]
    model: nn.Module
    x: Sequence[torch.Tensor]
    y: Sequence[torch.Tensor]
    global_state: dict[str, torch.Tensor]
    local_states: list[dict[str, torch.Tensor]]
    uploads: list[dict[str, torch.Tensor]] = field(default_factory=list)
    lr: float = 0.0
    num_steps: list[int] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    global_states: list[dict[str, torch.Tensor]] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    methods: list[Any] = field(default_factory=list)
    rows: Sequence[torch.Tensor] = ()
    # (rows, generators, crop: fednorm.data.transforms.CropFlip) -> crops; spelled out here, not in
    # the annotation, which the API reference renders and cannot resolve a data-layer class in
    crop_rows: Callable[..., list[torch.Tensor] | None] | None = None

    def __post_init__(self) -> None:
        if not self.uploads:
            self.uploads = [{} for _ in self.client_ids]

    def seed_of(self, i: int, default: int) -> int:
        """Row ``i``'s run seed (``default``, the method's own, when the chunk is one run's)."""
        return self.seeds[i] if self.seeds else default

    def global_state_of(self, i: int) -> dict[str, torch.Tensor]:
        """The global state row ``i`` downloaded (its own run's when runs are stacked)."""
        return self.global_states[i] if self.global_states else self.global_state

    def lr_of(self, i: int) -> float:
        """Row ``i``'s learning rate this round (its own run's when runs are stacked)."""
        return self.lrs[i] if self.lrs else self.lr

    def method_of(self, i: int, default: Any) -> Any:
        """Row ``i``'s run's method object, whose server state its hooks read (``default``, the
        hook's own, when the chunk is one run's)."""
        return self.methods[i] if self.methods else default

    def __len__(self) -> int:
        return len(self.client_ids)


@dataclass
class ClientUpdates:
    """What a round's clients send back, stacked over a leading client axis.

    Attributes:
        client_ids: the clients, in the order of the client axis.
        states: shared tensors after local training, each of shape ``[K, *shape]``.
        num_examples: training samples of each client (``[K]``, float64), the FedAvg weights.
        train_loss: mean local training loss of each client (``[K]``).
        num_steps: local steps each client took (``[K]``).
        extras: method-specific uploads (e.g. statistics), stacked the same way.
        failures: clients that raised during local training (client id -> reason); they
            have no row.
        seconds: wall-clock seconds of each client's local training, where measured.
    """

    client_ids: list[int]
    states: dict[str, torch.Tensor]
    num_examples: torch.Tensor
    train_loss: torch.Tensor
    num_steps: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)
    seconds: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.client_ids)

    def subset(self, rows: list[int]) -> "ClientUpdates":
        """The updates of the clients at positions ``rows`` (e.g. without dropped clients)."""
        idx = torch.tensor(rows, dtype=torch.int64)
        # states and uploads live on the run's device, the per-client counts on the CPU
        return ClientUpdates(
            client_ids=[self.client_ids[r] for r in rows],
            states={k: v.index_select(0, idx.to(v.device)) for k, v in self.states.items()},
            num_examples=self.num_examples.index_select(0, idx),
            train_loss=self.train_loss.index_select(0, idx),
            num_steps=self.num_steps.index_select(0, idx),
            extras={k: v.index_select(0, idx.to(v.device)) for k, v in self.extras.items()},
            failures=dict(self.failures),
            seconds=None if self.seconds is None else self.seconds.index_select(0, idx),
        )

    def check(self, expected: dict[str, torch.Tensor]) -> None:
        """Raise InconsistentUpdateError unless keys, shapes and dtypes match ``expected``."""
        missing = set(expected) - set(self.states)
        extra = set(self.states) - set(expected)
        if missing or extra:
            raise InconsistentUpdateError(
                f"client updates have wrong keys: missing {sorted(missing)}, unexpected {sorted(extra)}"
            )
        k = len(self.client_ids)
        for key, ref in expected.items():
            got = self.states[key]
            if got.shape != (k, *ref.shape) or got.dtype != ref.dtype:
                raise InconsistentUpdateError(
                    f"client update '{key}' has shape {tuple(got.shape)} and dtype {got.dtype}, "
                    f"expected {(k, *ref.shape)} and {ref.dtype}"
                )


def stack_rows(rows: list[torch.Tensor]) -> torch.Tensor:
    """Stack one upload of every client over a new client axis, zero-padding the leading
    dimension where clients differ only there (per-step uploads of clients that took different
    numbers of local steps, see :attr:`ClientContext.uploads`). Other shape differences raise."""
    if len({tuple(r.shape) for r in rows}) > 1 and all(r.dim() > 0 for r in rows) \
            and len({tuple(r.shape[1:]) for r in rows}) == 1:
        longest = max(r.shape[0] for r in rows)
        rows = [torch.cat([r, r.new_zeros((longest - r.shape[0], *r.shape[1:]))]) if r.shape[0] < longest else r
                for r in rows]
    try:
        return torch.stack(rows)
    except RuntimeError as exc:
        raise InconsistentUpdateError(f"clients uploaded tensors of different shapes: {exc}") from None


def weighted_average(stacked: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted mean over the client axis; integer tensors (BN's counter) take the maximum.

    ``weights`` need not be normalised. Floating tensors are reduced in float64 and cast back,
    so the result does not depend on the order of clients beyond float rounding.
    """
    if not stacked.is_floating_point():
        return stacked.max(dim=0).values
    w = weights.to(device=stacked.device, dtype=torch.float64)
    w = w / w.sum()
    out = torch.tensordot(w, stacked.to(torch.float64), dims=1)
    return out.to(stacked.dtype)


class Method:
    """Base class of federated methods; the default behaviour is FedAvg over every tensor.

    Subclasses override :meth:`select_local_keys` (what stays on the client) and
    :meth:`aggregate` (how shared tensors are combined).

    Attributes:
        name: registry key.
        personalized: evaluate each client with its own model (shared tensors + its local ones).
        requires_lockstep: needs all clients of a round to execute step by step together
            (cross-client reductions inside the forward pass, e.g. FedTAN); such a method runs
            on the vectorized executor, all of a round's clients in one stacked model.
    """

    name: ClassVar[str] = "base"
    seed: int = 0  # the experiment seed, set by the simulator, for method-side randomness
    # The run's training augmentation (random crop + flip: its padding and fill), None when it
    # trains without one; set by the simulator, for methods that run their own passes over the
    # training data and should see what training sees (HBN's reference-code statistics pass).
    train_augmentation: CropFlip | None = None
    # Whether training feeds 4-d batches channels-last (LocalSpec.channels_last); set by the
    # simulator, so that a method's own passes (HBN's statistics pass) use the same fast layout.
    channels_last: bool = False
    personalized: ClassVar[bool] = False
    requires_lockstep: ClassVar[bool] = False
    #: Whether the stacked client hooks read every per-run value through the context (its rows'
    #: seeds and global states, :class:`StackedClientContext`), so that one chunk may hold the
    #: clients of several runs of this method with equal ``method_args``. Methods without
    #: stacked hooks stack regardless; state a run's server keeps in the method (control
    #: variates, momenta) cannot be read per row, so such methods leave this False.
    stacks_across_runs: ClassVar[bool] = False
    # The normalization policy (fednorm.methods.policy): where BatchNorm buffers and affine
    # parameters go by default, and which settings of --buffers / --affine the method supports.
    default_policy: ClassVar[NormPolicy] = NormPolicy("global", "global")
    allowed_buffers: ClassVar[tuple[str, ...]] = ("global", "local")
    allowed_affine: ClassVar[tuple[str, ...]] = ("global", "local")

    def __init__(self) -> None:
        self.state_keys: list[str] = []
        self.local_keys: set[str] = set()
        self.shared_keys: list[str] = []
        self.dropped_keys: list[str] = []  # neither sent nor kept per client: the server recomputes them
        self.policy: NormPolicy = self.default_policy
        self.stat_keys: dict[str, list[str]] = {"mean": [], "var": []}
        # The server's aggregation rules (fednorm.robust.Aggregator) for model updates and for
        # normalization statistics; None or a plain mean is FedAvg's weighted mean. The simulator
        # sets them from the config (``aggregator``, ``nnm``, ``robust_targets``).
        self.aggregator: Any = None
        self.stats_aggregator: Any = None

    @property
    def robust(self) -> bool:
        """Whether a non-mean aggregation rule is set for updates or statistics."""
        return any(a is not None and not a.is_mean for a in (self.aggregator, self.stats_aggregator))

    # -- model policy -----------------------------------------------------------------------
    def set_policy(self, buffers: str | None = None, affine: str | None = None) -> None:
        """Apply ``--buffers`` / ``--affine`` (None: the method's default); a setting the method
        does not support is a ConfigError. A local setting makes the evaluation per client."""
        self.policy = resolve_policy(self.name, self.default_policy, self.allowed_buffers, self.allowed_affine, buffers, affine)
        if "local" in (self.policy.buffers, self.policy.affine):
            self.personalized = True  # type: ignore[misc]  # the clients' models differ: no single global model

    def setup(self, model: nn.Module) -> None:
        """Inspect the model once, before round 1, and fix the shared/local/dropped split: the
        normalization policy's local keys plus the method's own (:meth:`Method.select_local_keys`)
        stay local, its dropped keys are neither sent nor kept, the rest is shared."""
        self.state_keys = list(model.state_dict().keys())
        self.local_keys = set(self.select_local_keys(model)) | self.policy.keys(model, "local")
        dropped = self.policy.keys(model, "drop") - self.local_keys
        self.dropped_keys = [k for k in self.state_keys if k in dropped]
        self.shared_keys = [k for k in self.state_keys if k not in self.local_keys and k not in dropped]
        shared = set(self.shared_keys)
        bn = lambda m: isinstance(m, nn.modules.batchnorm._BatchNorm)  # noqa: E731
        self.stat_keys = {
            "mean": sorted(shared & state_keys(model, bn, which="buffers", names=("running_mean",))),
            "var": sorted(shared & state_keys(model, bn, which="buffers", names=("running_var",))),
        }

    def statistics_keys(self) -> dict[str, list[str]]:
        """Keys of the normalization statistics a client sends, in ``updates.states`` or
        ``updates.extras``: ``{"mean": [...], "var": [...]}``. Attacks on statistics and robust
        aggregation of statistics act on these (default: the shared BatchNorm running means
        and variances, selected by module type)."""
        return self.stat_keys

    def select_local_keys(self, model: nn.Module) -> set[str]:
        """State-dict keys that never leave a client besides the normalization policy's (select
        by module type; e.g. HBN's mixing logits)."""
        return set()

    @property
    def broadcast_keys(self) -> list[str]:
        """The keys every client downloads, the shared ones and the server-recomputed (dropped) ones."""
        return [k for k in self.state_keys if k not in self.local_keys]

    def initial_client_state(self, client_id: int, global_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A client's local tensors before its first round (default: the global initialisation)."""
        return {k: global_state[k].clone() for k in self.local_keys}

    # -- client-side hooks (run inside the executor, once per sampled client) ----------------
    def client_begin(self, ctx: ClientContext) -> None:
        """Before local training: extra phases such as HBN's statistics pass (default: nothing)."""

    def client_loss(self, ctx: ClientContext, model: nn.Module, loss: torch.Tensor) -> torch.Tensor:
        """The loss to minimise given the data loss (FedProx, MOON override this)."""
        return loss

    def client_end(self, ctx: ClientContext) -> None:
        """After local training: e.g. SCAFFOLD's control-variate update (default: nothing)."""

    def client_gradient(self, ctx: ClientContext, model: nn.Module, closure: Any) -> None:
        """After each local step's backward pass, before clipping and the optimiser step: may
        replace the gradients in ``p.grad`` (FedSAM's gradient at the perturbed weights).
        ``closure()`` recomputes the step's loss (with :meth:`client_loss`) and its gradients on
        the same batch at the model's current weights. Default: nothing. A method that
        overrides it runs on the vectorized executor only if it overrides
        :meth:`stacked_client_gradient` too."""

    # -- the same hooks in the client dimension (vectorized executor) ---------------------------
    def stacked_client_begin(self, ctx: StackedClientContext) -> None:
        """:meth:`client_begin` for a chunk of clients held in one stacked model (default:
        nothing). A method that overrides :meth:`client_begin` runs on the vectorized executor
        only if it overrides this too, with the same effect on every client."""

    def stacked_client_end(self, ctx: StackedClientContext) -> None:
        """:meth:`client_end` for a chunk of clients held in one stacked model (default:
        nothing); the per-client uploads go to ``ctx.uploads[i]``. A method that overrides
        :meth:`client_end` runs on the vectorized executor only if it overrides this too."""

    def client_query(self, query: str, ctx: ClientContext) -> dict[str, torch.Tensor]:
        """Answer a named server query on a client's model outside training (the engine's
        ``query_clients``): e.g. HBN's ``"statistics"`` pass for evaluation and round T+1. It
        runs wherever the client lives (this process, a torch.distributed rank, a Flower node)."""
        raise ValueError(f"method '{self.name}' answers no client query named '{query}'")

    def stacked_client_loss(
        self, ctx: StackedClientContext, params: dict[str, torch.Tensor], rows: torch.Tensor
    ) -> torch.Tensor | None:
        """:meth:`client_loss` for the clients of a stacked chunk, once per local step: the sum
        over the clients training this step (chunk positions ``rows``; ``params`` are their
        stacked trainable parameters, row j = client ``rows[j]``) of what each client's
        :meth:`client_loss` adds to its data loss; ``None`` (the default) adds nothing. A method
        that overrides :meth:`client_loss` runs on the vectorized executor only if it overrides
        this too."""
        return None

    def stacked_client_gradient(
        self, ctx: StackedClientContext, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
        rows: torch.Tensor, closure: Any,
    ) -> None:
        """:meth:`client_gradient` for the clients of a stacked chunk, once per local step, after
        the backward pass: ``params`` are the training clients' stacked trainable parameters
        (row j = client ``rows[j]``, gradients in ``.grad``), ``buffers`` the stacked buffers the
        step's forward passes use and update, and ``closure()`` recomputes the step's loss (data
        loss and :meth:`stacked_client_loss`) and its gradients on the same batches at the current
        values of ``params``. Each client's result must be what its :meth:`client_gradient` gives.
        Default: nothing."""

    def stacked_client_query(self, query: str, ctx: StackedClientContext) -> list[dict[str, torch.Tensor]] | None:
        """:meth:`client_query` for a chunk of clients held in one stacked model: each client's
        answer, equal to the per-client one, or ``None`` (the default) to be asked one client
        at a time. ``ctx.uploads`` is unused; nothing the hook does may persist."""
        return None

    @property
    def has_client_loss(self) -> bool:
        return type(self).client_loss is not Method.client_loss

    @property
    def has_client_gradient(self) -> bool:
        return type(self).client_gradient is not Method.client_gradient

    # -- lockstep execution (vectorized executor) ---------------------------------------------
    def synced_steps(self, server_round: int) -> int:
        """Leading local steps of this round whose BatchNorm statistics (and their gradients)
        are aggregated across all clients (FedTAN: 1). Needs ``requires_lockstep``."""
        return 0

    def sync_backward(self, server_round: int) -> bool:
        """Whether the synced steps also aggregate the statistics' gradients (FedTAN) or only
        the forward statistics (the paper's "FedAvg + Algorithm 2" baseline)."""
        return True

    def reset_momentum_after_sync(self) -> bool:
        """Restart the client optimiser after the synced steps (FedTAN's code re-creates SGD)."""
        return False

    def frozen_statistics(self, server_round: int) -> bool:
        """Whether BatchNorm normalises training batches with the downloaded running statistics
        and leaves them unchanged this round (FedTAN-II after its switch round)."""
        return False

    # -- server -----------------------------------------------------------------------------
    def configure_round(self, server_round: int, client_ids: list[int]) -> None:
        """Server side, before the round's clients run (default: nothing)."""

    def client_weights(self, updates: ClientUpdates) -> torch.Tensor:
        return updates.num_examples

    def aggregate(
        self, server_round: int, global_state: dict[str, torch.Tensor], updates: ClientUpdates
    ) -> dict[str, torch.Tensor]:
        """New values of the shared tensors (default: weighted average of every shared tensor)."""
        weights = self.client_weights(updates)
        return {k: weighted_average(updates.states[k], weights) for k in self.shared_keys}

    # -- evaluation -------------------------------------------------------------------------
    def evaluation_state(self, sim: ServerView) -> dict[str, torch.Tensor]:
        """The global state to evaluate (default: as aggregated). HBN recomputes its statistics
        under the new weights here, as its paper evaluates."""
        return sim.global_state

    def initial_state(self, sim: ServerView) -> dict[str, torch.Tensor] | None:
        """An exchange before round 1 (e.g. HBN's and FBN's statistics pass under the initial
        weights): the global state to start round 1 from, or ``None`` to start from the
        initialisation (default). It may query clients (``sim.query_clients``)."""
        return None

    def final_state(self, sim: ServerView) -> dict[str, torch.Tensor] | None:
        """A last exchange after training (HBN's statistics-only round T+1): the global state to
        deploy, or ``None`` when the trained state is final (default)."""
        return None

    def report(self, sim: ServerView) -> dict[str, Any]:
        """Figures for ``summary.json``'s ``method_report``: the method's own (default: none), and
        under client-level DP the privacy spent (``privacy``: ``epsilon`` at ``delta``, ...), since
        a DP run's accuracy means little without it. Overrides merge ``super().report(sim)``."""
        privacy = getattr(sim, "privacy", None)  # fednorm.privacy.ClientLevelDP on a DP run, else None
        config = getattr(sim, "config", None)
        if privacy is None or config is None:
            return {}
        spent = privacy.metrics(config.dp_delta)  # the evaluation records' dp/... figures, at the last round
        return {"privacy": {k.removeprefix("dp/"): v for k, v in spent.items()}}

    # -- communication ----------------------------------------------------------------------
    def comm_rounds_per_round(self, model: nn.Module) -> int:
        """Synchronisation rounds per server round (FedAvg: one exchange)."""
        return 1

    def extra_bytes_per_client(self, model: nn.Module) -> tuple[int, int]:
        """Bytes each client sends and receives per round besides the model exchange and
        ``ctx.uploads`` (e.g. FedTAN's layer-wise statistics and their gradients)."""
        return 0, 0

    # -- checkpointing ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Server-side method state that must survive a resume (e.g. a server optimiser's moments)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    # -- reporting --------------------------------------------------------------------------
    def hparams(self) -> dict[str, Any]:
        return {}

    def summary(self) -> str:
        hp = ", ".join(f"{k}={v}" for k, v in self.hparams().items())
        local = f"{len(self.local_keys)} local tensors" if self.local_keys else "all tensors shared"
        return f"{self.name}({hp}) — {local}"
