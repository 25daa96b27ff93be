"""A new client that never trained: averaged weights plus BatchNorm statistics of its own data.

FedBN has no global model (Li et al., 2021, App. G): for an unseen client it uses the
shared weights, the *average* of the clients' BN affine parameters (γ, β), and BN statistics
(mean, variance) computed on the new client's own data, as AdaBN/SiloBN do. Here every tensor
the method keeps local is averaged (uniformly) over the clients that hold one, so the same call
works for FedBN (γ, β and statistics local), SiloBN (statistics local) and FedAvg (nothing
local: it only replaces the averaged statistics). :func:`batch_norm_statistics` computes the
statistics exactly: layer by layer, each BN layer's input is computed with every earlier BN
layer already normalising with its new statistics, which is what the adapted model sees at
evaluation; variances are stored unbiased, as PyTorch's ``running_var``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import ConfigError
from .evaluation import evaluate

__all__ = ["batch_norm_statistics", "averaged_state", "adapted_model", "AdaptResult", "adapt"]


class _Stop(Exception):
    """Ends a forward pass once the layer being measured has seen its input."""


def _bn_modules(model: nn.Module) -> list[tuple[str, nn.modules.batchnorm._BatchNorm]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _execution_order(model: nn.Module, x: torch.Tensor, bns: list[tuple[str, nn.Module]]) -> list[int]:
    """Indices of ``bns`` in the order a forward pass reaches them (registration order can differ)."""
    seen: list[int] = []
    hooks = [m.register_forward_pre_hook(lambda mod, inp, i=i: seen.append(i) if i not in seen else None) for i, (_, m) in enumerate(bns)]
    try:
        with torch.no_grad():
            model(x[:2])
    finally:
        for h in hooks:
            h.remove()
    return seen + [i for i in range(len(bns)) if i not in seen]


def batch_norm_statistics(model: nn.Module, x: torch.Tensor, *, batch_size: int = 1024) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Set every BatchNorm layer's running statistics to the exact statistics of its input on ``x``.

    Layers are processed in forward order; layer ``l``'s per-channel mean and variance are
    accumulated over all of ``x`` (in float64, in batches, stopping each pass at layer ``l``) with
    layers ``< l`` in eval mode and already holding their new statistics. So the result does
    not depend on ``batch_size``, unlike a train-mode pass. One partial forward pass per layer.

    Args:
        model: a model with ``_BatchNorm`` layers (modified in place: ``running_mean``,
            ``running_var``; ``num_batches_tracked`` is left alone).
        x: the client's inputs, ``N×...``, ``N >= 2``.
        batch_size: evaluation batch size.

    Returns:
        ``{layer name: (mean, unbiased variance)}`` in float64.
    """
    bns = _bn_modules(model)
    if not bns:
        raise ConfigError("the model has no BatchNorm layer, so there are no statistics to compute")
    if len(x) < 2:
        raise ConfigError(f"computing BatchNorm statistics needs at least 2 samples, got {len(x)}")
    was_training = model.training
    model.eval()
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    try:
        for i in _execution_order(model, x, bns):
            name, bn = bns[i]
            acc: dict[str, Any] = {"n": 0, "s": 0.0, "ss": 0.0}

            def hook(mod: nn.Module, inp: tuple[torch.Tensor, ...], acc: dict[str, Any] = acc) -> None:
                t = inp[0].detach().to(torch.float64)
                dims = [d for d in range(t.dim()) if d != 1]
                acc["n"] += t.numel() // t.shape[1]
                acc["s"] = acc["s"] + t.sum(dim=dims)
                acc["ss"] = acc["ss"] + (t * t).sum(dim=dims)
                raise _Stop

            handle = bn.register_forward_pre_hook(hook)
            try:
                with torch.no_grad():
                    for start in range(0, len(x), batch_size):
                        try:
                            model(x[start : start + batch_size])
                        except _Stop:
                            pass
            finally:
                handle.remove()
            n = acc["n"]
            mean = acc["s"] / n
            var = (acc["ss"] / n - mean * mean).clamp_min(0) * (n / (n - 1))
            assert bn.running_mean is not None and bn.running_var is not None
            bn.running_mean.copy_(mean.to(bn.running_mean.dtype))
            bn.running_var.copy_(var.to(bn.running_var.dtype))
            out[name] = (mean, var)
    finally:
        model.train(was_training)
    return out


def averaged_state(global_state: dict[str, torch.Tensor], bank: dict[int, dict[str, torch.Tensor]], local_keys: set[str]) -> dict[str, torch.Tensor]:
    """The global state with every local tensor replaced by its uniform average over the clients
    in ``bank`` (integer tensors take the maximum). Clients without an entry are skipped; with
    none at all the global (initial) values are kept."""
    state = dict(global_state)
    holders = [s for s in bank.values() if s]
    for key in local_keys:
        vals = [s[key] for s in holders if key in s]
        if not vals:
            continue
        stacked = torch.stack([v.to(global_state[key].device) for v in vals])
        if stacked.is_floating_point():
            state[key] = stacked.to(torch.float64).mean(0).to(stacked.dtype)
        else:
            state[key] = stacked.max(0).values
    return state


@dataclass
class AdaptResult:
    """Accuracy of the adapted model on the new client's test data, and how it was built.

    Attributes:
        accuracy: with statistics recomputed on the client's data (the paper's recipe).
        accuracy_averaged_stats: with the clients' averaged statistics instead (no adaptation).
        num_stat_samples, num_test: samples used for statistics and for testing.
        source: what the new client's data is (``domain:<name>``, ``client:<id>``, or ``dataset:<name>`` for
            another dataset: ``fednorm.evaluation.unseen``).
        new_client: False when the run trained on this data: a client of the run, or a domain
            some client held (then the accuracy is not a new client's, and ``note`` says so).
        note: why the result is not a new client's, else empty.
        statistics: per BN layer ``(mean, unbiased variance)`` in float64.
        state: the adapted model's state dict.
    """

    accuracy: float
    accuracy_averaged_stats: float
    num_stat_samples: int
    num_test: int
    source: str
    method: str
    new_client: bool = True
    note: str = ""
    statistics: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(repr=False, default_factory=dict)
    state: dict[str, torch.Tensor] = field(repr=False, default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The result as JSON-ready numbers (accuracies as fractions): what ``adapt-*.json`` holds."""
        return {
            "source": self.source,
            "method": self.method,
            "accuracy": self.accuracy,
            "accuracy_averaged_stats": self.accuracy_averaged_stats,
            "num_stat_samples": self.num_stat_samples,
            "num_test": self.num_test,
            "new_client": self.new_client,
            **({"note": self.note} if self.note else {}),
        }

    def describe(self) -> str:
        """One line for a person, accuracies in percent (``summary()`` keeps the fractions: it
        is the data written to ``adapt-*.json``)."""
        pct = lambda a: "n/a" if math.isnan(a) else f"{100 * a:.2f}%"  # noqa: E731
        who = "a new client" if self.new_client else "data the run trained on"
        return (f"{self.method} on {who} ({self.source}): test accuracy {pct(self.accuracy)} with its own BN "
                f"statistics ({self.num_stat_samples} samples), {pct(self.accuracy_averaged_stats)} with the clients' "
                f"averaged statistics; {self.num_test} test samples" + (f" ({self.note})" if self.note else ""))


def adapted_model(sim: Any, x: torch.Tensor, xt: torch.Tensor, yt: torch.Tensor, *, batch_size: int = 1024
                  ) -> tuple[nn.Module, float, float, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """The recipe on a loaded simulation ``sim``: the global state with every local tensor averaged
    over the clients (:func:`averaged_state`), BN statistics recomputed on the new client's
    inputs ``x`` (:func:`batch_norm_statistics`); scored on ``(xt, yt)`` before and after.

    Returns:
        ``(model, accuracy with the averaged statistics, accuracy with the new ones, statistics)``;
        the accuracies are NaN without test samples.
    """
    x, xt, yt = x.to(sim.device, sim.dtype), xt.to(sim.device, sim.dtype), yt.to(sim.device)
    state = averaged_state(sim.global_state, sim.bank.state_dict(), sim.method.local_keys)
    model = sim.global_model(state)
    before = evaluate(model, xt, yt, batch_size=batch_size).accuracy if len(xt) else math.nan
    stats = batch_norm_statistics(model, x, batch_size=batch_size)
    after = evaluate(model, xt, yt, batch_size=batch_size).accuracy if len(xt) else math.nan
    return model, before, after, stats


def _clients_of_domain(sim: Any, domain: str) -> list[int]:
    """The run's clients that trained on ``domain`` (with data of it); all of them when the
    clients mix the sources (no single source per client): each then holds some of every one."""
    data, cfg = sim.data, sim.config
    names = [n.lower() for n in data.domain_names or []]
    holders = [c for c in range(data.num_clients) if len(data.client_train[c])]
    if data.client_domain is not None:
        return [c for c in holders if names[data.client_domain[c]] == domain.lower()]
    sources = cfg.partition_args.get("sources") if cfg.partition == "domains" else None
    if sources and domain.lower() not in {str(s).lower() for s in sources}:
        return []
    return holders


def _domain_data(sim: Any, domain: str, num_samples: int | None, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from ..data.datasets import dataset_to_tensors, load_dataset

    cfg = sim.config
    train = load_dataset(cfg.dataset, cfg.data_dir, train=True, **cfg.dataset_args)
    test = load_dataset(cfg.dataset, cfg.data_dir, train=False, **cfg.dataset_args)
    names = [n.lower() for n in getattr(train, "domain_names", [])]
    if not names:
        raise ConfigError(f"dataset '{cfg.dataset}' has no domains; pass client= instead of domain=")
    if domain.lower() not in names:
        raise ConfigError(f"Unknown value '{domain}' for argument domain. Valid values are {{{', '.join(names)}}}")
    d = names.index(domain.lower())
    tr = np.flatnonzero(train.domains == d)
    if num_samples is not None and num_samples < len(tr):
        tr = np.sort(np.random.default_rng(seed).choice(tr, size=num_samples, replace=False))
    te = np.flatnonzero(test.domains == d)
    train.data, train.targets = train.data[tr], train.targets[tr]
    test.data, test.targets = test.data[te], test.targets[te]
    x, y = dataset_to_tensors(train)
    xt, yt = dataset_to_tensors(test)
    return x, y, xt, yt


def adapt(
    run_dir: str | Path,
    *,
    domain: str | None = None,
    client: int | None = None,
    num_samples: int | None = None,
    data_dir: str | None = None,
    batch_size: int = 1024,
    write: bool = True,
) -> AdaptResult:
    """Build and evaluate the model of a client that never trained, from a finished run.

    Args:
        run_dir: a ``fednorm run`` directory (its latest checkpoint is used).
        domain: the new client's data is this source of the run's multi-source dataset (e.g. one
            left out of training with ``partition_args: {sources: [...]}``): statistics from its
            training samples, accuracy on its test samples.
        client: instead, client ``client`` of the run (its training and test splits).
        num_samples: use at most this many training samples for the statistics (seeded draw).
        data_dir: where the dataset is, if not where the run found it.
        batch_size: batch size of the statistics and evaluation passes.
        write: also write ``adapt-<source>.json`` into ``run_dir``.

    Returns:
        :class:`AdaptResult`.
    """
    from ..config import load_config
    from .checkpoint import load_latest
    from .simulator import Simulation

    if (domain is None) == (client is None):
        raise ConfigError("adapt needs exactly one of domain= (a data source) or client= (a client id)")
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir} is not a fednorm run directory (no config.yaml)")
    cfg = load_config(run_dir / "config.yaml", {"data_dir": data_dir} if data_dir else None)
    sim = Simulation(cfg)
    sim.load_state_dict(load_latest(run_dir))
    if domain is not None:
        x, _, xt, yt = _domain_data(sim, domain, num_samples, cfg.seed)
        source = f"domain:{domain}"
        trained = _clients_of_domain(sim, domain)
        note = ""
        if trained:  # FedBN App. G's recipe is for data the federation never saw
            shown = ", ".join(map(str, trained[:5])) + (", ..." if len(trained) > 5 else "")
            note = (f"not a new client: the run trained on domain '{domain}' (client{'s' if len(trained) > 1 else ''} "
                    f"{shown}); leave it out with partition_args {{sources: [...]}} to evaluate a new one")
    else:
        assert client is not None
        if not 0 <= client < sim.data.num_clients:
            raise ConfigError(f"client must lie in [0, {sim.data.num_clients}), got {client}")
        ix = sim.data.client_train[client]
        if num_samples is not None:
            ix = ix[:num_samples]
        x, xt, yt = sim.data.train_x[ix], sim.data.test_x[sim.data.client_test[client]], sim.data.test_y[sim.data.client_test[client]]
        source = f"client:{client}"
        trained, note = [client], ""  # a client of the run, from its own split (docs/fedbn.md): asked for as such
    model, before, after, stats = adapted_model(sim, x, xt, yt, batch_size=batch_size)
    result = AdaptResult(
        accuracy=after, accuracy_averaged_stats=before, num_stat_samples=len(x), num_test=len(xt), source=source,
        method=cfg.method, new_client=not trained, note=note, statistics=stats,
        state={k: v.detach().clone() for k, v in model.state_dict().items()},
    )  # fmt: skip
    if write:
        name = source.replace(":", "-")
        (run_dir / f"adapt-{name}.json").write_text(json.dumps(result.summary(), indent=2) + "\n")
    return result
