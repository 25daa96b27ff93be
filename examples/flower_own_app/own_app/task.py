"""Your own pieces: a small CNN with BatchNorm, each client's data, a training loop.

Nothing here is fednorm's except :func:`make_model`, which swaps the BatchNorm layers for the
layers HBN and FBN need (``convert_to_hybrid``, ``convert_norm``). The data are scikit-learn's
bundled 8x8 digits, split over the clients, with a feature shift per client (its own contrast and
brightness, as scanners differ between hospitals): the setting FedBN was made for.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    """Two conv + BatchNorm blocks and a linear classifier, for 1x8x8 images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)  # 8x8 -> 4x4
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)  # 4x4 -> 2x2
        return self.fc(x.flatten(1))


def make_model(method: str) -> nn.Module:
    """``Net`` with the normalization layers ``method`` works with: HBN's hybrid layers for
    ``"hbn"``, FBN's layers for ``"fbn"``, BatchNorm for the others (FedBN, SiloBN, FedAvg)."""
    model = Net()
    if method == "hbn":
        from fednorm.nn import convert_to_hybrid

        model = convert_to_hybrid(model)
    elif method == "fbn":
        from fednorm.nn import convert_norm

        model = convert_norm(model, "fbn")
    return model


Split = tuple[torch.Tensor, torch.Tensor]


def load_data(partition_id: int, num_partitions: int, *, seed: int = 0, test_fraction: float = 0.2) -> tuple[Split, Split]:
    """Client ``partition_id``'s ``(train, test)`` split of the digits, in its own feature domain.

    Tensors take torch's default dtype (call ``torch.set_default_dtype(torch.float64)`` for float64).
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    rows = np.array_split(order, num_partitions)[partition_id]
    images = digits.images[rows] / 16.0
    images = images * (1.0 + 0.5 * partition_id) + 0.25 * partition_id  # this client's contrast and brightness
    x = torch.as_tensor(images, dtype=torch.get_default_dtype()).unsqueeze(1)
    y = torch.as_tensor(digits.target[rows], dtype=torch.int64)
    cut = int(round(len(y) * (1 - test_fraction)))
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, lr: float, batch_size: int, seed: int,
          loss_hook=None) -> float:
    """Plain SGD over shuffled mini-batches (seeded); returns the mean loss. ``loss_hook`` maps the
    data loss to the loss to minimise (fednorm's ``ClientRound.loss``)."""
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    total, steps = 0.0, 0
    for _ in range(epochs):
        for rows in torch.randperm(len(y), generator=generator).split(batch_size):
            if len(rows) < 2:  # BatchNorm needs two samples
                continue
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x[rows]), y[rows])
            (loss if loss_hook is None else loss_hook(loss)).backward()
            optimizer.step()
            total, steps = total + loss.item(), steps + 1
    return total / max(steps, 1)


@torch.no_grad()
def test(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """``(mean loss, accuracy)`` of ``model`` in evaluation mode."""
    model.eval()
    logits = model(x)
    return float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).double().mean())
