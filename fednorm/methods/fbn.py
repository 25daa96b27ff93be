"""FBN: Federated BatchNorm and robust FBN (Guerraoui et al., 2024, "Overcoming the Challenges of
Batch Normalization in Federated Learning").

Every client normalises with the shared running statistics of the previous round (the FBN
layers' buffers, :mod:`fednorm.nn.fbn`); during local training the layers record each batch's
``(count, mean, biased var)``; at the end of the round the client uploads its local copy of the
running statistics (Algorithm 2, steps 5–7) besides its weights, and the server aggregates them
with the between-client correction (Eq. 9–10) so that the shared statistics equal centralized
BatchNorm's running statistics on the union of the clients' batches.

Design choices (docs/fbn.md):

* **Unbiasing factor on the server** (fednorm's choice). Clients upload Eq. 6 *without*
  the ``Kn/(Kn−1)`` factor (a client cannot know the global count when clients drop out or hold
  unequal batches) together with their count K_i; the server applies ``c = M/(M−1)``,
  ``M = ΣK_i``, and count weights ``K_i/M``. With equal counts and the plain mean this is exactly
  Algorithm 2.
* **DSGD** (``dsgd: true``, one step per round) is the paper's setting (Algorithm 3); both modes
  below coincide there.
* **More local steps** (not in the paper), ``mode``:

  - ``exact`` (default; ``fbn_exact``): every step of the round normalises with the
    round-start statistics; the client uploads one one-step local copy per step (``[E, C]``);
    the server aggregates each step with Eq. 9–10 and replays the centralized EMA over the E
    union batches. Exact for any E (tested in float64). Needs the same E on every client (use
    ``dsgd`` or ``local_steps``).
  - ``literal`` (``fbn_literal``): the client applies steps 5–6 E times from the shared
    statistics and uploads the result; the server applies Eq. 9–10 once. Exact only for E = 1:
    the between-client term then mixes E steps, so the β-correction is no longer exact.
  - ``round_average``: the FBN baseline of HBN's released code
    (``FedBaseline/models/FBN``), which made HBN Table 1's FBN row. The client uploads the
    uniform average of its round's per-batch means and biased variances; the server pools them
    with count weights, μ = Σ N_k μ_k / N, and moves the shared statistics a momentum step
    toward them, then computes σ² = Σ N_k [σ_k² + (μ_k − μ̃)²] / (N − 1) about the *smoothed*
    mean μ̃ (as the code does) and moves the variance the same way. Not centralized BatchNorm
    for any E; every batch of the round counts, where ``literal`` keeps mostly the last few.
    N_k is the client's number of training samples (``num_examples``, the code's dataset size).
* **Robust FBN** (``aggregator``/``nnm`` in the config; Guerraoui et al., 2024, Sec. 5, as a
  two-stage rule, fednorm's reading of it):
  ``ū_run = Agg(NNM(ū_run^(i)))`` over each client's vector of all layers' means, then
  ``σ̂²_run = max(Agg(NNM(v_i)), 0)`` with the per-client corrected variance
  ``v_i = σ̂²_run^(i) + (c/β)(ū_run^(i) − ū_run)²`` (unbiasing as above). Under the mean this
  is exactly Eq. 9–10. ``robust_variance: literal`` gives the alternative reading
  ``Agg(σ̂²_run^(i)) + (c/β)·Agg((ū_run^(i) − ū_run)²)``. By default (``robust_targets: both``)
  the same rule also combines the weights (the client momentums of Robust-DSGD);
  ``robust_targets: stats`` keeps the weights' mean.
* **Unequal clients** (paper footnote 2; Dirichlet and quantity-skew partitions, drop_last
  remainders). The statistics are always count-weighted (above). In ``exact`` mode a client that
  took fewer steps uploads fewer rows; step e of the replay aggregates the clients that took an
  e-th step, so the shared statistics equal centralized BatchNorm's running statistics over the
  sequence of union batches "every client's e-th batch" (tested in float64).
* **Initial statistics** (``initial_pass``): the paper starts the shared statistics at
  (0, 1), so the first rounds barely normalise. With ``initial_pass`` the round-0 statistics are
  exact statistics of the initial model on the clients' data, from L statistics-only exchanges
  (L FBN layers; each pass recomputes every layer under the statistics set so far, so after pass k
  the first k layers in forward order are exact whatever the module order). Default ``"auto"``:
  on with local epochs/steps (FedAvg), off under DSGD, where the paper's loop stays as written.
* **Weights** (α, ζ and the rest) are averaged with sample-count weights by default
  (fednorm's choice), which is the paper's uniform 1/n when clients hold equal shards (its setting) and keeps
  a client with five samples from weighing as much as one with five hundred otherwise
  (``weighting: uniform`` is the literal 1/n).
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import torch
from torch import nn

from ..errors import ConfigError
from ..nn.fbn import (
    FederatedBatchNorm,
    attach_fbn_recorders,
    corrected_variance,
    detach_fbn_recorders,
    fbn_aggregate,
    fbn_local_update,
    fbn_modules,
    recording_fbn_statistics,
)
from ..nn.functional import pooled_stats
from ..nn.stacked import attach_stacked_fbn_recorders, detach_stacked_fbn_recorders
from .base import ClientContext, ClientUpdates, ServerView, StackedClientContext
from .fedavg import FedAvg, aggregate_group
from .policy import NormPolicy
from .registry import register_method

__all__ = ["FBN", "corrected_variance"]  # corrected_variance: fednorm.nn.fbn's, re-exported


@register_method("fbn")
class FBN(FedAvg):
    """Federated BatchNorm: shared running statistics, exact aggregation (Eq. 9–10), optionally robust.

    Args:
        mode: ``"exact"`` (replay the centralized EMA over the round's steps), ``"literal"``
            (Algorithm 2 applied once per round to E-step local copies; identical under DSGD) or
            ``"round_average"`` (HBN's code: per-round averages, one server EMA step per round).
            (default: ``"exact"``)
        robust_variance: robust rule for the variance: ``"two_stage"`` (aggregate the
            per-client corrected variances, fednorm's reading) or ``"literal"``. (default:
            ``"two_stage"``)
        weighting: weights of the model average: ``"num_examples"`` (count weights; the
            paper's 1/n for equal shards) or ``"uniform"``. (default: ``"num_examples"``)
        initial_pass: start from exact statistics of the initial model (statistics-only
            exchanges before round 1) instead of (0, 1): ``True``, ``False`` or
            ``"auto"`` (on unless the run is DSGD, the paper's loop). (default: ``"auto"``)
        stats_batch_size: chunk size of the statistics pass. (default: 512)
    """

    name = "fbn"
    stacks_across_runs = True  # its stacked hooks read each row's seed and global state from the context
    default_policy = NormPolicy("drop", "global")  # statistics come from the clients' per-step uploads (Eq. 9-10)
    allowed_buffers = ("drop",)
    allowed_affine = ("global",)

    def __init__(
        self,
        mode: Literal["exact", "literal", "round_average"] = "exact",
        robust_variance: Literal["two_stage", "literal"] = "two_stage",
        weighting: Literal["num_examples", "uniform"] = "num_examples",
        initial_pass: bool | Literal["auto"] = "auto",
        stats_batch_size: int = 512,
    ) -> None:
        super().__init__(weighting=weighting)
        if initial_pass not in (True, False, "auto"):
            raise ConfigError(f"Unknown value '{initial_pass}' for argument initial_pass. Valid values are {{true, false, auto}}")
        if stats_batch_size < 2:
            raise ConfigError(f"stats_batch_size must be at least 2, got {stats_batch_size}")
        self.initial_pass = initial_pass
        self.stats_batch_size = stats_batch_size
        if mode not in ("exact", "literal", "round_average"):
            raise ConfigError(f"Unknown value '{mode}' for argument mode. Valid values are {{exact, literal, round_average}}")
        if robust_variance not in ("two_stage", "literal"):
            raise ConfigError(
                f"Unknown value '{robust_variance}' for argument robust_variance. Valid values are {{two_stage, literal}}"
            )
        self.mode = mode
        self.robust_variance = robust_variance
        self.layers: list[str] = []
        self.momenta: dict[str, float] = {}
        self._records: dict[str, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}
        self._warned_literal = False

    # -- model policy -----------------------------------------------------------------------
    def setup(self, model: nn.Module) -> None:
        layers = fbn_modules(model)
        if not layers:
            raise ConfigError("method 'fbn' needs FBN layers: use norm 'fbn' (FederatedBatchNorm2d/1d)")
        others = [n for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, FederatedBatchNorm)]
        if others:
            raise ConfigError(f"method 'fbn' found BatchNorm layers that are not FBN ({others[:3]}); use norm 'fbn' throughout")
        self.layers = [n for n, _ in layers]
        self.momenta = {n: float(m.momentum) for n, m in layers}  # type: ignore[arg-type]
        super().setup(model)

    def statistics_keys(self) -> dict[str, list[str]]:
        """FBN's statistics travel as uploads: the clients' local copies (Algorithm 2, step 7)."""
        return {"mean": [f"fbn.{n}.mean" for n in self.layers], "var": [f"fbn.{n}.var" for n in self.layers]}

    # -- client -----------------------------------------------------------------------------
    def client_begin(self, ctx: ClientContext) -> None:
        self._records = attach_fbn_recorders(ctx.model)

    def client_end(self, ctx: ClientContext) -> None:
        records, self._records = self._records, {}
        detach_fbn_recorders(ctx.model)
        for name in self.layers:
            ctx.uploads.update(self.local_copies(name, records.get(name, []), ctx.global_state))

    def stacked_client_begin(self, ctx: StackedClientContext) -> None:
        """:meth:`client_begin` for a stacked chunk: every client's layers record its batches."""
        self._records = attach_stacked_fbn_recorders(ctx.model)

    def stacked_client_end(self, ctx: StackedClientContext) -> None:
        """:meth:`client_end` for a stacked chunk: each client's steps, picked out of the passes
        it took part in (in order), give exactly the upload the sequential hooks produce."""
        records, self._records = self._records, {}
        detach_stacked_fbn_recorders(ctx.model)
        for name in self.layers:
            rows = records.get(name, [])
            if rows:
                clients, counts, means, variances = (torch.cat(col) for col in zip(*rows))
            for i in range(len(ctx)):
                if not rows:
                    ctx.uploads[i].update(self.local_copies(name, [], ctx.global_state_of(i)))
                    continue
                sel = (clients == i).nonzero().squeeze(1)
                ctx.uploads[i].update(self._copies(
                    name, counts.index_select(0, sel), means.index_select(0, sel), variances.index_select(0, sel), ctx.global_state_of(i)
                ))

    def local_copies(
        self, name: str, steps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], global_state: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """A client's upload for one layer: counts ``[E']``, local copies of mean and var ``[E', C]``.

        ``exact``: one one-step copy per local step (E' = E), each from the round-start shared
        statistics. ``literal``: steps 5–6 chained over the E steps (E' = 1; the count is the mean
        per-step count). Variances use biased batch variances (the server unbiases).
        """
        if not steps:
            ref = global_state[f"{name}.running_mean"]
            empty = torch.zeros(0, ref.numel(), dtype=torch.float64, device=ref.device)
            return self._copies(name, torch.zeros(0, dtype=torch.float64, device=ref.device), empty, empty, global_state)
        counts, means, variances = (torch.stack(col) for col in zip(*steps))
        return self._copies(name, counts, means, variances, global_state)

    def _copies(
        self, name: str, counts: torch.Tensor, means: torch.Tensor, variances: torch.Tensor, global_state: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """:meth:`local_copies` from the steps' ``counts [E]``, batch ``means``/biased ``variances`` ``[E, C]``."""
        beta = self.momenta[name]
        mu0 = global_state[f"{name}.running_mean"].double()
        var0 = global_state[f"{name}.running_var"].double()
        if len(counts) == 0:  # no local step (empty client): count 0, ignored by the server
            return {f"fbn.{name}.count": torch.zeros(1, dtype=torch.float64, device=mu0.device),
                    f"fbn.{name}.mean": mu0.unsqueeze(0).clone(), f"fbn.{name}.var": var0.unsqueeze(0).clone()}
        if self.mode == "exact":
            mean, var = fbn_local_update(mu0, var0, means, variances, beta)  # every step from the round-start statistics
            return {f"fbn.{name}.count": counts, f"fbn.{name}.mean": mean, f"fbn.{name}.var": var}
        if self.mode == "round_average":  # HBN's code: the uniform average over the round's batches
            return {f"fbn.{name}.count": counts.double().sum().reshape(1), f"fbn.{name}.mean": means.double().mean(0, keepdim=True),
                    f"fbn.{name}.var": variances.double().mean(0, keepdim=True)}
        mean, var = mu0, var0
        for m, v in zip(means, variances):
            mean, var = fbn_local_update(mean, var, m, v, beta)
        return {f"fbn.{name}.count": counts.mean().reshape(1), f"fbn.{name}.mean": mean.unsqueeze(0), f"fbn.{name}.var": var.unsqueeze(0)}

    def client_query(self, query: str, ctx: ClientContext) -> dict[str, torch.Tensor]:
        """``"statistics"``: per FBN layer, the exact ``(count, mean, biased var)`` of its input
        over all the client's training samples, every layer normalising with the shared statistics
        of ``ctx.model`` (the initial pass)."""
        if query != "statistics":
            return super().client_query(query, ctx)
        model = ctx.model
        modes = {m: m.training for m in model.modules()}
        model.eval()
        for _, layer in fbn_modules(model):
            layer.train()  # records its batch statistics; normalises with the shared ones either way
        chunks = list(ctx.x.split(self.stats_batch_size)) if len(ctx.x) else []
        if len(chunks) > 1 and len(chunks[-1]) < 2:  # a batch of one sample has no variance in a 1-d layer
            chunks[-2] = torch.cat(chunks[-2:])
            chunks.pop()
        try:
            with torch.no_grad(), recording_fbn_statistics(model) as records:
                for chunk in chunks:
                    model(chunk)
        finally:
            for m, mode in modes.items():
                m.training = mode
        out = {}
        for name in self.layers:
            rows = records.get(name, [])
            if not rows:
                ref = ctx.global_state[f"{name}.running_mean"]
                out[f"fbn.{name}.count"] = torch.zeros((), dtype=torch.float64, device=ref.device)
                out[f"fbn.{name}.mean"] = out[f"fbn.{name}.var"] = torch.zeros(ref.numel(), dtype=torch.float64, device=ref.device)
                continue
            counts, means, variances = (torch.stack(col) for col in zip(*rows))
            total, mean, var = pooled_stats(counts.reshape(-1), means, variances)
            out.update({f"fbn.{name}.count": total.reshape(()), f"fbn.{name}.mean": mean, f"fbn.{name}.var": var})
        return out

    # -- server -----------------------------------------------------------------------------
    def initial_state(self, sim: ServerView) -> dict[str, torch.Tensor] | None:
        """The exact statistics of the initial model on the sampled clients' data:
        L statistics-only exchanges, each recomputing every layer under the statistics set by
        the previous one, so after L passes every layer holds the unbiased statistics of its
        input under the normalisation the model will train with."""
        use = (not sim.config.dsgd) if self.initial_pass == "auto" else bool(self.initial_pass)
        if not use:
            return None
        clients = sim.sample_clients(0)
        state = dict(sim.global_state)
        for _ in self.layers:
            answers = sim.query_clients(clients, "statistics", state)
            rows = [answers[c] for c in clients]
            for name in self.layers:
                count = torch.stack([r[f"fbn.{name}.count"] for r in rows]).reshape(-1)
                if float(count.sum()) < 2:
                    continue
                _, mean, var = pooled_stats(
                    count, torch.stack([r[f"fbn.{name}.mean"] for r in rows]), torch.stack([r[f"fbn.{name}.var"] for r in rows]),
                    unbiased=True,
                )
                for key, value in ((f"{name}.running_mean", mean), (f"{name}.running_var", var)):
                    state[key] = value.to(state[key].dtype)
        return state

    def aggregate(
        self, server_round: int, global_state: dict[str, torch.Tensor], updates: ClientUpdates
    ) -> dict[str, torch.Tensor]:
        stat_keys = {f"{n}.{b}" for n in self.layers for b in FederatedBatchNorm.stat_buffers}
        weights = self.client_weights(updates)
        if float(weights.sum()) <= 0:
            return {k: global_state[k].clone() for k in self.shared_keys}
        if self.robust:
            new = self.robust_aggregate(updates, weights, [k for k in self.shared_keys if k not in stat_keys])
        else:
            new = super().aggregate(server_round, global_state, updates)
        new.update(self.aggregate_statistics(global_state, updates))
        return new

    def aggregate_statistics(self, global_state: dict[str, torch.Tensor], updates: ClientUpdates) -> dict[str, torch.Tensor]:
        """The new shared statistics of every FBN layer (Eq. 9–10, per step, replayed in ``exact`` mode)."""
        if self.mode == "round_average":
            return self._round_average_statistics(global_state, updates)
        ex = updates.extras
        first = self.layers[0]
        num_rows = ex[f"fbn.{first}.count"].shape[1]
        mu0 = {n: global_state[f"{n}.running_mean"].double() for n in self.layers}
        var0 = {n: global_state[f"{n}.running_var"].double() for n in self.layers}
        mean, var = dict(mu0), dict(var0)
        robust = self.stats_aggregator is not None and not self.stats_aggregator.is_mean
        for e in range(num_rows):
            keep = ex[f"fbn.{first}.count"][:, e] > 0
            if int(keep.sum()) == 0 or float(ex[f"fbn.{first}.count"][keep, e].sum()) < 2:
                continue
            if robust and not bool(keep.all()):
                # A robust rule's guarantee needs f < n/2 among the rows it combines: only the
                # steps every client took are replayed (equal with DSGD or local_steps).
                continue
            if self.mode == "literal":
                self._warn_literal(int(updates.num_steps.max()))
                decay: Any = {n: ((1 - self.momenta[n]) ** updates.num_steps.to(keep.device)[keep].double()).unsqueeze(-1) for n in self.layers}
            else:
                decay = {n: 1 - self.momenta[n] for n in self.layers}
            rows = {n: (ex[f"fbn.{n}.count"][keep, e], ex[f"fbn.{n}.mean"][keep, e].double(), ex[f"fbn.{n}.var"][keep, e].double())
                    for n in self.layers}
            step_mean, step_var = self._aggregate_step(rows, var0, decay)
            for n in self.layers:
                a = 1 - self.momenta[n]
                if num_rows == 1:
                    mean[n], var[n] = step_mean[n], step_var[n]
                else:  # replay the centralized EMA: each step's increment applied to the running value
                    mean[n] = a * mean[n] + (step_mean[n] - a * mu0[n])
                    var[n] = a * var[n] + (step_var[n] - a * var0[n])
        out = {}
        for n in self.layers:
            for key, value in ((f"{n}.running_mean", mean[n]), (f"{n}.running_var", var[n].clamp_min(0.0))):
                out[key] = value.to(global_state[key].dtype)
        return out

    def _warn_literal(self, steps: int) -> None:
        """``literal`` with many local steps forgets the shared statistics within the round: say so once."""
        beta = min(self.momenta.values())
        kept = (1 - beta) ** steps
        if self._warned_literal or kept >= 0.01:
            return
        self._warned_literal = True
        warnings.warn(
            f"FBN mode 'literal' with {steps} local steps: each upload keeps {kept:.1e} of the round's starting statistics, "
            f"so the shared statistics become an average of each client's last ~{round(1 / beta)} batches every round "
            "(at batch 4 this cost HBN Table 1's FBN row 10 points; REPRODUCTION.md). Mode 'exact' (centralized BN over "
            "the round's batches) or 'round_average' (HBN's code) use every batch.",
            stacklevel=2,
        )

    @property
    def stats_aggregator(self) -> Any:
        return self._stats_aggregator

    @stats_aggregator.setter
    def stats_aggregator(self, rule: Any) -> None:
        """Refuse a robust rule in ``round_average`` mode when it is set (while the run is built)."""
        if getattr(self, "mode", None) == "round_average" and rule is not None and not rule.is_mean:
            raise ConfigError(
                "FBN mode 'round_average' (HBN's code) has no robust rule: robust FBN (Guerraoui et al., 2024, Sec. 4) is defined "
                "on Algorithm 2's local copies; use mode 'exact' or 'literal', or robust_targets: updates"
            )
        self._stats_aggregator = rule

    def _round_average_statistics(self, global_state: dict[str, torch.Tensor], updates: ClientUpdates) -> dict[str, torch.Tensor]:
        """HBN's code (``FedBaseline/models/FBN/server.py``): count-pooled round averages, one EMA step."""
        ex = updates.extras
        count = updates.num_examples.double()  # the code's weights: the clients' dataset sizes
        out = {}
        for n in self.layers:
            keep = ex[f"fbn.{n}.count"][:, 0] > 0  # a client that took no step sends nothing (the code skips it)
            count = count.to(keep.device)
            mu0, var0 = global_state[f"{n}.running_mean"], global_state[f"{n}.running_var"]
            total = count[keep].sum()
            if float(total) < 2:
                out[f"{n}.running_mean"], out[f"{n}.running_var"] = mu0.clone(), var0.clone()
                continue
            w = count[keep].unsqueeze(-1)
            lm, lv = ex[f"fbn.{n}.mean"][keep, 0].double(), ex[f"fbn.{n}.var"][keep, 0].double()
            m = self.momenta[n]
            mean = (1 - m) * mu0.double() + m * (w * lm).sum(0) / total
            # the code's between-client term measures the deviations from the smoothed mean
            var = (w * (lv + (lm - mean) ** 2)).sum(0) / (total - 1)
            var = (1 - m) * var0.double() + m * var
            out[f"{n}.running_mean"], out[f"{n}.running_var"] = mean.to(mu0.dtype), var.to(var0.dtype)
        return out

    def _aggregate_step(
        self, rows: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]], var0: dict[str, torch.Tensor], decay: dict[str, Any]
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """One step of Eq. 9–10 over the clients' one-step copies, plain or robust."""
        agg = self.stats_aggregator
        robust = agg is not None and not agg.is_mean
        if not robust:  # Eq. 9-10 as fednorm.nn.fbn.fbn_aggregate computes them for your own loop
            means, variances = {}, {}
            for n, (count, lm, lv) in rows.items():
                means[n], variances[n] = fbn_aggregate(count, lm, lv, var0[n], self.momenta[n], decay=decay[n])
            return means, variances
        means = aggregate_group(agg, {n: lm for n, (_, lm, _) in rows.items()})
        if self.robust_variance == "two_stage":
            v = {n: corrected_variance(count, lm, lv, var0[n], means[n], self.momenta[n], decay[n]) for n, (count, lm, lv) in rows.items()}
            variances = aggregate_group(agg, v)
        else:  # literal: Agg of the unbiased copies + (c/β)·Agg of the squared deviations
            zero = {n: torch.zeros_like(means[n]) for n in rows}
            within = {n: corrected_variance(count, lm, lv, var0[n], lm, self.momenta[n], decay[n]) for n, (count, lm, lv) in rows.items()}
            between = {n: corrected_variance(count, lm, torch.zeros_like(lv), zero[n], means[n], self.momenta[n], 0.0) for n, (count, lm, lv) in rows.items()}
            w_agg, b_agg = aggregate_group(agg, within), aggregate_group(agg, between)
            variances = {n: w_agg[n] + b_agg[n] for n in rows}
        return means, {n: v_.clamp_min(0.0) for n, v_ in variances.items()}

    def hparams(self) -> dict[str, Any]:
        return {"mode": self.mode, "robust_variance": self.robust_variance, "weighting": self.weighting,
                "initial_pass": self.initial_pass,
                "aggregator": str(self.aggregator or "mean"), "stats_aggregator": str(self.stats_aggregator or "mean")}
