"""ResNets: FedTAN's ResNet-20 (option-A shortcut), ResNet-18 and ResNet-50 (HBN Table 5).

:class:`ResNet` covers them all: a 3×3 stem without max-pool (or torchvision's ImageNet stem), stages
of :class:`BasicBlock` (or torchvision's :class:`Bottleneck`, ResNet-50), global average pooling and
a linear head. With the ImageNet stem the layers are torchvision's, so its ImageNet checkpoints load
(``pretrained=PATH``; :mod:`fednorm.models.pretrained`, keys renamed by :func:`from_torchvision_key`). Two shortcut types exist:
option A (He et al. 2016, §4.2: stride-2 subsampling plus zero channel padding, no parameters),
used by ResNet-20 (FedTAN's, as its authors' released code builds it), and option B (1×1 conv,
plus norm), used by
ResNet-18. ``norm_position="after"`` moves every norm behind its activation, the LN paper's
``group_norm_after`` ResNet (Zhang et al., 2024, App. C.1, and the authors' released code).
"""

from __future__ import annotations

from typing import Literal, Sequence

import re

import torch
import torch.nn.functional as F
from torch import nn

from ..nn.norms import NormLayer, NormSpec, get_norm_layer
from .base import ClassifierModel, to_hw, validate_common
from .pretrained import PretrainedNorm, load_torchvision_weights
from .registry import register_model

__all__ = ["PadShortcut", "BasicBlock", "Bottleneck", "ResNet", "resnet20", "resnet18", "resnet50", "ln_resnet18",
           "from_torchvision_key", "to_torchvision_key"]

Shortcut = Literal["A", "B"]
NormPosition = Literal["before", "after"]
NormSites = Literal["all", "block_output"]
Stem = Literal["cifar", "imagenet"]
Block = Literal["basic", "bottleneck"]
Init = Literal["default", "kaiming_normal", "torchvision"]


class PadShortcut(nn.Module):
    """Option-A shortcut: ``F.pad(x[:, :, ::s, ::s], (0, 0, 0, 0, p, q))`` (akamaster's ResNet-20).

    Subsamples spatially by ``stride`` and zero-pads the channel axis from ``in_planes`` to
    ``planes`` (``p = (planes - in_planes) // 2`` in front, the rest behind; for the doubling
    stages this is the reference's ``planes // 4`` on each side). It has no parameters.
    """

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        if planes < in_planes:
            raise ValueError(f"option-A shortcut cannot reduce channels ({in_planes} -> {planes})")
        self.in_planes = in_planes
        self.stride = stride
        self.pad_front = (planes - in_planes) // 2
        self.pad_back = planes - in_planes - self.pad_front

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, self.pad_front, self.pad_back))

    def extra_repr(self) -> str:
        return f"stride={self.stride}, pad=({self.pad_front}, {self.pad_back})"


def _conv3x3(in_planes: int, planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)


class BasicBlock(nn.Module):
    """Two 3×3 convolutions with a residual connection.

    ``norm_position="before"`` (He et al.): ``relu(norm2(conv2(relu(norm1(conv1(x))))) + sc(x))``.
    ``norm_position="after"`` (LN paper's ``BasicBlockGroupnormAfter``):
    ``norm2(relu(conv2(norm1(relu(conv1(x)))) + sc(x)))``; its option-B shortcut has no norm.

    Args:
        in_planes: input channels.
        planes: output channels.
        stride: stride of the first convolution and of the shortcut.
        norm_layer: resolved norm builder.
        shortcut: ``"A"`` (parameter-free padding) or ``"B"`` (1×1 conv), used only when the
            shape changes; otherwise the shortcut is the identity.
        norm_position: ``"before"`` or ``"after"`` the activation.
        norm_sites: ``"all"`` or ``"block_output"`` (only ``norm2``, on the block's post-ReLU
            output; ``norm1`` is the identity). ``"block_output"`` needs ``norm_position="after"``.
    """

    #: output channels per ``planes``
    expansion = 1

    def __init__(
        self,
        in_planes: int,
        planes: int,
        stride: int,
        norm_layer: NormLayer,
        *,
        shortcut: Shortcut = "B",
        norm_position: NormPosition = "before",
        norm_sites: NormSites = "all",
    ) -> None:
        super().__init__()
        self.norm_position = norm_position
        self.conv1 = _conv3x3(in_planes, planes, stride)
        self.norm1 = norm_layer(planes) if norm_sites == "all" else nn.Identity()
        self.conv2 = _conv3x3(planes, planes)
        self.norm2 = norm_layer(planes)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module
        if stride == 1 and in_planes == planes:
            self.shortcut = nn.Identity()
        elif shortcut == "A":
            self.shortcut = PadShortcut(in_planes, planes, stride)
        elif norm_position == "after":
            self.shortcut = nn.Conv2d(in_planes, planes, 1, stride, bias=False)
        else:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False), norm_layer(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm_position == "before":
            out = self.relu(self.norm1(self.conv1(x)))
            out = self.norm2(self.conv2(out))
            return self.relu(out + self.shortcut(x))
        out = self.norm1(self.relu(self.conv1(x)))
        out = self.conv2(out) + self.shortcut(x)
        return self.norm2(self.relu(out))


class Bottleneck(nn.Module):
    """torchvision's ResNet-50 block (ResNet v1.5: the stride sits on the 3×3 convolution).

    ``relu(norm3(conv3(relu(norm2(conv2(relu(norm1(conv1(x)))))))) + sc(x))`` with ``conv1`` 1×1
    (``in_planes → planes``), ``conv2`` 3×3 with ``stride``, ``conv3`` 1×1 (``planes → 4·planes``),
    no conv bias; the shortcut is the identity, or a 1×1 conv with stride plus a norm (option B,
    torchvision's ``downsample``) where the shape changes. Only the norm-before-activation placement
    and option-B shortcuts exist for it.
    """

    expansion = 4

    def __init__(
        self,
        in_planes: int,
        planes: int,
        stride: int,
        norm_layer: NormLayer,
        *,
        shortcut: Shortcut = "B",
        norm_position: NormPosition = "before",
        norm_sites: NormSites = "all",
    ) -> None:
        super().__init__()
        if shortcut != "B" or norm_position != "before" or norm_sites != "all":
            raise ValueError(
                "the bottleneck block (ResNet-50) has only option-B shortcuts, norms before the activation and a "
                f"norm after every convolution; got shortcut={shortcut!r}, norm_position={norm_position!r}, "
                f"norm_sites={norm_sites!r}"
            )
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.norm1 = norm_layer(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.norm2 = norm_layer(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.norm3 = norm_layer(out)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module
        if stride == 1 and in_planes == out:
            self.shortcut = nn.Identity()
        else:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, out, 1, stride, bias=False), norm_layer(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.relu(self.norm2(self.conv2(out)))
        out = self.norm3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


class ResNet(ClassifierModel):
    """A ResNet of :class:`BasicBlock` stages for small images.

    Convolutions have no bias; the head is ``Linear(widths[-1] → C)`` with bias, after global
    average pooling (``AdaptiveAvgPool2d(1)``: equal to the references' ``avg_pool2d(out, 4)`` /
    ``avg_pool2d(out, out.size(3))`` on 32×32 inputs, and valid on any input size).

    Args:
        layers: number of blocks per stage.
        widths: channels per stage; the first block of stage i > 0 has stride 2.
        num_classes: number of logits.
        in_channels: input channels.
        input_size: validated only; the network is size-agnostic thanks to global pooling.
        norm_layer: norm specification, resolved by ``get_norm_layer``.
        shortcut: ``"A"`` or ``"B"``, see :class:`BasicBlock`.
        norm_position: ``"before"`` (default) or ``"after"`` the activations, stem included.
        stem: ``"cifar"`` (conv3×3, stride 1, no max-pool) or ``"imagenet"`` (torchvision's
            conv7×7 stride 2 + max-pool 3×3 stride 2; HBN's Tiny-ImageNet ResNet-18, Chen et al.,
            2025, Sec. 4.1).
        init: ``"default"`` (torch's), ``"kaiming_normal"`` (``kaiming_normal_`` on every conv
            and linear weight, as akamaster's ResNet-20; norm weights 1 and biases 0) or
            ``"torchvision"`` (torchvision's ResNet: ``kaiming_normal_(mode="fan_out")`` on every conv,
            norms 1 and 0, the linear head torch's default).
        block: ``"basic"`` (:class:`BasicBlock`) or ``"bottleneck"`` (:class:`Bottleneck`, whose
            stages end with ``4 × width`` channels).
        norm_sites: ``"all"`` (default) or ``"block_output"``: a norm only on each residual
            block's post-ReLU output (stem and ``norm1`` are the identity), the LN paper's
            "FedFN – inside ψ/φ" ResNets (Zhang et al., 2024, Table 13). Needs ``norm_position="after"``.
    """

    def __init__(
        self,
        layers: Sequence[int],
        widths: Sequence[int],
        *,
        num_classes: int = 10,
        in_channels: int = 3,
        input_size: int | Sequence[int] = 32,
        norm_layer: NormSpec = "bn",
        shortcut: Shortcut = "B",
        norm_position: NormPosition = "before",
        stem: Stem = "cifar",
        init: Init = "default",
        norm_sites: NormSites = "all",
        block: Block = "basic",
    ) -> None:
        super().__init__()
        validate_common(num_classes, in_channels)
        to_hw(input_size)
        if len(layers) != len(widths) or not layers:
            raise ValueError(f"layers and widths must be non-empty and of equal length, got {layers!r}, {widths!r}")
        for arg, value, valid in (
            ("shortcut", shortcut, ("A", "B")),
            ("norm_position", norm_position, ("before", "after")),
            ("stem", stem, ("cifar", "imagenet")),
            ("init", init, ("default", "kaiming_normal", "torchvision")),
            ("norm_sites", norm_sites, ("all", "block_output")),
            ("block", block, ("basic", "bottleneck")),
        ):
            if value not in valid:
                raise ValueError(f"Unknown value '{value}' for argument {arg}. Valid values are {valid}")
        if norm_sites == "block_output" and norm_position != "after":
            raise ValueError("norm_sites='block_output' needs norm_position='after' (the norm sits on the block's post-ReLU output)")
        norm_layer = get_norm_layer(norm_layer)
        self.norm_position = norm_position
        planes = widths[0]
        if stem == "cifar":
            self.conv1 = _conv3x3(in_channels, planes)
        else:
            self.conv1 = nn.Conv2d(in_channels, planes, 7, 2, 3, bias=False)
        self.norm1 = norm_layer(planes) if norm_sites == "all" else nn.Identity()
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1) if stem == "imagenet" else nn.Identity()
        block_cls = BasicBlock if block == "basic" else Bottleneck
        stages: list[nn.Module] = []
        for i, (depth, width) in enumerate(zip(layers, widths)):
            blocks: list[nn.Module] = []
            for j in range(depth):
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(block_cls(
                    planes, width, stride, norm_layer, shortcut=shortcut, norm_position=norm_position, norm_sites=norm_sites
                ))
                planes = width * block_cls.expansion
            stages.append(nn.Sequential(*blocks))
        self.layers = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.num_features = planes
        self.num_classes = num_classes
        self.head = nn.Linear(planes, num_classes)
        if init == "kaiming_normal":
            for m in self.modules():
                if isinstance(m, (nn.Conv2d, nn.Linear)):
                    nn.init.kaiming_normal_(m.weight)
        elif init == "torchvision":
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = self.relu(self.norm1(x)) if self.norm_position == "before" else self.norm1(self.relu(x))
        x = self.layers(self.maxpool(x))
        return torch.flatten(self.pool(x), 1)


@register_model()
def resnet20(
    *,
    num_classes: int = 10,
    in_channels: int = 3,
    input_size: int | Sequence[int] = 32,
    norm_layer: NormSpec = "bn",
) -> ResNet:
    """CIFAR ResNet-20 with option-A shortcuts (Wang et al., 2023, Sec. 6.1.1; akamaster's code, which
    the authors' released code uses).

    Stem ``conv3×3(→16) → Norm → ReLU``; three stages of 3 blocks with 16, 32, 64 channels
    (stride 2 at the start of stages 2 and 3); option-A (zero-padding) shortcuts; global average
    pool; ``Linear(64 → C)``. No conv bias; ``kaiming_normal_`` on conv and linear weights.
    With ``"bn"`` and 10 classes: 19 convs each followed by BN, 269,722 trainable parameters and
    1,376 BN running statistics. ``num_features`` is 64.
    """
    return ResNet(
        (3, 3, 3),
        (16, 32, 64),
        num_classes=num_classes,
        in_channels=in_channels,
        input_size=input_size,
        norm_layer=norm_layer,
        shortcut="A",
        init="kaiming_normal",
    )


@register_model()
def resnet18(
    *,
    num_classes: int = 10,
    in_channels: int = 3,
    input_size: int | Sequence[int] = 32,
    norm_layer: NormSpec = "bn",
    norm_position: NormPosition = "before",
    stem: Stem = "cifar",
    norm_sites: NormSites = "all",
    init: Init = "default",
    pretrained: str | None = None,
    pretrained_norm: PretrainedNorm = "fresh",
) -> ResNet:
    """CIFAR ResNet-18 (Zhang et al., 2024, App. C.1; Chen et al., 2025, Table 5).

    Stem ``conv3×3(→64, s1)`` with no max-pool; four stages of 2 BasicBlocks with 64, 128, 256,
    512 channels (strides 1, 2, 2, 2); 1×1 conv shortcuts (with a norm) where the shape changes;
    global average pool; ``Linear(512 → C)`` with bias. No conv bias; torch's default init.
    11,173,962 parameters with ``"bn"`` and 10 classes. ``num_features`` is 512.

    ``norm_position="after"`` gives the LN paper's ResNet (``group_norm_after``): each norm
    after its ReLU, in the stem and in the blocks, and shortcuts without norm (the authors'
    released code; use with ``norm="ln"`` for FedLN-ResNet). ``stem="imagenet"`` gives torchvision's
    ResNet-18 (HBN's Tiny-ImageNet and Table 5 model, 11,689,512 parameters with BN and 1000 classes);
    ``init="torchvision"`` its initialisation; ``pretrained=PATH`` loads torchvision's ImageNet
    checkpoint (``resnet18-f37072fd.pth``) into that form, ``pretrained_norm`` saying what happens to
    its BatchNorm tensors (:mod:`fednorm.models.pretrained`).
    """
    model = ResNet(
        (2, 2, 2, 2),
        (64, 128, 256, 512),
        num_classes=num_classes,
        in_channels=in_channels,
        input_size=input_size,
        norm_layer=norm_layer,
        shortcut="B",
        norm_position=norm_position,
        stem=stem,
        norm_sites=norm_sites,
        init=init,
    )
    if pretrained is not None:
        load_torchvision_weights(model, pretrained, from_torchvision_key, norm=pretrained_norm, arch="resnet18")
    return model


@register_model()
def resnet50(
    *,
    num_classes: int = 10,
    in_channels: int = 3,
    input_size: int | Sequence[int] = 32,
    norm_layer: NormSpec = "bn",
    stem: Stem = "cifar",
    init: Init = "torchvision",
    pretrained: str | None = None,
    pretrained_norm: PretrainedNorm = "fresh",
) -> ResNet:
    """ResNet-50 (He et al., 2016; HBN Table 5, Chen et al., 2025), torchvision's layers.

    Four stages of 3, 4, 6, 3 :class:`Bottleneck` blocks with widths 64, 128, 256, 512 (outputs
    256, 512, 1024, 2048; stride 2 on the 3×3 conv of each stage's first block but the first's),
    option-B shortcuts with a norm, global average pool, ``Linear(2048 → C)``; torchvision's
    initialisation by default. ``stem="cifar"`` (default, as :func:`resnet18`): ``conv3×3(→64, s1)``
    without max-pool, so a 32×32 input ends at 4×4; ``stem="imagenet"``: torchvision's ``conv7×7 s2
    + max-pool`` (what HBN trained on 32×32 CIFAR-100, ending at 1×1), 25,557,032 parameters with BN
    and 1000 classes. ``pretrained=PATH`` loads torchvision's ImageNet checkpoint
    (``resnet50-0676ba61.pth``) into the ImageNet form (:mod:`fednorm.models.pretrained`).
    ``num_features`` is 2048.
    """
    model = ResNet(
        (3, 4, 6, 3),
        (64, 128, 256, 512),
        num_classes=num_classes,
        in_channels=in_channels,
        input_size=input_size,
        norm_layer=norm_layer,
        shortcut="B",
        stem=stem,
        init=init,
        block="bottleneck",
    )
    if pretrained is not None:
        load_torchvision_weights(model, pretrained, from_torchvision_key, norm=pretrained_norm, arch="resnet50")
    return model


def from_torchvision_key(key: str) -> str:
    """A torchvision ResNet state-dict key as :class:`ResNet`'s (``layer1.0.bn1.weight`` ->
    ``layers.0.0.norm1.weight``, ``layer2.0.downsample.0.weight`` -> ``layers.1.0.shortcut.0.weight``,
    ``bn1`` -> ``norm1``, ``fc`` -> ``head``)."""
    key = re.sub(r"^bn1\.", "norm1.", key)
    key = re.sub(r"^fc\.", "head.", key)
    m = re.match(r"^layer(\d+)\.(\d+)\.(.*)$", key)
    if m:
        rest = re.sub(r"^bn(\d)\.", r"norm\1.", m.group(3))
        rest = re.sub(r"^downsample\.", "shortcut.", rest)
        key = f"layers.{int(m.group(1)) - 1}.{m.group(2)}.{rest}"
    return key


def to_torchvision_key(key: str) -> str:
    """The inverse of :func:`from_torchvision_key`."""
    key = re.sub(r"^norm1\.", "bn1.", key)
    key = re.sub(r"^head\.", "fc.", key)
    m = re.match(r"^layers\.(\d+)\.(\d+)\.(.*)$", key)
    if m:
        rest = re.sub(r"^norm(\d)\.", r"bn\1.", m.group(3))
        rest = re.sub(r"^shortcut\.", "downsample.", rest)
        key = f"layer{int(m.group(1)) + 1}.{m.group(2)}.{rest}"
    return key


@register_model()
def ln_resnet18(
    *,
    num_classes: int = 10,
    in_channels: int = 3,
    input_size: int | Sequence[int] = 32,
    norm_layer: NormSpec = "ln",
    norm_position: NormPosition = "after",
    norm_sites: NormSites = "all",
) -> ResNet:
    """The LN paper's CIFAR ResNet-18 (Zhang et al., 2024, App. C.1; the released code's ``group_norm_after``).

    :func:`resnet18` with every norm *after* its ReLU, in the stem and in the blocks
    (``conv → ReLU → N → conv → (+ shortcut) → ReLU → N``), 1×1 conv shortcuts without a norm,
    no conv biases, global average pooling (= the code's ``avg_pool2d(out, 4)`` on 32×32) and a
    head ``Linear(512 → C)`` with bias. ``norm="ln"`` is FedLN-ResNet (``get_model``'s norm default is
    ``"bn"``, so name the norm),
    ``"none"`` the vanilla ResNet, ``"fn"`` FedFN-ResNet, ``"fn_inside_ln"``/``"fn_inside_sn"``
    the Table 13 variants.
    """
    return resnet18(
        num_classes=num_classes,
        in_channels=in_channels,
        input_size=input_size,
        norm_layer=norm_layer,
        norm_position=norm_position,
        norm_sites=norm_sites,
    )
