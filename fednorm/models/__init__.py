"""The papers' models, built by name with a swappable norm: ``get_model("resnet20", norm="gn")``.

Registered models (the paper's section in parentheses): ``simple_cnn`` (HBN App. B.1),
``fedbn_cnn`` (FedBN App. D.2), ``fbn_cnn`` (FBN App. C.1), ``ln_cnn`` (LN paper App. C.1),
``resnet20`` (FedTAN Sec. 6.1.1), ``resnet18`` (LN paper App. C.1, HBN Sec. 4.1), ``ln_resnet18``
(the LN paper's norm-after ResNet-18), ``resnet50``, ``vgg11``, ``vgg19``, ``mobilenet_v2`` (HBN
Table 5; torchvision's layers, ImageNet checkpoints load from a local file:
:mod:`fednorm.models.pretrained`), ``alexnet_bn`` (FedBN App. D, FedTAN Figs. 8 and 13) and ``mlp``
(FedTAN Sec. 6.1.1). Every model is a :class:`ClassifierModel` with ``forward_features``, ``head``
and ``num_features``.
"""

from __future__ import annotations

from .base import ClassifierModel
from .cnn import FBNCNN, LNCNN, FedBNCNN, SimpleCNN, fbn_cnn, fedbn_cnn, ln_cnn, simple_cnn
from .alexnet import AlexNetBN, alexnet_bn
from .mlp import MLP, mlp
from .mobilenet import MobileNetV2, mobilenet_v2
from .registry import MODELS, get_model, list_models, register_model
from .resnet import BasicBlock, Bottleneck, ResNet, ln_resnet18, resnet18, resnet20, resnet50
from .vgg import VGG, vgg11, vgg19
from . import user  # registers model user:NAME (an nn.Module given from Python)

__all__ = [
    "MODELS",
    "register_model",
    "list_models",
    "get_model",
    "ClassifierModel",
    "SimpleCNN",
    "FedBNCNN",
    "FBNCNN",
    "LNCNN",
    "ResNet",
    "BasicBlock",
    "Bottleneck",
    "VGG",
    "MobileNetV2",
    "AlexNetBN",
    "MLP",
    "simple_cnn",
    "fedbn_cnn",
    "fbn_cnn",
    "ln_cnn",
    "resnet20",
    "resnet18",
    "ln_resnet18",
    "resnet50",
    "vgg11",
    "vgg19",
    "mobilenet_v2",
    "alexnet_bn",
    "mlp",
]
