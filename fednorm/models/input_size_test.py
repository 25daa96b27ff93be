"""Every registered model follows the input it is given (issue 19): any image size and channel count."""

from __future__ import annotations

import pytest
import torch

from fednorm.data.datasets import DatasetInfo
from fednorm.models import get_model, list_models
from fednorm.models.summary import count_parameters, describe_model


@pytest.mark.parametrize("in_channels,input_size", [(1, 20), (3, (20, 36)), (3, 13)], ids=str)
@pytest.mark.parametrize("name", list_models())
def test_every_model_builds_and_runs_at_other_sizes(name, in_channels, input_size):
    model = get_model(name, num_classes=5, in_channels=in_channels, input_size=input_size)
    h, w = (input_size, input_size) if isinstance(input_size, int) else input_size
    model.train()
    out = model(torch.randn(4, in_channels, h, w))
    assert out.shape == (4, 5) and torch.isfinite(out).all()


def test_fedbn_cnn_at_28_keeps_the_papers_layers():
    # FedBN Table 3: conv 64-64-128 (k5), fc 6272 -> 2048 -> 512 -> 10, BN after every layer but the head
    convs = 3 * 64 * 25 + 64 + 64 * 64 * 25 + 64 + 64 * 128 * 25 + 128
    fcs = 6272 * 2048 + 2048 + 2048 * 512 + 512 + 512 * 10 + 10
    bn = 2 * (64 + 64 + 128 + 2048 + 512)
    model = get_model("fedbn_cnn", num_classes=10, in_channels=3, input_size=28)
    assert count_parameters(model) == (convs + fcs + bn, convs + fcs + bn)
    info = DatasetInfo(name="x", num_classes=10, in_channels=3, image_size=(28, 28), mean=(0.5,) * 3, std=(0.5,) * 3)
    assert describe_model(model, "fedbn_cnn", "bn", info) == (
        f"model fedbn_cnn+bn: {convs + fcs + bn:,} parameters, input 3×28×28, 10 classes"
    )
    # the first linear layer follows the input: 128·5·5 inputs at 20×20
    small = get_model("fedbn_cnn", num_classes=10, in_channels=3, input_size=20)
    assert small.fc[0].in_features == 128 * 5 * 5
