"""Label-skew client objectives: FedLC, FedRS (the logits the cross-entropy sees) and FedDecorr
(a loss on the penultimate features), the LN/FN paper's Table 1/10/11 baselines
(Zhang et al., 2024, App. C.4; where the authors' released code differs, the option says so).

They are client optimizers (:class:`~fednorm.optim.client.ClientOptimizer`), so they compose
with every method and server optimizer, and each has a stacked form for the vectorized
executor. They see the batch through forward hooks on the client's model, as MOON does:

- FedLC and FedRS register a forward hook on the model itself that returns the *calibrated*
  logits, so the engine's data loss ``CE(logits, y)`` becomes the method's loss with no change to
  the engine (and the training loss reported is the calibrated one). The hook acts only in
  training mode, is installed in ``begin`` and removed in ``end``. On the stacked model the
  logits are client-concatenated ``[B, K·C]``; the hook reads which clients the forward pass
  runs (:func:`~fednorm.nn.stacked.forward_clients`) and applies each client's own calibration.
- FedDecorr registers a pre-hook on the model's classifier (``model.head``, else its last
  ``nn.Linear``: :func:`~fednorm.optim.client.head_name`; its input is the penultimate feature vector,
  FN-normalised under FN) and adds ``β·L_decorr`` to the loss, per client.

Per-class counts ``n_{i,y}`` are the client's training labels over the whole round (its
``ctx.y``), as the released code computes them once per client.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from ..methods.base import ClientContext, Method, StackedClientContext
from ..nn.stacked import forward_clients
from .checks import check_number
from .client import ClientOptimizer, head_name, register_client_optimizer

__all__ = ["FedLC", "FedRS", "FedDecorr", "decorrelation_loss", "fedlc_margins", "fedrs_scales", "class_counts"]


def class_counts(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``n_y``: how many of the labels ``y`` are class ``y``, for every class (float64)."""
    return torch.bincount(y.long().reshape(-1), minlength=num_classes)[:num_classes].to(torch.float64)


def fedlc_margins(counts: torch.Tensor, tau: float, absent: str = "inf") -> torch.Tensor:
    """FedLC's margins ``τ·n_y^{-1/4}`` (Zhang et al. 2022, Eq. 8); calibrated logits are
    ``f(x) − margins``. ``absent="inf"``: a class the client lacks gets an infinite margin
    (``0^{-1/4}``, the released code; its logit is −∞); ``"clamp"``: counts are clamped to ≥ 1."""
    n = counts.to(torch.float64)
    if absent == "clamp":
        n = n.clamp(min=1.0)
    return tau * n.pow(-0.25)  # 0 ** -0.25 = inf


def fedrs_scales(counts: torch.Tensor, alpha: float) -> torch.Tensor:
    """FedRS's restricted-softmax factors (Li & Zhan 2021): 1 for a class the client has, α
    for a class it lacks; calibrated logits are ``f(x) · scales``."""
    return torch.where(counts > 0, torch.ones_like(counts, dtype=torch.float64),
                       torch.full_like(counts, float(alpha), dtype=torch.float64))


def decorrelation_loss(z: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """FedDecorr's ``L_decorr`` (Shi et al., ICLR 2023) of features ``z`` ``[N, d]``, or of a
    stack ``[K, N, d]`` (one value per leading index).

    Each feature dimension is standardised over the batch, ``(z − mean)/sqrt(var + eps)`` with
    the unbiased variance (``torch.var``, as the released ``FedDecorrLoss``), ``corr = XᵀX``, and
    ``L = mean(offdiag(corr)²) / N``. A batch of one sample gives 0 (the code's guard).
    """
    n, d = z.shape[-2], z.shape[-1]
    if n == 1 or d == 1:
        return (z * 0.0).sum(dim=(-2, -1))
    x = z - z.mean(dim=-2, keepdim=True)
    x = x / torch.sqrt(eps + x.var(dim=-2, keepdim=True))
    corr = x.transpose(-1, -2) @ x
    off = corr.pow(2).sum(dim=(-1, -2)) - torch.diagonal(corr, dim1=-2, dim2=-1).pow(2).sum(dim=-1)
    return off / (d * (d - 1)) / n


def _num_classes(model: nn.Module, name: str) -> int:
    num = getattr(model, "num_classes", None)
    if not isinstance(num, int):  # a user's model: its classifier's outputs
        num = model.get_submodule(head_name(model, name)).out_features
    return num


class _LogitCalibration(ClientOptimizer):
    """Shared machinery of FedLC and FedRS: a per-client tensor ``[C]`` computed from the
    client's labels and applied to the logits by a forward hook, in training mode only."""

    uses_begin = True
    uses_end = True
    stacked = True
    stacks_across_runs = True  # each row's calibration from its own labels

    def __init__(self) -> None:
        self._hook: Any = None

    def setup(self, model: nn.Module, method: Method, num_clients: int, local_momentum: float = 0.0) -> None:
        super().setup(model, method, num_clients, local_momentum)
        self.num_classes = _num_classes(model, self.name)

    def calibration(self, y: torch.Tensor) -> torch.Tensor:
        """The client's calibration tensor ``[C]`` (float64) from its training labels."""
        raise NotImplementedError

    def calibrate(self, logits: torch.Tensor, cal: torch.Tensor) -> torch.Tensor:
        """Calibrated logits; ``cal`` broadcasts against ``logits`` on the last axis."""
        raise NotImplementedError

    def _remove(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def begin(self, ctx: ClientContext) -> None:
        self._remove()  # a client whose training raised never reached end()
        cal = self.calibration(ctx.y)

        def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
            if not module.training:
                return None
            return self.calibrate(out, cal.to(device=out.device, dtype=out.dtype))

        self._hook = ctx.model.register_forward_hook(hook)

    def end(self, ctx: ClientContext) -> None:
        self._remove()

    def stacked_begin(self, ctx: StackedClientContext) -> None:
        self._remove()
        cal = torch.stack([self.calibration(y) for y in ctx.y])  # [K, C]
        num_classes = self.num_classes

        def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
            if not module.training:
                return None
            rows = forward_clients(module)
            c = cal if rows is None else cal.index_select(0, rows.to(cal.device))
            b = out.shape[0]
            shaped = out.reshape(b, -1, num_classes)  # [B, kk, C]: each row's clients
            return self.calibrate(shaped, c.to(device=out.device, dtype=out.dtype)).reshape(b, -1)

        self._hook = ctx.model.register_forward_hook(hook)

    def stacked_end(self, ctx: StackedClientContext) -> None:
        self._remove()


@register_client_optimizer("fedlc")
class FedLC(_LogitCalibration):
    """FedLC (Zhang et al., ICML 2022, "Federated Learning with Label Distribution Skew via
    Logits Calibration"): the local loss is the cross-entropy of the calibrated logits
    ``f_y(x) − τ·n_{i,y}^{−1/4}`` for every class ``y``, with ``n_{i,y}`` client ``i``'s count of
    class ``y``. LN paper Tables 1/10/11 row "FedLC".

    Args:
        tau: τ (default: 1.0, the LN paper's).
        absent: margin of a class the client lacks: ``"inf"`` (``0^{−1/4}`` = ∞, as the released
            code computes it: the logit is −∞, so a one-class client has zero loss and does not
            learn, the paper's 10% / 9.72% cells, Zhang et al., 2024, Table 1), or
            ``"clamp"`` (counts clamped to ≥ 1, margin τ). (default: "inf")
    """

    name = "fedlc"

    def __init__(self, tau: float = 1.0, absent: str = "inf") -> None:
        super().__init__()
        self.tau = check_number("fedlc tau", tau, 0.0)
        if absent not in ("inf", "clamp"):
            raise ConfigError(f"Unknown value '{absent}' for argument fedlc absent. Valid values are {{inf, clamp}}")
        self.absent = absent

    def calibration(self, y: torch.Tensor) -> torch.Tensor:
        return fedlc_margins(class_counts(y, self.num_classes), self.tau, self.absent)

    def calibrate(self, logits: torch.Tensor, cal: torch.Tensor) -> torch.Tensor:
        return logits - cal

    def hparams(self) -> dict[str, Any]:
        return {"tau": self.tau, "absent": self.absent}


@register_client_optimizer("fedrs")
class FedRS(_LogitCalibration):
    """FedRS (Li & Zhan, KDD 2021, "FedRS: Federated Learning with Restricted Softmax for Label
    Distribution Non-IID Data"): during local training the logits of the classes the client
    lacks are multiplied by α (the restricted softmax), the others unchanged. LN paper Tables
    1/10/11 row "FedRS".

    The scaling multiplies the whole logit, bias included (FedRS's code scales ``w_cᵀh`` of a
    bias-free classifier; the LN paper's CNN is bias-free, its ResNet head has a bias). The
    FedRepo code's proportional variant (factors ``α + (1 − α)·n_c/max n``) is not implemented.

    Args:
        alpha: α ∈ [0, 1] (default: 0.5, the paper's, Zhang et al., 2024, App. C.4; the LN code's
            default is 1.0, which is FedAvg).
    """

    name = "fedrs"

    def __init__(self, alpha: float = 0.5) -> None:
        super().__init__()
        self.alpha = check_number("fedrs alpha", alpha, 0.0, 1.0, high_open=False)

    def calibration(self, y: torch.Tensor) -> torch.Tensor:
        return fedrs_scales(class_counts(y, self.num_classes), self.alpha)

    def calibrate(self, logits: torch.Tensor, cal: torch.Tensor) -> torch.Tensor:
        return logits * cal

    def hparams(self) -> dict[str, Any]:
        return {"alpha": self.alpha}


@register_client_optimizer("feddecorr")
class FedDecorr(ClientOptimizer):
    """FedDecorr (Shi et al., ICLR 2023, "Towards Understanding and Mitigating Dimensional
    Collapse in Heterogeneous Federated Learning"): ``loss += β·L_decorr(z)`` with ``z`` the
    penultimate features of the batch (the input of the model's classifier,
    :func:`fednorm.nn.classifier_head`; FN-normalised under FN) and
    ``L_decorr`` from :func:`decorrelation_loss`. LN paper Tables 1/10/11 row "FedDecorr".

    Args:
        beta: β (default: 0.1, the released code's hard-coded value and FedDecorr's authors'
            recommendation; the paper states 0.5, Zhang et al., 2024, App. C.4, recorded as ``PAPER_BETA``).
        eps: the standardisation's guard (default: 1e-8, the code's).
    """

    name = "feddecorr"
    uses_begin = True
    uses_loss = True
    uses_end = True
    stacked = True
    stacks_across_runs = True  # each row's own features
    PAPER_BETA = 0.5

    def __init__(self, beta: float = 0.1, eps: float = 1e-8) -> None:
        self.beta = check_number("feddecorr beta", beta, 0.0)
        self.eps = check_number("feddecorr eps", eps, 0.0)
        self._hook: Any = None
        self._features: list[torch.Tensor] = []
        self._head = "head"

    def setup(self, model: nn.Module, method: Method, num_clients: int, local_momentum: float = 0.0) -> None:
        super().setup(model, method, num_clients, local_momentum)
        self._head = head_name(model, self.name)

    def _install(self, model: nn.Module) -> None:
        self._remove()

        def grab(module: nn.Module, args: tuple) -> None:
            if module.training:
                self._features.append(args[0])

        self._hook = model.get_submodule(self._head).register_forward_pre_hook(grab)

    def _remove(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._features = []

    def begin(self, ctx: ClientContext) -> None:
        self._install(ctx.model)

    def loss(self, ctx: ClientContext, model: nn.Module, loss: torch.Tensor) -> torch.Tensor:
        feats, self._features = self._features, []
        extra = sum(decorrelation_loss(z.flatten(1), self.eps) for z in feats)
        return loss + self.beta * extra

    def end(self, ctx: ClientContext) -> None:
        self._remove()

    def stacked_begin(self, ctx: StackedClientContext) -> None:
        self._install(ctx.model)

    def stacked_loss(self, ctx: StackedClientContext, params: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        feats, self._features = self._features, []
        d = ctx.model.get_submodule(self._head).in_features
        total = sum(decorrelation_loss(z.reshape(z.shape[0], -1, d).transpose(0, 1), self.eps).sum() for z in feats)
        return self.beta * total

    def stacked_end(self, ctx: StackedClientContext) -> None:
        self._remove()

    def hparams(self) -> dict[str, Any]:
        return {"beta": self.beta}
