"""The small CNNs of the papers: HBN's Simple-CNN, FedBN's digits CNN, FBN's CNN, the LN paper's CNN.

Each follows its paper layer by layer, with the normalization replaced by ``norm_layer``
(``"bn"`` reproduces the papers' BN models, ``"gn"``/``"ln"``/``"none"`` their baselines). Every
conv or linear layer with its norm and ReLU (and pooling) is one :func:`_block`. Where
the papers fix 32×32 (CIFAR) or 28×28 (digits) inputs, flatten sizes are computed from
``input_size`` instead; on small inputs a 2×2 max-pool that would shrink a map below 1×1 is
skipped (:func:`~fednorm.models.base.maybe_max_pool`), so every model also runs on 8×8 digits.
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch
from torch import nn

from ..nn.norms import NormSpec, get_norm_layer
from .base import ClassifierModel, conv_out_size, maybe_max_pool, to_hw, validate_common
from .registry import register_model

__all__ = ["SimpleCNN", "FedBNCNN", "FBNCNN", "LNCNN", "simple_cnn", "fedbn_cnn", "fbn_cnn", "ln_cnn"]

BlockOrder = Literal["norm_act", "act_norm"]


def _block(
    layer: nn.Module, norm: nn.Module, *, order: BlockOrder = "norm_act", tail: Sequence[nn.Module] = ()
) -> list[nn.Module]:
    """``layer → norm → ReLU`` (``"norm_act"``) or ``layer → ReLU → norm`` (``"act_norm"``), then ``tail``.

    The papers differ only in where the norm sits relative to the activation (HBN and FedBN put
    it before, FBN and the LN paper after), so every model's blocks come from here. ``layer`` and
    ``norm`` are built by the caller, which keeps the construction order (and so the seeded
    initialisation) of the layers the models had before; the returned list is spliced into an
    ``nn.Sequential``, so state-dict keys stay ``features.<index>.*``.
    """
    act = nn.ReLU(inplace=True)
    return [layer, *((norm, act) if order == "norm_act" else (act, norm)), *tail]


class SimpleCNN(ClassifierModel):
    """HBN's Simple-CNN (Chen et al. 2025, "Hybrid Batch Normalisation", App. B.1, Table 7; ``Nets.py SimpleCNN``).

    Three blocks ``Conv2d(k3, s1, p1) → Norm → ReLU → MaxPool(2)`` with 16, 32 and 64 channels,
    then ``Linear(64·h·w → 128) → ReLU`` and the head ``Linear(128 → C)``. There is no norm in the
    FC layers and no dropout; convolutions keep their bias (torch default), as in HBN's code.
    On CIFAR (3×32×32) the flattened map is 64×4×4 = 1024; ``num_features`` is 128.

    HBN's FedFN baseline normalizes the 1024-d flattened map, before ``fc`` (paper App. Table 7:
    "we normalise the input before the fully connected layer"; code ``SimpleCNN(fn=True)``), not
    the 128-d ``forward_features`` output that ``norm="fn"`` (the LN paper's FedFN) normalizes:
    ``fn_before_fc=True`` with ``norm="none"`` builds HBN's FedFN net.

    Args:
        num_classes: number of logits.
        in_channels: input channels.
        input_size: input ``(H, W)`` or side length.
        norm_layer: norm specification, resolved by ``get_norm_layer`` (None = no norm).
        fn_before_fc: append FN (``sqrt(d)·z / max(‖z‖, 1e-12)``, d = 64·h·w) to ``features``,
            after the flatten (default: False). Parameter-free, so the state dict is unchanged.
    """

    def __init__(
        self,
        *,
        num_classes: int = 10,
        in_channels: int = 3,
        input_size: int | Sequence[int] = 32,
        norm_layer: NormSpec = "bn",
        fn_before_fc: bool = False,
    ) -> None:
        super().__init__()
        validate_common(num_classes, in_channels)
        norm_layer = get_norm_layer(norm_layer)
        hw = to_hw(input_size)
        layers: list[nn.Module] = []
        channels = in_channels
        for width in (16, 32, 64):
            pool, hw = maybe_max_pool(hw)
            layers += _block(nn.Conv2d(channels, width, 3, 1, 1), norm_layer(width), tail=(pool,))
            channels = width
        layers.append(nn.Flatten())
        if fn_before_fc:
            from ..nn.feature_norm import FeatureNorm  # imports fednorm.models: not at module level

            layers.append(FeatureNorm(channels * hw[0] * hw[1]))
        self.features = nn.Sequential(*layers)
        self.fc = nn.Sequential(nn.Linear(channels * hw[0] * hw[1], 128), nn.ReLU(inplace=True))
        self.num_features = 128
        self.num_classes = num_classes
        self.head = nn.Linear(128, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


class FedBNCNN(ClassifierModel):
    """FedBN's digits CNN (Li et al. 2021, "FedBN", App. D.2, Table 3; code ``nets/models.py DigitModel``).

    ``Conv2d(k5, s1, p2)`` layers with 64, 64 and 128 channels, each followed by Norm and ReLU,
    with ``MaxPool(2)`` after the first two; then ``Linear(128·h·w → 2048) → Norm1d → ReLU →
    Linear(2048 → 512) → Norm1d → ReLU`` and the head ``Linear(512 → C)``. The FC norms are built
    with ``spatial=False`` (``BatchNorm1d`` for ``"bn"``). Convolutions and linears keep their
    bias, as in FedBN's code. On 28×28 digits the flattened map is 128×7×7 = 6272;
    ``num_features`` is 512.

    Args:
        num_classes: number of logits.
        in_channels: input channels (FedBN converts every domain to 3 channels).
        input_size: input ``(H, W)`` or side length (FedBN: 28).
        norm_layer: norm specification, resolved by ``get_norm_layer``.
    """

    def __init__(
        self,
        *,
        num_classes: int = 10,
        in_channels: int = 3,
        input_size: int | Sequence[int] = 28,
        norm_layer: NormSpec = "bn",
    ) -> None:
        super().__init__()
        validate_common(num_classes, in_channels)
        norm_layer = get_norm_layer(norm_layer)
        hw = to_hw(input_size)
        pool1, hw = maybe_max_pool(hw)
        pool2, hw = maybe_max_pool(hw)
        self.features = nn.Sequential(
            *_block(nn.Conv2d(in_channels, 64, 5, 1, 2), norm_layer(64), tail=(pool1,)),
            *_block(nn.Conv2d(64, 64, 5, 1, 2), norm_layer(64), tail=(pool2,)),
            *_block(nn.Conv2d(64, 128, 5, 1, 2), norm_layer(128)),
            nn.Flatten(),
        )
        self.fc = nn.Sequential(
            *_block(nn.Linear(128 * hw[0] * hw[1], 2048), norm_layer(2048, spatial=False)),
            *_block(nn.Linear(2048, 512), norm_layer(512, spatial=False)),
        )
        self.num_features = 512
        self.num_classes = num_classes
        self.head = nn.Linear(512, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


class FBNCNN(ClassifierModel):
    """FBN's CIFAR-10 CNN with the norm *after* ReLU (Guerraoui et al. 2024, "Overcoming the Challenges of
    Batch Normalization in Federated Learning", App. C.1, Table 1).

    ``Conv(k3, p1) → ReLU → Norm`` with 64, 64 (→ MaxPool(2) → Dropout(0.25)), 128, 128
    (→ MaxPool(2) → Dropout(0.25)) channels, then ``Linear(128·h·w → 128) → ReLU`` and the head
    ``Linear(128 → C)``. On CIFAR the flattened map is 128×8×8 = 8192. With ``"bn"`` there are
    4 BN layers, 768 running statistics and 1,310,922 parameters, all trainable (our count from
    the paper's Table 1, which includes the conv biases); ``num_features`` is 128.

    The paper ends with ``LogSoftmax`` and trains with NLL; this model returns logits, to be used
    with ``cross_entropy``, which equals ``nll_loss(log_softmax(logits))`` exactly.

    Args:
        num_classes: number of logits.
        in_channels: input channels.
        input_size: input ``(H, W)`` or side length.
        norm_layer: norm specification, resolved by ``get_norm_layer``.
        dropout: dropout probability after each pooling (default: 0.25, the paper's).
    """

    def __init__(
        self,
        *,
        num_classes: int = 10,
        in_channels: int = 3,
        input_size: int | Sequence[int] = 32,
        norm_layer: NormSpec = "bn",
        dropout: float = 0.25,
    ) -> None:
        super().__init__()
        validate_common(num_classes, in_channels)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        norm_layer = get_norm_layer(norm_layer)
        hw = to_hw(input_size)
        layers: list[nn.Module] = []
        channels = in_channels
        for width in (64, 128):
            pool, hw = maybe_max_pool(hw)
            layers += _block(nn.Conv2d(channels, width, 3, 1, 1), norm_layer(width), order="act_norm")
            layers += _block(
                nn.Conv2d(width, width, 3, 1, 1), norm_layer(width), order="act_norm", tail=(pool, nn.Dropout(dropout))
            )
            channels = width
        self.features = nn.Sequential(*layers, nn.Flatten())
        self.fc = nn.Sequential(nn.Linear(channels * hw[0] * hw[1], 128), nn.ReLU(inplace=True))
        self.num_features = 128
        self.num_classes = num_classes
        self.head = nn.Linear(128, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


class LNCNN(ClassifierModel):
    """The LN paper's CIFAR CNN as in its released code (Zhang et al. 2024, "Understanding the Role of Layer
    Normalization in Label-Skewed Federated Learning", App. C.1, Table 7; code ``CNN_CIFAR``).

    ``conv1(k5, 64) → ReLU → N0 → MaxPool(2) → conv2(k5, 64) → ReLU → N1 → MaxPool(2) →
    fc1(1600 → 384) → ReLU → N2 → fc2(384 → 192) → ReLU → N3 → head(192 → C)``: the classic
    McMahan/Reddi 64-64-384-192 CNN with every norm *after* its activation (FedLN, §1.3). All
    biases, the head's included, are off by default (needed for the paper's Props. 1–3); the
    FC norms use ``spatial=False``. ``num_features`` is 192, the FN dimension d.

    [code≠paper] The paper's Table 7 has a single FC layer (1600 → 384 → C, "28×28" inputs);
    the default follows the code, and ``fc_dims=(384,)`` gives the Table 7 net.

    Convolutions are unpadded, as in the code (32 → 28 → 14 → 10 → 5; 64·5·5 = 1600). A
    convolution whose input is smaller than its 5×5 kernel (inputs below 14×14, e.g. 8×8 digits)
    uses padding 2 instead, and a pool below 2×2 is skipped.

    Args:
        num_classes: number of logits.
        in_channels: input channels.
        input_size: input ``(H, W)`` or side length.
        norm_layer: norm specification, resolved by ``get_norm_layer`` (``"ln"`` = FedLN).
        fc_dims: widths of the hidden FC layers (default: ``(384, 192)``, the code's).
        bias: give every conv/linear layer a bias (default: False; the code's ``--with_bias``).
        norm_position: ``"after"`` each ReLU (default, the paper's) or ``"before"`` it
            (``conv → norm → ReLU``; "FedLN – before activation", Table 6).
        last_norm: norm at the last hidden site (on the penultimate features), if different from
            ``norm_layer`` (default: None = the same). ``norm="ln_reduced"`` sets it: S at the
            hidden sites and ψ at the last (Prop. 2).
    """

    def __init__(
        self,
        *,
        num_classes: int = 10,
        in_channels: int = 3,
        input_size: int | Sequence[int] = 32,
        norm_layer: NormSpec = "bn",
        fc_dims: Sequence[int] = (384, 192),
        bias: bool = False,
        norm_position: Literal["after", "before"] = "after",
        last_norm: NormSpec = None,
    ) -> None:
        super().__init__()
        validate_common(num_classes, in_channels)
        fc_dims = tuple(int(d) for d in fc_dims)
        if not fc_dims or min(fc_dims) < 1:
            raise ValueError(f"fc_dims must be a non-empty sequence of positive widths, got {fc_dims!r}")
        if norm_position not in ("after", "before"):
            raise ValueError(f"Unknown value '{norm_position}' for argument norm_position. Valid values are ('after', 'before')")
        norm_layer = get_norm_layer(norm_layer)
        final_norm = norm_layer if last_norm is None else get_norm_layer(last_norm)
        self.norm_position = norm_position
        order: BlockOrder = "act_norm" if norm_position == "after" else "norm_act"
        hw = to_hw(input_size)
        layers: list[nn.Module] = []
        channels = in_channels
        for _ in range(2):
            padding = 0 if min(hw) >= 5 else 2
            hw = (conv_out_size(hw[0], 5, 1, padding), conv_out_size(hw[1], 5, 1, padding))
            pool, hw = maybe_max_pool(hw)
            conv = nn.Conv2d(channels, 64, 5, 1, padding, bias=bias)
            layers += _block(conv, norm_layer(64), order=order, tail=(pool,))
            channels = 64
        self.features = nn.Sequential(*layers, nn.Flatten())
        fc: list[nn.Module] = []
        width = channels * hw[0] * hw[1]
        for i, dim in enumerate(fc_dims):
            # the norm is built before its linear layer, as it always was (construction order = seeded init)
            norm = (final_norm if i == len(fc_dims) - 1 else norm_layer)(dim, spatial=False)
            fc += _block(nn.Linear(width, dim, bias=bias), norm, order=order)
            width = dim
        self.fc = nn.Sequential(*fc)
        self.num_features = width
        self.num_classes = num_classes
        self.head = nn.Linear(width, num_classes, bias=bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


@register_model()
def simple_cnn(
    *,
    num_classes: int = 10,
    in_channels: int = 3,
    input_size: int | Sequence[int] = 32,
    norm_layer: NormSpec = "bn",
    fn_before_fc: bool = False,
) -> SimpleCNN:
    """HBN's Simple-CNN (Chen et al. 2025, App. B.1, Table 7); see :class:`SimpleCNN`."""
    return SimpleCNN(num_classes=num_classes, in_channels=in_channels, input_size=input_size, norm_layer=norm_layer,
                     fn_before_fc=fn_before_fc)


@register_model()
def fedbn_cnn(*, num_classes: int = 10, in_channels: int = 3, input_size: int | Sequence[int] = 28, norm_layer: NormSpec = "bn") -> FedBNCNN:
    """FedBN's digits CNN with BN1d in the FC layers (Li et al. 2021, App. D.2, Table 3); see :class:`FedBNCNN`."""
    return FedBNCNN(num_classes=num_classes, in_channels=in_channels, input_size=input_size, norm_layer=norm_layer)


@register_model()
def fbn_cnn(
    *,
    num_classes: int = 10,
    in_channels: int = 3,
    input_size: int | Sequence[int] = 32,
    norm_layer: NormSpec = "bn",
    dropout: float = 0.25,
) -> FBNCNN:
    """FBN's 4-conv CNN, norm after ReLU (Guerraoui et al. 2024, App. C.1, Table 1); see :class:`FBNCNN`."""
    return FBNCNN(num_classes=num_classes, in_channels=in_channels, input_size=input_size, norm_layer=norm_layer, dropout=dropout)


@register_model()
def ln_cnn(
    *,
    num_classes: int = 10,
    in_channels: int = 3,
    input_size: int | Sequence[int] = 32,
    norm_layer: NormSpec = "bn",
    fc_dims: Sequence[int] = (384, 192),
    bias: bool = False,
    norm_position: Literal["after", "before"] = "after",
    last_norm: NormSpec = None,
) -> LNCNN:
    """The LN paper's CNN as in its code (Zhang et al. 2024, App. C.1, Table 7 and ``CNN_CIFAR``); see :class:`LNCNN`."""
    return LNCNN(
        num_classes=num_classes,
        in_channels=in_channels,
        input_size=input_size,
        norm_layer=norm_layer,
        fc_dims=fc_dims,
        bias=bias,
        norm_position=norm_position,
        last_norm=last_norm,
    )
