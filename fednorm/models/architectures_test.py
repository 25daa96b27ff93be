"""HBN Table 5's architectures (ResNet-50, VGG-11/19, MobileNetV2) and FedBN's AlexNet-BN, counted
layer by layer from their papers' descriptions, independently of the builders."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fednorm.models import get_model
from fednorm.nn.hbn import HybridBatchNorm
from fednorm.nn.norms import norm_modules


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _conv(c_in: int, c_out: int, k: int, *, bias: bool = False, groups: int = 1) -> int:
    return c_in // groups * c_out * k * k + (c_out if bias else 0)


def _linear(d_in: int, d_out: int) -> int:
    return d_in * d_out + d_out


def resnet50_count(num_classes: int, stem: str = "imagenet") -> int:
    """He et al. 2016, Table 1 (50-layer): stem, then [1×1 w, 3×3 w, 1×1 4w] × (3, 4, 6, 3); BN = 2 per channel."""
    total = (_conv(3, 64, 7) if stem == "imagenet" else _conv(3, 64, 3)) + 2 * 64
    c_in = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            total += _conv(c_in, width, 1) + _conv(width, width, 3) + _conv(width, 4 * width, 1) + 2 * (width + width + 4 * width)
            if b == 0:  # projection shortcut (the stage's channels or stride change)
                total += _conv(c_in, 4 * width, 1) + 2 * 4 * width
            c_in = 4 * width
    return total + _linear(2048, num_classes)


VGG11 = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]  # Simonyan & Zisserman, config A
VGG19 = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"]  # E


def vgg_bn_count(cfg: list, num_classes: int, classifier: str) -> int:
    total, c_in = 0, 3
    for v in cfg:
        if v != "M":
            total += _conv(c_in, v, 3, bias=True) + 2 * v
            c_in = v
    if classifier == "imagenet":
        return total + _linear(512 * 7 * 7, 4096) + _linear(4096, 4096) + _linear(4096, num_classes)
    return total + _linear(512, num_classes)


def mobilenet_v2_count(num_classes: int) -> int:
    """Sandler et al. 2018, Table 2: (t, c, n) rows of inverted residuals between a 3×3 stem (32) and a 1×1 conv (1280)."""
    total = _conv(3, 32, 3) + 2 * 32
    c_in = 32
    for t, c, n in ((1, 16, 1), (6, 24, 2), (6, 32, 3), (6, 64, 4), (6, 96, 3), (6, 160, 3), (6, 320, 1)):
        for _ in range(n):
            hidden = c_in * t
            if t != 1:
                total += _conv(c_in, hidden, 1) + 2 * hidden
            total += _conv(hidden, hidden, 3, groups=hidden) + 2 * hidden + _conv(hidden, c, 1) + 2 * c
            c_in = c
    return total + _conv(320, 1280, 1) + 2 * 1280 + _linear(1280, num_classes)


def alexnet_bn_count(num_classes: int) -> int:
    """FedBN App. D Table 9's layer list (as the authors' code has it): 5 convs (with bias) and 2 FC layers, each with BN, then the head."""
    convs = [(3, 64, 11), (64, 192, 5), (192, 384, 3), (384, 256, 3), (256, 256, 3)]
    total = sum(_conv(a, b, k, bias=True) + 2 * b for a, b, k in convs)
    return total + _linear(9216, 4096) + 2 * 4096 + _linear(4096, 4096) + 2 * 4096 + _linear(4096, num_classes)


def test_hand_counts_equal_torchvisions_published_sizes():
    # torchvision's model cards (num_params of the IMAGENET1K_V1 weights): an independent check of the hand counts
    assert resnet50_count(1000) == 25_557_032
    assert vgg_bn_count(VGG11, 1000, "imagenet") == 132_868_840
    assert vgg_bn_count(VGG19, 1000, "imagenet") == 143_678_248
    assert mobilenet_v2_count(1000) == 3_504_872
    # torchvision's AlexNet (61,100,840) has the same conv/FC shapes; FedBN adds 7 BN layers and a 10-way head
    assert alexnet_bn_count(10) == 61_100_840 - _linear(4096, 1000) + _linear(4096, 10) + 2 * (64 + 192 + 384 + 256 + 256 + 4096 + 4096)


@pytest.mark.parametrize("num_classes", [10, 100, 1000])
def test_parameter_counts_match_the_hand_counts(num_classes):
    assert _params(get_model("resnet50", num_classes=num_classes, stem="imagenet")) == resnet50_count(num_classes)
    assert _params(get_model("resnet50", num_classes=num_classes)) == resnet50_count(num_classes, stem="cifar")
    assert _params(get_model("mobilenet_v2", num_classes=num_classes)) == mobilenet_v2_count(num_classes)
    assert _params(get_model("mobilenet_v2", num_classes=num_classes, stem="imagenet")) == mobilenet_v2_count(num_classes)
    for name, cfg in (("vgg11", VGG11), ("vgg19", VGG19)):
        assert _params(get_model(name, num_classes=num_classes)) == vgg_bn_count(cfg, num_classes, "cifar")
    assert _params(get_model("alexnet_bn", num_classes=num_classes)) == alexnet_bn_count(num_classes)


def test_large_vgg_counts_match_the_hand_counts():
    for name, cfg in (("vgg11", VGG11), ("vgg19", VGG19)):
        assert _params(get_model(name, num_classes=100, classifier="imagenet")) == vgg_bn_count(cfg, 100, "imagenet")


# norm layers: ResNet-50 1 + 16·3 + 4 projections; VGG one per conv; MobileNetV2 one per conv (52); AlexNet 5 + 2
NORMS = {"resnet50": 53, "vgg11": 8, "vgg19": 16, "mobilenet_v2": 52, "alexnet_bn": 7}


@pytest.mark.parametrize("name", sorted(NORMS))
@pytest.mark.parametrize("norm", ["gn", "hbn"])
def test_norm_choice_replaces_every_batch_norm(name, norm):
    model = get_model(name, norm=norm, num_classes=100, input_size=32)
    norms = norm_modules(model)
    assert len(norms) == NORMS[name]
    if norm == "gn":
        assert all(isinstance(m, nn.GroupNorm) and m.num_groups == 2 for _, m in norms)
        assert not any(isinstance(m, _BatchNorm) for m in model.modules())
    else:
        assert all(isinstance(m, HybridBatchNorm) for _, m in norms)
        assert not any(isinstance(m, _BatchNorm) and not isinstance(m, HybridBatchNorm) for m in model.modules())


def test_alexnet_bn_puts_a_1d_norm_after_each_hidden_fc_and_none_after_the_head():
    model = get_model("alexnet_bn")
    assert [type(m).__name__ for m in model.classifier] == ["Linear", "BatchNorm1d", "ReLU", "Linear", "BatchNorm1d", "ReLU"]
    assert isinstance(model.head, nn.Linear) and model.head.in_features == 4096
    assert [n for n, m in model.features.named_children() if isinstance(m, nn.BatchNorm2d)] == [f"bn{i}" for i in range(1, 6)]


@pytest.mark.parametrize(
    "name,kwargs,size,features,last_map",
    [
        ("resnet50", {"stem": "imagenet"}, 32, 2048, 1),  # HBN's torchvision form on CIFAR: 32 → 1×1 before the pool
        ("resnet50", {}, 32, 2048, 4),
        ("vgg19", {"classifier": "imagenet"}, 32, 4096, 1),
        ("vgg19", {}, 32, 512, 1),
        ("mobilenet_v2", {"stem": "imagenet"}, 32, 1280, 1),
        ("mobilenet_v2", {}, 32, 1280, 4),
        ("alexnet_bn", {}, 256, 4096, 7),  # FedBN's input: the last pool leaves 256×7×7, averaged to 6×6
    ],
    ids=str,
)
def test_output_shapes(name, kwargs, size, features, last_map):
    torch.manual_seed(0)
    model = get_model(name, num_classes=100, input_size=size, **kwargs).eval()
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        assert model.forward_features(x).shape == (2, features) == (2, model.num_features)
        assert model(x).shape == (2, 100)
        body = model.features if hasattr(model, "features") else nn.Sequential(
            model.conv1, model.norm1, model.relu, model.maxpool, model.layers)
        assert body(x).shape[-2:] == (last_map, last_map)
