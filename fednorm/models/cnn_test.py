"""The papers' CNNs keep their state-dict keys and their seeded initialisation.

Checkpoints and committed runs load by key, and a seeded run is reproducible only while the
layers are built in the same order; both are checked against the papers' layer tables written out
here by hand, not against the model code.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from .cnn import FBNCNN, LNCNN, FedBNCNN, SimpleCNN

_BN = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def _keys(conv: dict[str, list[int]], bn: dict[str, list[int]], bias: bool = True) -> list[str]:
    """State-dict keys of a model whose ``prefix`` sequential has convs/linears and BNs at the given indices."""
    keys = []
    for prefix in conv.keys() | bn.keys():
        for i in sorted(conv.get(prefix, []) + bn.get(prefix, [])):
            names = ("weight", "bias") if bias else ("weight",)
            keys += [f"{prefix}.{i}.{n}" for n in (names if i in conv.get(prefix, []) else _BN)]
    return keys


# Paper layer tables -> (Sequential indices of conv/linear layers, of BN layers, whether layers have a bias).
_LAYOUTS = {
    # HBN App. B.1 Table 7: 3 × (conv, BN, ReLU, pool), flatten; fc: linear, ReLU.
    "simple": (SimpleCNN, {"features": [0, 4, 8], "fc": [0]}, {"features": [1, 5, 9]}, True),
    # FedBN App. D.2 Table 3: (conv, BN, ReLU, pool) × 2, conv, BN, ReLU, flatten; fc: 2 × (linear, BN1d, ReLU).
    "fedbn": (FedBNCNN, {"features": [0, 4, 8], "fc": [0, 3]}, {"features": [1, 5, 9], "fc": [1, 4]}, True),
    # FBN App. C.1 Table 1: 2 × [(conv, ReLU, BN) × 2, pool, dropout], flatten; fc: linear, ReLU.
    "fbn": (FBNCNN, {"features": [0, 3, 8, 11], "fc": [0]}, {"features": [2, 5, 10, 13]}, True),
    # LN paper code CNN_CIFAR: 2 × (conv, ReLU, BN, pool), flatten; fc: 2 × (linear, ReLU, BN); no biases.
    "ln": (LNCNN, {"features": [0, 4], "fc": [0, 3]}, {"features": [2, 6], "fc": [2, 5]}, False),
}


@pytest.mark.parametrize("name", sorted(_LAYOUTS))
def test_state_dict_keys_follow_the_papers_layer_tables(name):
    cls, conv, bn, bias = _LAYOUTS[name]
    model = cls(norm_layer="bn")
    head = ["head.weight", "head.bias"] if bias else ["head.weight"]
    assert sorted(model.state_dict()) == sorted(_keys(conv, bn, bias) + head)


def _reference_layers(name: str) -> list[nn.Module]:
    """The papers' weighted layers (CIFAR 32×32, digits 28×28) in forward order; BN draws no random numbers."""
    if name == "simple":
        return [nn.Conv2d(3, 16, 3, 1, 1), nn.Conv2d(16, 32, 3, 1, 1), nn.Conv2d(32, 64, 3, 1, 1),
                nn.Linear(1024, 128), nn.Linear(128, 10)]  # fmt: skip
    if name == "fedbn":
        return [nn.Conv2d(3, 64, 5, 1, 2), nn.Conv2d(64, 64, 5, 1, 2), nn.Conv2d(64, 128, 5, 1, 2),
                nn.Linear(6272, 2048), nn.Linear(2048, 512), nn.Linear(512, 10)]  # fmt: skip
    if name == "fbn":
        return [nn.Conv2d(3, 64, 3, 1, 1), nn.Conv2d(64, 64, 3, 1, 1), nn.Conv2d(64, 128, 3, 1, 1),
                nn.Conv2d(128, 128, 3, 1, 1), nn.Linear(8192, 128), nn.Linear(128, 10)]  # fmt: skip
    return [nn.Conv2d(3, 64, 5, bias=False), nn.Conv2d(64, 64, 5, bias=False), nn.Linear(1600, 384, bias=False),
            nn.Linear(384, 192, bias=False), nn.Linear(192, 10, bias=False)]  # fmt: skip


@pytest.mark.parametrize("name", sorted(_LAYOUTS))
def test_seeded_initialisation_equals_the_layers_built_in_forward_order(name):
    torch.manual_seed(7)
    model = _LAYOUTS[name][0](norm_layer="bn")
    torch.manual_seed(7)
    reference = _reference_layers(name)
    got = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert len(got) == len(reference)
    for a, b in zip(got, reference):
        assert torch.equal(a.weight, b.weight)
        assert (a.bias is None) == (b.bias is None) and (a.bias is None or torch.equal(a.bias, b.bias))
