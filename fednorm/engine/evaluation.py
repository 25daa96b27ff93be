"""Evaluation of a model on a tensor dataset, batched and without gradients."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["EvalResult", "evaluate"]


@dataclass
class EvalResult:
    loss: float
    accuracy: float
    correct: torch.Tensor  # bool per sample, so per-client accuracies are cheap slices
    num_samples: int


@torch.inference_mode()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 1024) -> EvalResult:
    """Cross-entropy and top-1 accuracy of ``model`` in eval mode (the caller's mode is restored)."""
    was_training = model.training
    model.eval()
    loss_sum = 0.0
    correct = []
    for start in range(0, len(x), batch_size):
        logits = model(x[start : start + batch_size])
        yb = y[start : start + batch_size]
        loss_sum += float(F.cross_entropy(logits.double(), yb, reduction="sum"))
        correct.append(logits.argmax(dim=1) == yb)
    model.train(was_training)
    n = len(x)
    corr = torch.cat(correct) if correct else torch.zeros(0, dtype=torch.bool)
    return EvalResult(
        loss=loss_sum / n if n else float("nan"),
        accuracy=float(corr.double().mean()) if n else float("nan"),
        correct=corr,
        num_samples=n,
    )
