"""The papers' models, built by name with a swappable norm: ``get_model("resnet20", norm="gn")``.

Registered models (spec section in parentheses): ``simple_cnn`` (HBN §2.2), ``fedbn_cnn``
(FedBN §2.1), ``fbn_cnn`` (FBN §6), ``ln_cnn`` (LN paper §2.2), ``resnet20`` (FedTAN §4.2),
``resnet18`` (LN paper §2.2, HBN §2.2), ``ln_resnet18`` (the LN paper's norm-after ResNet-18), ``vgg11`` (HBN §2.2) and ``mlp`` (FedTAN §4.2). Every
model is a :class:`ClassifierModel` with ``forward_features``, ``head`` and ``num_features``.
"""

from __future__ import annotations

from .base import ClassifierModel
from .cnn import FBNCNN, LNCNN, FedBNCNN, SimpleCNN, fbn_cnn, fedbn_cnn, ln_cnn, simple_cnn
from .mlp import MLP, mlp
from .registry import MODELS, get_model, list_models, register_model
from .resnet import BasicBlock, ResNet, ln_resnet18, resnet18, resnet20
from .vgg import VGG, vgg11
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
    "VGG",
    "MLP",
    "simple_cnn",
    "fedbn_cnn",
    "fbn_cnn",
    "ln_cnn",
    "resnet20",
    "resnet18",
    "ln_resnet18",
    "vgg11",
    "mlp",
]
