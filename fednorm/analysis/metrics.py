"""The LN paper's analysis measures as plain functions (Zhang et al., 2024, Sec. 4.3, Figs. 2–3).

* :func:`extract_features` — penultimate features of a model, raw (before FN) or as the head sees them.
* :func:`norm_report` — per class: mean feature norm ``||h(x)||`` and class-embedding norm
  ``||w_c||`` (Fig. 3 left; Theorem 1: on a one-class client either the class embeddings or
  the features must grow without bound, and in practice the features do).
* :func:`collapse_report` — singular values of a feature matrix, normalised by σ₁, with the
  effective rank ``exp(H(σ/Σσ))`` and σ₁/σ₂ (Fig. 3 right; the last two are summaries added here).
* :func:`local_overfitting` — a copy of the global model trained for a few plain-SGD steps on one
  client, with per-class accuracy and mean logits on a test set before and after (Fig. 2).
* :func:`toggle_feature_norm` — the same weights with FN inserted (vanilla model) or removed
  (FN model): FN adds no parameters, so Fig. 2 compares both from one set of weights.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "extract_features",
    "class_embedding_norms",
    "norm_report",
    "singular_values",
    "effective_rank",
    "collapse_report",
    "per_class_accuracy",
    "toggle_feature_norm",
    "local_overfitting",
    "sample_per_class",
]


def _unwrap(model: nn.Module) -> nn.Module:
    from ..nn.feature_norm import FeatureNormClassifier

    return model.model if isinstance(model, FeatureNormClassifier) else model


def _forward_features(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``net.forward_features(x)``; for a model without it (a user's own module), the input of its
    classifier (:func:`fednorm.nn.classifier_head`), taken by a hook on a full forward pass."""
    if hasattr(net, "forward_features"):
        return net.forward_features(x)
    from ..nn import classifier_head

    grabbed: list[torch.Tensor] = []
    handle = classifier_head(net).register_forward_pre_hook(lambda _m, args: grabbed.append(args[0]))
    try:
        net(x)
    finally:
        handle.remove()
    return grabbed[-1].flatten(1)


@torch.inference_mode()
def extract_features(model: nn.Module, x: torch.Tensor, *, raw: bool = True, batch_size: int = 1024) -> torch.Tensor:
    """Penultimate features ``(N, d)`` in eval mode (the caller's mode is restored).

    Args:
        model: a :class:`~fednorm.models.base.ClassifierModel`, with or without FN, or any model
            whose classifier :func:`fednorm.nn.classifier_head` finds (its input is the feature).
        x: inputs.
        raw: features before FN (``h(x)``, whose norm Theorem 1 is about); ``False`` gives what
            the head sees (after FN, norm ``sqrt(d)``, for an FN model).
        batch_size: evaluation batch size.
    """
    net = _unwrap(model) if raw else model
    was = model.training
    model.eval()
    try:
        out = [_forward_features(net, x[i : i + batch_size]) for i in range(0, len(x), batch_size)]
    finally:
        model.train(was)
    if out:
        return torch.cat(out)
    from ..nn import classifier_head

    return x.new_zeros(0, int(getattr(model, "num_features", 0) or classifier_head(model).in_features))


def class_embedding_norms(model: nn.Module) -> torch.Tensor:
    """``||w_c||_2`` for every row of the head's weight (the class embeddings), shape ``(C,)``."""
    from ..nn import classifier_head

    head = model.head if isinstance(getattr(model, "head", None), nn.Linear) else classifier_head(model)
    return head.weight.detach().norm(dim=1)


def norm_report(model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int) -> dict[str, list[float | None]]:
    """Per class c: the mean raw feature norm over the samples of class c, and ``||w_c||``.

    Returns ``{"feature_norm": [C], "head_feature_norm": [C], "class_embedding_norm": [C]}``;
    a class without samples has ``None`` feature norms.
    """
    raw = extract_features(model, x, raw=True).norm(dim=1)
    head = extract_features(model, x, raw=False).norm(dim=1)
    feat, head_feat = [], []
    for c in range(num_classes):
        mask = y == c
        feat.append(float(raw[mask].double().mean()) if mask.any() else None)
        head_feat.append(float(head[mask].double().mean()) if mask.any() else None)
    return {
        "feature_norm": feat,
        "head_feature_norm": head_feat,
        "class_embedding_norm": [float(v) for v in class_embedding_norms(model)],
    }


def singular_values(features: torch.Tensor) -> torch.Tensor:
    """Singular values of the ``(n, d)`` feature matrix (rows = samples), descending, float64."""
    return torch.linalg.svdvals(features.detach().double())


def effective_rank(sv: torch.Tensor) -> float:
    """``exp(H(p))`` with ``p = σ / Σσ`` (Roy & Vetterli 2007): 1 for a rank-1 matrix, n for a flat spectrum."""
    sv = sv.double()
    total = sv.sum()
    if total <= 0:
        return 0.0
    p = sv[sv > 0] / total
    return float(torch.exp(-(p * p.log()).sum()))


def collapse_report(features: torch.Tensor) -> dict[str, Any]:
    """Spectrum of a feature matrix: σ/σ₁, effective rank, σ₁/σ₂ (Fig. 3 right; the last two are
    summaries added here)."""
    sv = singular_values(features)
    s1 = float(sv[0]) if len(sv) else 0.0
    return {
        "singular_values": [float(v) for v in sv],
        "normalized_singular_values": [float(v) / s1 if s1 > 0 else 0.0 for v in sv],
        "effective_rank": effective_rank(sv),
        "sigma1_over_sigma2": float(sv[0] / sv[1]) if len(sv) > 1 and sv[1] > 0 else math.inf,
    }


@torch.inference_mode()
def per_class_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, *, batch_size: int = 1024) -> dict[str, Any]:
    """Accuracy per true class, overall accuracy, prediction histogram and mean logits (eval mode)."""
    was = model.training
    model.eval()
    try:
        logits = torch.cat([model(x[i : i + batch_size]) for i in range(0, len(x), batch_size)]).double()
    finally:
        model.train(was)
    pred = logits.argmax(1)
    acc = []
    for c in range(num_classes):
        mask = y == c
        acc.append(float((pred[mask] == c).double().mean()) if mask.any() else None)
    return {
        "accuracy": float((pred == y).double().mean()) if len(y) else math.nan,
        "per_class_accuracy": acc,
        "prediction_fraction": [float(v) for v in torch.bincount(pred, minlength=num_classes).double() / max(len(y), 1)],
        "mean_logits": [float(v) for v in logits.mean(0)] if len(y) else [],
    }


def toggle_feature_norm(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with FN inserted (a vanilla model) or removed (an FN model).

    FN has no parameters, so both share the same weights, as the paper's Fig. 2 compares them.
    """
    from ..nn.feature_norm import FeatureNormClassifier, with_feature_norm

    clone = copy.deepcopy(model)
    if isinstance(clone, FeatureNormClassifier):
        return clone.model
    return with_feature_norm(clone)


def local_overfitting(
    model: nn.Module,
    x_client: torch.Tensor,
    y_client: torch.Tensor,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    num_classes: int,
    *,
    steps: int = 5,
    lr: float = 0.01,
    batch_size: int = 32,
    seed: int = 0,
) -> dict[str, Any]:
    """Train a copy of ``model`` for ``steps`` plain-SGD steps on one client; compare before and after.

    The paper's Fig. 2 (Zhang et al., 2024, Sec. 4.3): 5 local steps on a one-class client, then per-class
    accuracy on the whole test set: the vanilla model predicts the client's class almost
    everywhere, FN mitigates it. ``model`` is not modified. Batches are drawn without
    augmentation from a seeded permutation stream (reshuffled when the client is exhausted).

    Returns:
        ``{"before": per_class_accuracy, "after": per_class_accuracy, "train_loss": [steps],
        "model": the trained copy}``.
    """
    if len(x_client) == 0:
        raise ValueError("the client has no training samples")
    before = per_class_accuracy(model, x_test, y_test, num_classes)
    net = copy.deepcopy(model)
    net.train()
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=lr)
    g = torch.Generator().manual_seed(seed)
    n = len(x_client)
    bs = min(batch_size, n)
    order = torch.cat([torch.randperm(n, generator=g) for _ in range(math.ceil(steps * bs / n))])
    losses = []
    for s in range(steps):
        idx = order[s * bs : (s + 1) * bs].to(x_client.device)
        loss = F.cross_entropy(net(x_client[idx]), y_client[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return {"before": before, "after": per_class_accuracy(net, x_test, y_test, num_classes), "train_loss": losses, "model": net}


def sample_per_class(y: torch.Tensor | np.ndarray, per_class: int, *, seed: int = 0) -> np.ndarray:
    """Sorted indices of up to ``per_class`` seeded samples of every class present in ``y``."""
    y = np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y)
    rng = np.random.default_rng(seed)
    picks = [rng.permutation(np.flatnonzero(y == c))[:per_class] for c in np.unique(y)]
    return np.sort(np.concatenate(picks)) if picks else np.empty(0, np.int64)
