"""Feature normalization (FN): scale-normalise the penultimate features before the head.

The LN paper's FedFN (Zhang et al., "Understanding the Role of Layer Normalization in
Label-Skewed Federated Learning", TMLR 2024) applies the scale
normaliser φ (paper §2, eqs. 5–6)

.. math::
    \\phi(z) = \\sqrt{d}\\, \\frac{z}{\\max(\\lVert z \\rVert_2, \\varepsilon)}

once, to the post-ReLU penultimate feature vector ``z ∈ R^d``, just before the linear classifier.
No other layer is normalised: for bias-free ReLU networks φ at every hidden layer is the same
function as φ at the last one (Prop. 1), and the FN net predicts the same classes as the vanilla
net with the same weights when the head has no bias (Prop. 3); FN changes training, not the
function class.

FN has no parameters and no running statistics. It works per sample and does the same thing in
training and evaluation mode, so it communicates nothing beyond FedAvg (paper §4.3), and a
vanilla checkpoint loads into an FN model unchanged (the paper's Fig. 2 inserts FN into the same
weights).

* :func:`feature_norm` — the pure function.
* :class:`FeatureNorm` — the parameter-free layer on ``(N, d)``.
* :class:`FeatureNormClassifier` / :func:`with_feature_norm` — wrap any
  :class:`~fednorm.models.base.ClassifierModel` so that
  ``forward(x) = head(FeatureNorm(forward_features(x)))``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..models.base import ClassifierModel

__all__ = ["feature_norm", "FeatureNorm", "FeatureNormClassifier", "with_feature_norm"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _check_scale(scale: Any) -> None:
    if scale is None:
        return
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be None (meaning sqrt(d)) or a positive finite number, got {scale!r}")


def _check_eps(eps: Any) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"eps must be a positive finite number, got {eps!r}")


def feature_norm(z: torch.Tensor, eps: float = 1e-12, *, scale: float | None = None) -> torch.Tensor:
    """Scale-normalise each row of ``z`` to L2 norm ``sqrt(d)``: ``sqrt(d) * z / max(||z||_2, eps)``.

    The LN paper's φ (Zhang et al., 2024, Sec. 2: eq. 5 without the mean shift), applied along
    the last dimension, ``d = z.shape[-1]``. Every row with ``||z|| >= eps`` comes out with norm
    exactly ``sqrt(d)`` (up to rounding), i.e. the root-mean-square of its entries is 1, the scale
    that LN's ψ produces too.

    ``eps``: the paper does not give the guard's value. We follow the released code,
    ``F.normalize`` (``x / max(||x||_2, 1e-12)``) with ε = 1e-12, rather than ``||x|| + ε`` or
    ``sqrt(||x||² + ε)``: the max form is exactly scale invariant for every row with norm at
    least ε, so Props. 1–3 hold exactly, and a zero row maps to zero instead of 0/0 = NaN.
    Below ε the map is linear, ``z ↦ sqrt(d) z / ε``, so the gradient at a zero row is finite
    (``sqrt(d)/ε`` times the incoming gradient, as with ``F.normalize``), though large.
    In float16/bfloat16, 1e-12 underflows, so low-precision inputs are normalised in float32 and cast back.

    The function has no parameters: nothing is learned and nothing is communicated.

    Args:
        z: features, shape ``(..., d)``; post-ReLU penultimate features in FN.
        eps: lower bound on the norm (default: 1e-12, as ``F.normalize``).
        scale: target row norm; ``None`` (default) means ``sqrt(d)`` as in the paper and the
            code's ``'v'`` mode. ``1.0`` is the code's ``'n'`` variant (plain ``F.normalize``).

    Returns:
        Tensor of the same shape and dtype as ``z``.

    Raises:
        ValueError: for a 0-dim input, or a non-positive ``eps`` or ``scale``.

    Examples::

        >>> z = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
        >>> feature_norm(z)
        tensor([[0.8485, 1.1314],
                [0.0000, 0.0000]])
    """
    if z.dim() < 1:
        raise ValueError("feature_norm expects an input with at least 1 dimension (got a 0-dim tensor)")
    _check_eps(eps)
    _check_scale(scale)
    d = z.shape[-1]
    target = math.sqrt(d) if scale is None else float(scale)
    x = z.float() if z.dtype in _LOW_PRECISION else z
    norm = torch.linalg.vector_norm(x, ord=2, dim=-1, keepdim=True).clamp_min(eps)
    out = x / norm * target
    return out.to(z.dtype)


class FeatureNorm(nn.Module):
    """Feature normalization φ on ``(N, d)`` features: ``sqrt(d) * z / max(||z||_2, eps)`` per row.

    The LN paper's FN layer (Zhang et al., 2024, Sec. 2, eqs. 5–6). It is static: no
    parameters, no buffers, so it adds no ``state_dict`` keys and is identical in training and
    evaluation mode (it uses each sample's own norm, like LN, never batch statistics). Place it
    after the last ReLU, immediately before the linear head (:class:`FeatureNormClassifier`).
    The paper's FN has no learnable scale; the code's learnable-γ option (``'x'``) is unused and
    broken, so it is not offered.

    Args:
        num_features: the feature dimension d, checked against the input when given
            (default: None, any d). Lets FN be built as ``norm_layer(d)``.
        eps: lower bound on the norm (default: 1e-12, as ``F.normalize`` in the code). See
            :func:`feature_norm` for why the max form.
        scale: target row norm (keyword-only; default: None = ``sqrt(d)``).

    Shape:
        - Input: ``(N, d)``.
        - Output: ``(N, d)``; every non-zero row has L2 norm ``sqrt(d)`` (zero rows stay zero).

    Examples::

        >>> fn = FeatureNorm(192)
        >>> out = fn(torch.relu(torch.randn(32, 192)))
        >>> bool(torch.allclose(out.norm(dim=1), torch.tensor(192.0).sqrt()))
        True
    """

    __constants__ = ["num_features", "eps", "scale"]

    def __init__(self, num_features: int | None = None, eps: float = 1e-12, *, scale: float | None = None) -> None:
        super().__init__()
        if num_features is not None and (
            isinstance(num_features, bool) or not isinstance(num_features, int) or num_features < 1
        ):
            raise ValueError(f"num_features must be a positive integer or None, got {num_features!r}")
        _check_eps(eps)
        _check_scale(scale)
        self.num_features = num_features
        self.eps = float(eps)
        self.scale = None if scale is None else float(scale)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 2:
            raise ValueError(
                f"expected 2D input (N, d) (got {input.dim()}D input); flatten the features first, "
                "e.g. with forward_features"
            )
        if self.num_features is not None and input.shape[1] != self.num_features:
            raise ValueError(f"expected {self.num_features} features (got input of shape {tuple(input.shape)})")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        return feature_norm(input, self.eps, scale=self.scale)

    def extra_repr(self) -> str:
        parts = [] if self.num_features is None else [f"{self.num_features}"]
        parts.append(f"eps={self.eps}")
        parts.append("scale=sqrt(d)" if self.scale is None else f"scale={self.scale}")
        return ", ".join(parts)


class FeatureNormClassifier(ClassifierModel):
    """A fednorm classifier with FN before its head: ``head(FeatureNorm(model.forward_features(x)))``.

    FedFN in its Prop. 1 form (Zhang et al., 2024, Sec. 4.1, eq. 7): φ on the penultimate
    features only. ``forward_features`` returns the *normalised* features (rows of norm
    ``sqrt(d)``), so methods that read the representations (MOON, FedDecorr) see what the head
    sees; ``head``, ``num_features`` and ``num_classes`` are the wrapped model's.

    State-dict layout (the choice made here): the wrapper registers the wrapped model's
    *children* as its own children, under the same names, and keeps the wrapped root as a plain
    (unregistered) attribute. FN adds no tensors, so ``state_dict()`` has exactly the wrapped
    model's keys (``features.0.weight``, ``head.weight``, …, no ``model.`` prefix): vanilla
    checkpoints load into the FN model and back, FedAvg aggregates the same keys, and every key
    is global (FN keeps nothing client-local). The modules are shared, not copied: training the
    wrapper trains ``wrapper.model``. This requires the wrapped root to hold no parameters or
    buffers of its own (true of every registered model); otherwise a ``ValueError`` is raised.

    Args:
        model: a :class:`ClassifierModel` (any object with ``forward_features``, ``head`` and
            ``num_features``).
        eps: FN's norm guard (default: 1e-12).
        scale: FN's target row norm (keyword-only; default: None = ``sqrt(d)``).

    Raises:
        TypeError: if ``model`` is not a classifier with ``forward_features``/``head``/``num_features``.
        ValueError: if ``model`` already has FN, or holds tensors directly on its root module.

    Examples::

        >>> from fednorm.models import get_model
        >>> net = FeatureNormClassifier(get_model("ln_cnn", norm="none"))  # FedFN CNN, d = 192
        >>> net(torch.rand(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """

    def __init__(self, model: nn.Module, eps: float = 1e-12, *, scale: float | None = None) -> None:
        super().__init__()
        missing = [a for a in ("forward_features", "head", "num_features") if not hasattr(model, a)]
        if not isinstance(model, nn.Module) or missing:
            raise TypeError(
                f"model must be a ClassifierModel with forward_features, head and num_features, "
                f"got {type(model).__name__} (missing {missing})"
            )
        if isinstance(model, FeatureNormClassifier):
            raise ValueError("model already applies feature normalization; wrap the plain model once")
        own = list(model._parameters) + list(model._buffers)
        if own:
            raise ValueError(
                f"cannot share the state of {type(model).__name__}: it holds tensors {own} on its root "
                "module; move them into a submodule"
            )
        # Not registered as a submodule, so it adds no "model." prefix to the state-dict keys.
        object.__setattr__(self, "_wrapped", model)
        for name, child in model.named_children():
            self.add_module(name, child)
        self.num_features = int(model.num_features)
        self.num_classes = int(getattr(model, "num_classes", model.head.out_features))
        # Parameter-free, so registering it adds no state-dict keys.
        self.feature_norm = FeatureNorm(self.num_features, eps, scale=scale)
        self.training = model.training

    @property
    def model(self) -> nn.Module:
        """The wrapped vanilla model (shares every parameter with this wrapper)."""
        return self._wrapped

    def train(self, mode: bool = True) -> "FeatureNormClassifier":
        """Set training mode here and on the wrapped root (its children are shared)."""
        super().train(mode)
        self._wrapped.train(mode)
        return self

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """FN features ``FeatureNorm(model.forward_features(x))``, shape ``(N, num_features)``."""
        return self.feature_norm(self._wrapped.forward_features(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``head(FeatureNorm(model.forward_features(x)))``, shape ``(N, num_classes)``."""
        return self.head(self.forward_features(x))


def with_feature_norm(model: nn.Module, eps: float = 1e-12, *, scale: float | None = None) -> FeatureNormClassifier:
    """Return ``model`` with FN before its head; see :class:`FeatureNormClassifier`.

    Does not copy: the result shares ``model``'s modules and has its state-dict keys.
    """
    return FeatureNormClassifier(model, eps, scale=scale)
