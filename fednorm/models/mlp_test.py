"""MLP's ``init_std``: the hidden layer drawn from N(0, init_std²) (FedBN Appendix F, α = 10)."""

from __future__ import annotations

import pytest
import torch

from fednorm.models.mlp import MLP


def test_init_std_draws_the_hidden_layer_from_a_wide_normal() -> None:
    torch.manual_seed(0)
    model = MLP(num_classes=2, in_channels=10, input_size=1, hidden=1000, init_std=10.0)
    w, b = model.fc[1].weight.detach(), model.fc[1].bias.detach()
    # 10,000 weights: sample std within 3% of 10 and mean near 0; 1,000 biases within 10%
    assert w.std().item() == pytest.approx(10.0, rel=0.03) and abs(w.mean().item()) < 0.4
    assert b.std().item() == pytest.approx(10.0, rel=0.1)
    default = MLP(num_classes=2, in_channels=10, input_size=1, hidden=1000)
    assert default.fc[1].weight.abs().max().item() <= 10 ** -0.5  # PyTorch's U(-1/sqrt(fan_in), ...)
    with pytest.raises(ValueError, match="init_std"):
        MLP(init_std=0.0)


def test_hidden_widths_stack_linear_norm_relu_blocks_fedbn_abide() -> None:
    """hidden=[16, 16]: FedBN's ABIDE MLP, Linear → BN → ReLU twice, then the head (Li et al., 2021, Sec. 5.2)."""
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    model = MLP(num_classes=2, in_channels=5995, input_size=1, hidden=[16, 16])
    kinds = [type(m) for m in model.fc]
    assert kinds == [nn.Flatten, nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear, nn.BatchNorm1d, nn.ReLU]
    assert model.num_features == 16 and model.head.in_features == 16
    # 5995·16 + 16, BN 2·16, 16·16 + 16, BN 2·16, 16·2 + 2 trainable parameters (counted by hand)
    assert sum(p.numel() for p in model.parameters()) == 5995 * 16 + 16 + 32 + 16 * 16 + 16 + 32 + 16 * 2 + 2
    x = torch.randn(8, 5995, 1, 1)
    l1, b1, l2, b2 = model.fc[1], model.fc[2], model.fc[4], model.fc[5]
    z = F.relu(F.batch_norm(F.linear(x.flatten(1), l1.weight, l1.bias), None, None, b1.weight, b1.bias, training=True))
    z = F.relu(F.batch_norm(F.linear(z, l2.weight, l2.bias), None, None, b2.weight, b2.bias, training=True))
    torch.testing.assert_close(model(x), F.linear(z, model.head.weight, model.head.bias))
    # one width is the one-hidden-layer MLP, with the same state-dict keys as before
    assert list(MLP(hidden=30).state_dict())[:2] == ["fc.1.weight", "fc.1.bias"]
    assert sum(p.numel() for p in MLP(hidden=30).parameters()) == 784 * 30 + 30 + 60 + 30 * 10 + 10  # FedTAN's 23,920 (with BN)
    for bad in ([], [16, 0], "16", [16, True]):
        with pytest.raises(ValueError, match="hidden"):
            MLP(hidden=bad)
