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
