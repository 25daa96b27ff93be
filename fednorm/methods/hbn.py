"""HBN: Hybrid Batch Normalisation (Chen et al., ICML 2025, arXiv:2505.21877).

Each round, before local training, every participating client runs a statistics pass under the
*downloaded* global weights (Eq. 7) and uploads, per HBN layer, the exact ``(count, mean, biased
variance)`` of the layer's input. The server pools them exactly into the global statistics, with
the within- plus between-client variance and Bessel's correction (Eq. 8), smooths them over rounds
with ``lambda`` (Eq. 11), and averages the weights (FedAvg, sample-count weights). The mixing
logits ``alpha`` never leave their client (per-client state bank).

Bessel's ``N − 1`` in Eq. 8 counts *samples* (``bessel_count="samples"``, the paper's N and the
released code's ``running_num``), not the ``samples × H × W`` values a conv channel averages over;
``bessel_count="elements"`` gives the latter (a relative variance difference of about
``1/N − 1/(N·H·W)``, 0.16% with the code's 10 clients × 64 samples).

Evaluation follows the paper (Sec. 4.1): the round's clients recompute their statistics
under the *new* global weights and these, pooled with lambda = 1, normalise the test set; so the
statistics used at test time describe the evaluated weights rather than lagging one round.

Two presets: ``paper`` (the default: statistics from all local data, pure local
statistics uploaded, lambda 0.01, alpha local, round T+1) and ``reference-code`` (the released
code's choices: statistics from the client's first 64 samples in the code's class-sorted order,
with the training augmentation, the hybrid statistics of that forward uploaded, lambda 0.002,
alpha averaged into the global model, a client's own alpha kept after its first round and used in
its re-syncs, no round T+1). docs/hbn.md lists what still differs from the code. The code's
``sigmoid(+alpha)`` convention is a relabelling of the same parameter (alpha starts at 0 and the
mix is symmetric), so training is identical; fednorm always reports the batch weight, which does
not depend on the sign.

The statistics-only round T+1 of Algorithm 1 runs after the last round (:meth:`HBN.final_state`):
a fresh sample of clients computes statistics under the final weights; pooled (lambda = 1, so they
describe the final weights rather than 1% of them) they give ``final_model.pt`` and the summary's
``final_sync`` accuracy. The resumable checkpoint keeps the training state.

The statistics exchanges the server runs (the initial pass, every evaluation re-sync, round T+1)
are one pass (``sync_pass="single"``: each client's pass in ``stats_mode``, one exchange) or the
exact layer-wise pass (``"layerwise"``): one exchange per HBN layer, each client measuring the next
layer's input in inference mode with the layers before it normalised by the statistics this pass
pooled for them. Only the latter gives what A.2 calls the pool, the "ideal global statistics"
``S(ω_g; D_g)`` of the model as it is evaluated, for layers after the first (docs/hbn.md). The
round's own pass (Eq. 7) is uploaded with the trained weights, one exchange (Algorithm 1), so it is
always one pass.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from ..errors import ConfigError
from ..nn.functional import pooled_stats
from ..nn.hbn import HybridBatchNorm, collect_hbn_layer_statistics, collect_hbn_statistics
from ..nn.stacked import StackedHybridBatchNorm, collect_stacked_hbn_statistics
from ..nn.state import state_keys
from ..rng import torch_generator
from .base import ClientContext, ClientUpdates, ServerView, StackedClientContext
from .fedavg import FedAvg
from .policy import NormPolicy
from .registry import register_method

__all__ = ["HBN"]

OWN_ALPHA = "hbn.own."  # bank prefix of a client's own alpha in alpha_mode="global_init"
LAYER_QUERY = "statistics-layer-"  # + k: step k of the layer-wise pass (the k-th HBN layer to run)


def _layer_index(query: str) -> int | None:
    """k of a layer-wise statistics query ``"statistics-layer-<k>"``, else None."""
    if not query.startswith(LAYER_QUERY):
        return None
    return int(query[len(LAYER_QUERY):])


@register_method("hbn")
class HBN(FedAvg):
    """FedAvg with HBN layers: a statistics pass per round, exact pooled global statistics.

    Args:
        preset: fills every option left unset (``None``): ``"default"`` (the paper's choices, but the
            global statistics start from an initial statistics pass and follow a bias-corrected
            EMA, so short runs learn; chosen by measurement, docs/hbn.md), ``"paper"`` (exactly the
            paper) or ``"reference-code"`` (the released code).
        stats_momentum: lambda of Eq. 11, the weight of the new pooled statistics
            (paper: 0.01; the released code: 0.002; 1 = no smoothing).
        stats_mode: forward of earlier layers during a one-exchange statistics pass (the
            round's, and the server's with ``sync_pass="single"``): ``"train"`` (hybrid
            normalisation, as the code) or ``"eval"`` (the global statistics the model holds).
            (default: "train")
        sync_pass: the statistics exchanges the server runs (``initial_pass``, ``eval_resync``,
            ``final_sync``): ``"single"`` (one exchange, each client's pass in ``stats_mode``) or
            ``"layerwise"`` (one exchange per HBN layer, in inference mode, earlier layers
            normalised with the statistics pooled in the exchanges before: the exact statistics
            of the model as evaluated, A.2's ``S(ω_g; D_g)``; L exchanges, each a forward of the
            network's prefix up to its layer). (default: "single" in every preset)
        stats_samples: which local samples every statistics pass (round start, evaluation
            re-sync, round T+1) uses: ``"all"`` (paper), ``"random"`` (a seeded subset of
            ``stats_max_samples``, the paper's Sec. 5 variant), ``"first"`` (the first
            ``stats_max_samples`` in stored, i.e. dataset-index, order) or ``"first_by_class"``
            (the first ``stats_max_samples`` after a stable sort by label: the code's one
            unshuffled batch, since its Dirichlet split lists a client's indices class by class).
        stats_max_samples: subset size for the subsets (code: 64; Sec. 5: 128).
        stats_augment: apply the run's training augmentation (random crop + flip, seeded per
            round and client) to the statistics pass, as the code's statistics loader does; a
            no-op when the run trains without augmentation.
        bessel_count: the N of Eq. 8's ``N − 1``: ``"samples"`` (the paper's N and the code's)
            or ``"elements"`` (samples × H × W, the number of values per conv channel).
        upload: ``"local"`` (pure local statistics, paper) or ``"hybrid"`` (the client's
            alpha-mixed statistics of the pass, the code).
        alpha_mode: ``"local"`` (alpha never leaves the client, paper) or ``"global_init"`` (alpha is
            averaged like a weight; a client starts from the global alpha and keeps its own after
            its first round, the code).
        stats_init: how the EMA of Eq. 11 starts: ``"zeros_ones"`` (from (0, 1); paper and code),
            ``"first_round"`` (the first pool replaces (0, 1), then lambda; neither paper nor code) or
            ``"debiased"`` (Adam's bias correction: lambda_t = lambda / (1 − (1 − lambda)^t), so the
            statistics are the pools' own EMA normalised by its weight; about the mean of the pools
            while t ≪ 1/lambda, lambda in the long run).
        initial_pass: a statistics-only exchange under the initial weights before round 1, whose
            pool is the first (so round 1 trains with real statistics instead of (0, 1)).
        stats_batch_size: chunk size of the statistics pass. (default: 512)
        eval_resync: the statistics an evaluation normalises with. ``"round"`` (or True): the
            round's clients recompute theirs under the new weights, pooled (the paper's
            protocol; at strong label skew it depends on which clients answered: by up to 10
            points at Dir(0.1) with the one train-mode pass, by up to 5 layer-wise,
            docs/hbn.md); ``"all"``: every client does (a statistics pass over the whole training
            set per evaluation; with ``sync_pass="layerwise"`` and ``stats_samples="all"`` the
            exact statistics of the clients' union, with one pass only for the first HBN layer);
            ``"off"`` (or False): the global buffers. (default: "round")
        final_sync: run the statistics-only round T+1 after training (paper: True; the code has
            no such round: False).
        weighting: FedAvg weights. (default: "num_examples", as the code)
        mix: how training mixes batch and global statistics (Eq. 9), for HBN's ablation (Table 6):
            ``"learned"`` (the paper: the batch weight ``sigmoid(−alpha)`` is learnt per client),
            ``"fixed"`` (alpha frozen at 0: a fixed 1:1 mix, Table 6 row 5), ``"global"`` (batch
            weight 0: only the global statistics, row 3) or ``"batch"`` (batch weight 1: plain
            BN in training, the global statistics at evaluation, row 4). (default: "learned")
        pooling: how the server pools the clients' statistics (Eq. 8): ``"exact"`` (the paper:
            within- plus between-client variance, Bessel's N − 1) or ``"mean"`` (the count-weighted
            average of the local means and variances, no between-client term, no N − 1: Table 6
            row 2). (default: "exact")
    """

    name = "hbn"
    stacks_across_runs = True  # its stacked hooks read each row's seed and global state from the context
    default_policy = NormPolicy("drop", "global")  # the global statistics come from the pooled statistics pass (Eq. 8, 11)
    allowed_buffers = ("drop",)
    allowed_affine = ("global",)
    PRESETS: dict[str, dict[str, Any]] = {
        "paper": dict(stats_momentum=0.01, stats_samples="all", stats_max_samples=None, upload="local",
                      alpha_mode="local", stats_init="zeros_ones", initial_pass=False,
                      bessel_count="samples", stats_augment=False, final_sync=True, sync_pass="single"),
        "reference-code": dict(stats_momentum=0.002, stats_samples="first_by_class", stats_max_samples=64, upload="hybrid",
                               alpha_mode="global_init", stats_init="zeros_ones", initial_pass=False,
                               bessel_count="samples", stats_augment=True, final_sync=False, sync_pass="single"),
    }
    # Without a preset: the paper, except that the statistics start from the initial weights'
    # pool and average the pools while few have been taken (issue 17.3: the (0, 1) start held the
    # paper preset at 37% after 5 rounds on digits where FedAvg+BN reaches 84-90%).
    PRESETS["default"] = dict(PRESETS["paper"], stats_init="debiased", initial_pass=True)
    #: alpha of the ablations' fixed mixes (``mix``): sigmoid(−alpha) is 0.5, exactly 0 or exactly 1
    #: in float32 and float64 (exp(±1e4) under- or overflows), and alpha stays frozen there.
    MIX_ALPHA: dict[str, float | None] = {"learned": None, "fixed": 0.0, "global": 1e4, "batch": -1e4}

    def __init__(
        self,
        preset: Literal["default", "paper", "reference-code"] = "default",
        stats_momentum: float | None = None,
        stats_mode: Literal["train", "eval"] = "train",
        sync_pass: Literal["single", "layerwise"] | None = None,
        stats_samples: Literal["all", "random", "first", "first_by_class"] | None = None,
        stats_max_samples: int | None = None,
        stats_augment: bool | None = None,
        bessel_count: Literal["samples", "elements"] | None = None,
        upload: Literal["local", "hybrid"] | None = None,
        alpha_mode: Literal["local", "global_init"] | None = None,
        stats_init: Literal["zeros_ones", "first_round", "debiased"] | None = None,
        initial_pass: bool | None = None,
        stats_batch_size: int = 512,
        eval_resync: bool | Literal["round", "all", "off"] = "round",
        final_sync: bool | None = None,
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        mix: Literal["learned", "fixed", "global", "batch"] = "learned",
        pooling: Literal["exact", "mean"] = "exact",
    ) -> None:
        super().__init__(weighting=weighting)
        preset = str(preset).replace("_", "-")
        if preset not in self.PRESETS:
            raise ConfigError(f"Unknown value '{preset}' for argument preset. Valid values are {{default, paper, reference-code}}")
        base = self.PRESETS[preset]
        stats_momentum = base["stats_momentum"] if stats_momentum is None else stats_momentum
        stats_samples = stats_samples or base["stats_samples"]
        stats_max_samples = base["stats_max_samples"] if stats_max_samples is None else stats_max_samples
        upload = upload or base["upload"]
        alpha_mode = alpha_mode or base["alpha_mode"]
        stats_init = stats_init or base["stats_init"]
        bessel_count = bessel_count or base["bessel_count"]
        stats_augment = base["stats_augment"] if stats_augment is None else stats_augment
        final_sync = base["final_sync"] if final_sync is None else final_sync
        sync_pass = sync_pass or base["sync_pass"]
        if not (isinstance(stats_momentum, (int, float)) and 0 < stats_momentum <= 1):
            raise ConfigError(f"stats_momentum (lambda, Eq. 11) must be in (0, 1], got {stats_momentum!r}")
        choices = {"stats_mode": (stats_mode, ("train", "eval")), "sync_pass": (sync_pass, ("single", "layerwise")),
                   "stats_samples": (stats_samples, ("all", "random", "first", "first_by_class")),
                   "upload": (upload, ("local", "hybrid")), "alpha_mode": (alpha_mode, ("local", "global_init")),
                   "stats_init": (stats_init, ("zeros_ones", "first_round", "debiased")),
                   "bessel_count": (bessel_count, ("samples", "elements")),
                   "mix": (mix, tuple(self.MIX_ALPHA)), "pooling": (pooling, ("exact", "mean"))}
        for arg, (value, valid) in choices.items():
            if value not in valid:
                raise ConfigError(f"Unknown value '{value}' for argument {arg}. Valid values are {{{', '.join(valid)}}}")
        resync = {True: "round", False: "off"}[eval_resync] if isinstance(eval_resync, bool) else eval_resync
        if resync not in ("round", "all", "off"):
            raise ConfigError(f"Unknown value '{eval_resync}' for argument eval_resync. Valid values are {{round, all, off}} "
                              "(or true / false)")
        if not (isinstance(stats_batch_size, int) and stats_batch_size >= 2):
            raise ConfigError(f"stats_batch_size must be an integer >= 2, got {stats_batch_size!r}")
        if stats_samples != "all" and not (isinstance(stats_max_samples, int) and stats_max_samples >= 2):
            raise ConfigError(f"stats_samples='{stats_samples}' needs stats_max_samples >= 2, got {stats_max_samples!r}")
        self.preset = preset
        self.stats_momentum = float(stats_momentum)
        self.stats_mode = stats_mode
        self.sync_pass = sync_pass
        self.stats_samples = stats_samples
        self.stats_max_samples = stats_max_samples
        self.upload = upload
        self.alpha_mode = alpha_mode
        self.stats_init = stats_init
        self.bessel_count = bessel_count
        self.stats_augment = bool(stats_augment)
        self.initial_pass = bool(base["initial_pass"] if initial_pass is None else initial_pass)
        self.stats_batch_size = stats_batch_size
        self.eval_resync = resync
        self.final_sync = bool(final_sync)
        self.mix = mix
        self.pooling = pooling
        self.layers: list[str] = []
        self._last_round_clients: list[int] = []
        self._initialised = False
        self._pools = 0  # pooled statistics applied so far (the debiased EMA's t)
        self._sync_exchanges = 0  # statistics exchanges the server ran (queries; the rounds' uploads are counted by the engine)

    # -- model policy -----------------------------------------------------------------------
    def setup(self, model: nn.Module) -> None:
        self.layers = [name for name, m in model.named_modules() if isinstance(m, HybridBatchNorm)]
        if not self.layers:
            raise ConfigError("method 'hbn' needs HBN layers: use norm 'hbn' (or convert_to_hybrid on your model)")
        self._alpha_keys = sorted(self.alpha_keys(model))
        value = self.MIX_ALPHA[self.mix]
        if value is not None:  # Table 6's fixed mixes: alpha set once and never trained
            for m in model.modules():
                if isinstance(m, HybridBatchNorm):
                    with torch.no_grad():
                        m.alpha.fill_(value)
                    m.alpha.requires_grad_(False)
        super().setup(model)

    def alpha_keys(self, model: nn.Module) -> set[str]:
        return state_keys(model, lambda m: isinstance(m, HybridBatchNorm), names=HybridBatchNorm.local_tensors)

    def select_local_keys(self, model: nn.Module) -> set[str]:
        """alpha (HBN Eq. 9) is configured per client and never communicated (paper)."""
        return self.alpha_keys(model) if self.alpha_mode == "local" else set()

    # -- client -----------------------------------------------------------------------------
    def statistics_sample(
        self, x: torch.Tensor, server_round: int, client_id: int, y: torch.Tensor | None = None, seed: int | None = None
    ) -> torch.Tensor:
        """The samples of the statistics pass (``stats_samples``); ``y`` orders ``first_by_class``;
        ``seed`` is the run's (default: the method's own; a stacked chunk passes each row's)."""
        m = self.stats_max_samples
        if self.stats_samples == "all" or m is None or len(x) <= m:
            return x
        if self.stats_samples == "first":
            return x[:m]
        if self.stats_samples == "first_by_class":
            if y is None:
                raise ValueError("stats_samples='first_by_class' needs the labels y")
            return x.index_select(0, torch.sort(y, stable=True).indices[:m].to(x.device))
        gen = torch_generator(getattr(self, "seed", 0) if seed is None else seed, "hbn-statistics", server_round, client_id)
        return x.index_select(0, torch.randperm(len(x), generator=gen)[:m].to(x.device))

    def statistics_input(self, ctx: ClientContext, phase: str) -> torch.Tensor:
        """The statistics pass's input for one client: :meth:`statistics_sample`, then, with
        ``stats_augment``, the run's training augmentation (seeded by ``phase``, round, client;
        the code's statistics loader draws fresh crops and flips on every pass)."""
        return self._statistics_input(ctx.x, ctx.y, ctx.server_round, ctx.client_id, phase)

    def _statistics_input(self, x: torch.Tensor, y: torch.Tensor, server_round: int, client_id: int, phase: str,
                          seed: int | None = None) -> torch.Tensor:
        seed = self.seed if seed is None else seed
        x = self.statistics_sample(x, server_round, client_id, y, seed=seed)
        augmentation = self.train_augmentation  # the training loop's
        if self.stats_augment and augmentation is not None and x.dim() == 4:
            # drawn on the CPU and moved, as training's augmentation: the same crops on every device
            x = augmentation(x, self._augment_stream(seed, phase, server_round, client_id))
        return x

    @staticmethod
    def _augment_stream(seed: int, phase: str, server_round: int, client_id: int) -> torch.Generator:
        """The crops and flips of a client's statistics pass: one stream, whichever path draws them."""
        return torch_generator(seed, "hbn-statistics-augment", phase, server_round, client_id)

    def client_statistics(self, model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Eq. 7: per HBN layer, exact (count, mean, biased var) of its input on ``x``; with
        ``upload="hybrid"`` the alpha-mixed statistics the code uploads instead. ``count`` is
        what Eq. 8 weights by and takes Bessel's N from (``bessel_count``): ``len(x)`` for
        ``"samples"``; the values per channel (samples × H × W) for ``"elements"``. Both give
        the same pooled mean, since every client's count is scaled by the same H × W."""
        stats = collect_hbn_statistics(model, self._statistics_batches(x), train_mode=self.stats_mode == "train",
                                       channels_last=self.channels_last)
        modules = dict(model.named_modules())
        return self._statistics_upload(
            stats, len(x), lambda name: (modules[name].batch_weight, modules[name].global_mean, modules[name].global_var)
        )

    def _statistics_batches(self, x: torch.Tensor, train_mode: bool | None = None) -> list[torch.Tensor]:
        train_mode = self.stats_mode == "train" if train_mode is None else train_mode
        batches = list(x.split(self.stats_batch_size))
        if len(batches) > 1 and len(batches[-1]) < 2 and train_mode:
            batches[-2] = torch.cat(batches[-2:])  # a batch of one has no batch variance
            batches.pop()
        return batches

    def _statistics_upload(self, stats: dict[str, Any], num_samples: int, mix: Any) -> dict[str, torch.Tensor]:
        """The upload from a pass's ``{layer: HBNStats}``; ``mix(layer)`` gives the client's
        ``(batch weight, global mean, global var)`` for ``upload="hybrid"``."""
        out = {}
        for name in self.layers:
            out.update(self._layer_upload(name, stats[name], num_samples, mix))
        return out

    def _layer_upload(self, name: str, s: Any, num_samples: int, mix: Any) -> dict[str, torch.Tensor]:
        """One layer's entries of an upload (:meth:`_statistics_upload`) from its ``HBNStats``."""
        mean, var = s.mean, s.var
        if self.upload == "hybrid":
            w, global_mean, global_var = mix(name)
            w = w.detach().to(mean.dtype)
            mean = w * mean + (1 - w) * global_mean.to(mean.dtype)
            var = w * var + (1 - w) * global_var.to(var.dtype)
        count = s.count if self.bessel_count == "elements" else torch.tensor(float(num_samples), dtype=torch.float64)
        return {f"hbn.{name}.count": count.reshape(()).to(device=mean.device), f"hbn.{name}.mean": mean, f"hbn.{name}.var": var}

    def client_layer_statistics(self, model: nn.Module, x: torch.Tensor, index: int) -> dict[str, torch.Tensor]:
        """Step ``index`` of the layer-wise pass on one client: the upload entries (as
        :meth:`client_statistics`) of the ``index``-th HBN layer to run, in inference mode, the
        layers before it normalised by what ``model`` holds (the server's pools of the earlier
        steps); ``{}`` when ``x`` reaches fewer layers."""
        found = collect_hbn_layer_statistics(model, self._statistics_batches(x, train_mode=False), index,
                                             channels_last=self.channels_last)
        if found is None:
            return {}
        name, s = found
        layer = dict(model.named_modules())[name]
        return self._layer_upload(name, s, len(x), lambda _: (layer.batch_weight, layer.global_mean, layer.global_var))

    def _load_own_alpha(self, ctx: ClientContext) -> None:
        """``alpha_mode="global_init"``: the client's own alpha once it has one, as the code's
        clients load theirs (``buffer_w``) before training and before every statistics pass."""
        if self.alpha_mode != "global_init":
            return
        own = {k[len(OWN_ALPHA):]: v for k, v in ctx.local_state.items() if k.startswith(OWN_ALPHA)}
        if own:
            state = ctx.model.state_dict()
            state.update(own)
            ctx.model.load_state_dict(state)

    def client_begin(self, ctx: ClientContext) -> None:
        self._load_own_alpha(ctx)
        if ctx.num_examples == 0:
            ctx.uploads.update(self._empty_statistics(ctx.model))
            return
        ctx.uploads.update(self.client_statistics(ctx.model, self.statistics_input(ctx, "round")))

    def client_end(self, ctx: ClientContext) -> None:
        if self.alpha_mode == "global_init":
            state = ctx.model.state_dict()
            ctx.local_state.update({OWN_ALPHA + k: state[k].detach().clone() for k in self._alpha_keys})

    def stacked_client_begin(self, ctx: StackedClientContext) -> None:
        """:meth:`client_begin` for a stacked chunk: each client's own alpha (``global_init``),
        then every client's statistics pass under the downloaded weights, run together."""
        for upload, stats in zip(ctx.uploads, self._stacked_statistics(ctx, "round")):
            upload.update(stats)

    def stacked_client_query(self, query: str, ctx: StackedClientContext) -> list[dict[str, torch.Tensor]] | None:
        """:meth:`client_query` for a stacked chunk: the statistics passes run together. A step
        of the layer-wise pass runs the whole network (the stacked pass does not stop at the
        measured layer) and answers that layer's entries, equal to the per-client step's."""
        index = _layer_index(query)
        if query != "statistics" and index is None:
            return None
        return self._stacked_statistics(ctx, "query", layer=index)

    def _stacked_statistics(self, ctx: StackedClientContext, phase: str, layer: int | None = None) -> list[dict[str, torch.Tensor]]:
        """Each client's statistics upload from one stacked pass (own alpha loaded first); with
        ``layer``, step ``layer`` of the layer-wise pass (inference mode, the entries of the
        ``layer``-th HBN layer to run; ``{}`` for a client without data or where fewer run)."""
        net = ctx.model
        if self.alpha_mode == "global_init":
            with torch.no_grad():
                tensors = net.state_dict(keep_vars=True)
                for i, local in enumerate(ctx.local_states):
                    for key, value in local.items():
                        if key.startswith(OWN_ALPHA):
                            tensors[key[len(OWN_ALPHA):]][i].copy_(value)
        inputs = self._stacked_inputs(ctx, phase)
        train_mode = self.stats_mode == "train" and layer is None
        order: list[str] = []  # the HBN layers in the order of their first calls (layer-wise step)
        hooks = [] if layer is None else [
            m.register_forward_pre_hook(lambda _m, _args, name=name: None if name in order else order.append(name))
            for name, m in net.named_modules() if isinstance(m, StackedHybridBatchNorm)
        ]
        try:
            stats = collect_stacked_hbn_statistics(
                net, [self._statistics_batches(x, train_mode) if len(x) else [] for x in inputs], train_mode=train_mode,
                channels_last=self.channels_last,
            )
        finally:
            for hook in hooks:
                hook.remove()
        state = net.state_dict()
        out = []
        for i, x in enumerate(inputs):
            mix = lambda name, i=i: (  # noqa: E731
                torch.sigmoid(-state[f"{name}.alpha"][i]), state[f"{name}.running_mean"][i], state[f"{name}.running_var"][i])
            if layer is not None:
                found = len(x) > 0 and layer < len(order)
                out.append(self._layer_upload(order[layer], stats[i][order[layer]], len(x), mix) if found else {})
            elif len(x) == 0:
                out.append(self._empty_statistics(net))
            else:
                out.append(self._statistics_upload(stats[i], len(x), mix))
        return out

    def _stacked_inputs(self, ctx: StackedClientContext, phase: str) -> list[torch.Tensor]:
        """Each client's statistics input (:meth:`_statistics_input`; a client without data: its empty
        ``x``). With ``stats_augment`` where the executor gathers by index (``ctx.crop_rows``), the
        chosen samples are dataset rows, cropped and flipped for all clients by one gather from the
        same streams as the per-client path, bit for bit (no per-client copy, pad and crop)."""
        augmentation = self.train_augmentation
        if self.stats_augment and augmentation is not None and ctx.crop_rows is not None:
            picked, gens = [], []
            for i, (rows, cid) in enumerate(zip(ctx.rows, ctx.client_ids)):
                seed = ctx.seed_of(i, self.seed)
                if len(rows):
                    y = ctx.y[i] if self.stats_samples == "first_by_class" else None
                    picked.append(self.statistics_sample(rows, ctx.server_round, cid, y, seed=seed))
                    gens.append(self._augment_stream(seed, phase, ctx.server_round, cid))
            crops = ctx.crop_rows(picked, gens, augmentation) if picked else []
            if crops is not None:
                it = iter(crops)
                return [next(it) if len(rows) else ctx.x[i] for i, rows in enumerate(ctx.rows)]
        return [self._statistics_input(x, y, ctx.server_round, cid, phase, seed=ctx.seed_of(i, self.seed)) if len(x) else x
                for i, (x, y, cid) in enumerate(zip(ctx.x, ctx.y, ctx.client_ids))]

    def stacked_client_end(self, ctx: StackedClientContext) -> None:
        if self.alpha_mode == "global_init":
            state = ctx.model.state_dict()
            for i, local in enumerate(ctx.local_states):
                local.update({OWN_ALPHA + k: state[k][i].detach().clone() for k in self._alpha_keys})

    def _empty_statistics(self, model: nn.Module) -> dict[str, torch.Tensor]:
        modules = dict(model.named_modules())
        out = {}
        for name in self.layers:
            c, dev = modules[name].num_features, modules[name].running_mean.device
            out[f"hbn.{name}.count"] = torch.zeros((), dtype=torch.float64, device=dev)
            out[f"hbn.{name}.mean"] = torch.zeros(c, dtype=torch.float64, device=dev)
            out[f"hbn.{name}.var"] = torch.zeros(c, dtype=torch.float64, device=dev)
        return out

    def client_query(self, query: str, ctx: ClientContext) -> dict[str, torch.Tensor]:
        """``"statistics"``: the client's statistics pass under the model as it is (the evaluation
        re-sync and round T+1), on the same samples as the round's pass (``stats_samples``) and
        with its own alpha under ``global_init``, as the code's re-sync runs its statistics pass.
        ``"statistics-layer-<k>"``: step k of the layer-wise pass on the same samples
        (:meth:`client_layer_statistics`); ``{}`` from a client without data."""
        index = _layer_index(query)
        if query != "statistics" and index is None:
            return super().client_query(query, ctx)
        self._load_own_alpha(ctx)
        if index is not None:
            return self.client_layer_statistics(ctx.model, self.statistics_input(ctx, "query"), index) if ctx.num_examples else {}
        if ctx.num_examples == 0:
            return self._empty_statistics(ctx.model)
        return self.client_statistics(ctx.model, self.statistics_input(ctx, "query"))

    # -- server -----------------------------------------------------------------------------
    def configure_round(self, server_round: int, client_ids: list[int]) -> None:
        self._last_round_clients = list(client_ids)

    def pooled(self, extras: dict[str, torch.Tensor], name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Eq. 8: pooled mean and Bessel variance of one layer's input over the clients, with the
        uploaded counts as weights and N (``bessel_count``)."""
        count = extras[f"hbn.{name}.count"].reshape(-1)
        if float(count.sum()) < 2:
            return None
        if self.pooling == "mean":  # Table 6 row 2: the plain weighted average of the local statistics
            w = (count / count.sum()).unsqueeze(-1).to(extras[f"hbn.{name}.mean"].dtype)
            return (w * extras[f"hbn.{name}.mean"]).sum(0), (w * extras[f"hbn.{name}.var"]).sum(0)
        _, mean, var = pooled_stats(count, extras[f"hbn.{name}.mean"], extras[f"hbn.{name}.var"], unbiased=True)
        return mean, var

    def aggregate(
        self, server_round: int, global_state: dict[str, torch.Tensor], updates: ClientUpdates
    ) -> dict[str, torch.Tensor]:
        new = super().aggregate(server_round, global_state, updates)
        lam = self.effective_momentum(self._pools + 1)
        self._initialised = True
        self._pools += 1
        for name in self.layers:
            pooled = self.pooled(updates.extras, name)
            if pooled is None:
                continue
            for key, value in zip(("running_mean", "running_var"), pooled):
                old = global_state[f"{name}.{key}"]
                new[f"{name}.{key}"] = ((1 - lam) * old.double() + lam * value).to(old.dtype)  # Eq. 11
        return new

    def effective_momentum(self, t: int) -> float:
        """lambda of Eq. 11 for the t-th pooled update (t = 1, 2, ...), by ``stats_init``.

        ``zeros_ones``: lambda throughout (the EMA starts from (0, 1)). ``first_round``: 1 at t = 1,
        then lambda. ``debiased``: ``lambda / (1 − (1 − lambda)^t)``, Adam's bias correction of an
        EMA started at zero, written as a schedule: the result is the EMA of the pools alone,
        normalised by the weight they carry, so the (0, 1) start never enters (1 at t = 1, about
        1/t while t ≪ 1/lambda, lambda in the long run).
        """
        lam = self.stats_momentum
        if self.stats_init == "first_round":
            return 1.0 if t == 1 else lam
        if self.stats_init == "debiased":
            return lam / (1.0 - (1.0 - lam) ** t)
        return lam

    # -- evaluation -------------------------------------------------------------------------
    def synced_state(self, sim: ServerView, client_ids: list[int]) -> dict[str, torch.Tensor]:
        """The global state with statistics recomputed by ``client_ids`` under the current
        weights and pooled with lambda = 1 (Eq. 8 only), by ``sync_pass``."""
        if self.sync_pass == "layerwise":
            return self.layerwise_state(sim, client_ids)
        answers = sim.query_clients(client_ids, "statistics")
        self._sync_exchanges += 1
        uploads = [answers[cid] for cid in client_ids]
        extras = {k: torch.stack([u[k] for u in uploads]) for k in uploads[0]}
        state = dict(sim.global_state)
        for name in self.layers:
            pooled = self.pooled(extras, name)
            if pooled is None:
                continue
            for key, value in zip(("running_mean", "running_var"), pooled):
                state[f"{name}.{key}"] = value.to(state[f"{name}.{key}"].dtype)
        return state

    def layerwise_state(self, sim: ServerView, client_ids: list[int]) -> dict[str, torch.Tensor]:
        """The layer-wise pass: exchange k asks ``client_ids`` for the input statistics of the
        k-th HBN layer to run, in inference mode, under the global state with the pools of
        exchanges 0..k−1 loaded, and pools them (Eq. 8, lambda = 1). The result is the exact
        statistics of every layer's input over the clients' data when the model runs as it is
        evaluated, i.e. with these statistics: A.2's ``S(ω_g; D_g)``. One exchange per layer."""
        state = dict(sim.global_state)
        for index in range(len(self.layers)):
            answers = sim.query_clients(client_ids, f"{LAYER_QUERY}{index}", state)
            self._sync_exchanges += 1
            uploads = [answers[cid] for cid in client_ids if answers[cid]]
            if not uploads:  # no client's data reaches a layer this deep
                break
            names = {key[len("hbn."):-len(".count")] for u in uploads for key in u if key.endswith(".count")}
            if len(names) != 1:
                raise RuntimeError(f"layer-wise HBN statistics: the clients' step {index} measured different layers "
                                   f"{sorted(names)}; their models must run the HBN layers in one order")
            name = names.pop()
            pooled = self.pooled({k: torch.stack([u[k] for u in uploads]) for k in uploads[0]}, name)
            if pooled is None:
                continue
            for key, value in zip(("running_mean", "running_var"), pooled):
                state[f"{name}.{key}"] = value.to(state[f"{name}.{key}"].dtype)
        return state

    def evaluation_state(self, sim: ServerView) -> dict[str, torch.Tensor]:
        """The round's (or every) clients' statistics under the new weights, pooled with
        lambda = 1 (Chen et al., 2025, Sec. 4.1); the global buffers with ``eval_resync="off"`` or
        before round 1."""
        if self.eval_resync == "off" or not self._last_round_clients:
            return sim.global_state
        return self.synced_state(sim, sim.all_clients() if self.eval_resync == "all" else self._last_round_clients)

    def initial_state(self, sim: ServerView) -> dict[str, torch.Tensor] | None:
        """``initial_pass``: a statistics-only exchange before round 1 (the mirror of round T+1),
        whose pool replaces the (0, 1) start, so round 1 already trains with the statistics of the
        initial weights instead of mixing in (0, 1). Counts as the schedule's first pool."""
        if not self.initial_pass or self._pools:
            return None
        self._pools = 1
        self._initialised = True
        return self.synced_state(sim, sim.sample_clients(0))

    def final_state(self, sim: ServerView) -> dict[str, torch.Tensor] | None:
        """Algorithm 1's round T+1: statistics only, from a fresh sample of clients, weights unchanged."""
        if not self.final_sync:
            return None
        return self.synced_state(sim, sim.sample_clients(sim.server_round + 1))

    def report(self, sim: ServerView) -> dict[str, Any]:
        """Learned mixing per layer (the paper never reports it): the batch-statistics weight
        ``sigmoid(-alpha)`` averaged over channels, as mean/min/max over the clients that trained."""
        out: dict[str, Any] = {}
        bank = sim.collect_bank()
        for name in self.layers:
            key = f"{name}.alpha" if self.alpha_mode == "local" else f"{OWN_ALPHA}{name}.alpha"
            weights = [torch.sigmoid(-bank[c][key]).mean().item() for c in sorted(bank) if key in bank[c]]
            if weights:
                out[name] = {
                    "batch_weight_mean": sum(weights) / len(weights),
                    "batch_weight_min": min(weights),
                    "batch_weight_max": max(weights),
                    "clients": len(weights),
                }
        # The statistics exchanges the server ran outside the rounds (initial pass, evaluation
        # re-syncs, round T+1): one each with sync_pass "single", one per HBN layer with
        # "layerwise". The rounds' own statistics travel with the weights and are counted by the
        # engine with the uploads (uplink_bytes).
        sync = {"pass": self.sync_pass, "exchanges": self._sync_exchanges}
        return {**super().report(sim), "hbn_batch_weight": out, "hbn_statistics_sync": sync}

    def state_dict(self) -> dict[str, Any]:
        return {"initialised": self._initialised, "pools": self._pools, "last_round_clients": list(self._last_round_clients),
                "sync_exchanges": self._sync_exchanges}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._initialised = bool(state.get("initialised", False))
        self._pools = int(state.get("pools", int(self._initialised)))
        self._last_round_clients = list(state.get("last_round_clients", []))
        self._sync_exchanges = int(state.get("sync_exchanges", 0))

    def hparams(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "stats_momentum": self.stats_momentum,
            "stats_mode": self.stats_mode,
            "sync_pass": self.sync_pass,
            "stats_samples": self.stats_samples,
            "stats_max_samples": self.stats_max_samples,
            "upload": self.upload,
            "alpha_mode": self.alpha_mode,
            "stats_init": self.stats_init,
            "bessel_count": self.bessel_count,
            "stats_augment": self.stats_augment,
            "initial_pass": self.initial_pass,
            "final_sync": self.final_sync,
            "eval_resync": self.eval_resync,
            "mix": self.mix,
            "pooling": self.pooling,
            "weighting": self.weighting,
        }

