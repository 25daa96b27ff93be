"""Evaluation of a model on a tensor dataset, batched and without gradients."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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
    top_class_share: float = float("nan")
    """The share of the predictions in the most-predicted class: 1.0 for a model stuck on one
    class (FedAvg+BN's stuck start at B = 4 reads exactly 10% on a balanced test set)."""


@torch.inference_mode()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int = 1024,
    channels_last: bool = False,
    forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
    pad_last: bool = False,
    autocast: torch.dtype | None = None,
) -> EvalResult:
    """Cross-entropy and top-1 accuracy of ``model`` in eval mode (the caller's mode is restored).

    ``channels_last`` feeds 4-d batches in channels-last memory format, as training does
    (``ExperimentConfig.channels_last``): about twice as fast for the CNNs on CPU (pooling).
    ``forward`` replaces ``model(batch)`` (e.g. a ``torch.compile``-d model); ``pad_last``
    zero-pads the last partial batch to ``batch_size`` and drops the padded rows' outputs, so a
    compiled forward sees one shape and never recompiles (in eval mode a row's output does not
    depend on the other rows). ``autocast`` runs the forward under ``torch.autocast`` in that
    dtype (e.g. ``torch.bfloat16``); loss and accuracy are computed from float64 logits.
    """
    was_training = model.training
    model.eval()
    run = forward if forward is not None else model
    loss_sum = 0.0
    correct = []
    predicted = []
    for start in range(0, len(x), batch_size):
        xb = x[start : start + batch_size]
        n_real = len(xb)
        if pad_last and n_real < batch_size:
            xb = torch.cat([xb, xb.new_zeros((batch_size - n_real, *xb.shape[1:]))])
        if channels_last and xb.dim() == 4:
            xb = xb.contiguous(memory_format=torch.channels_last)
        with torch.autocast(xb.device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            logits = run(xb)[:n_real]
        logits = logits.double()
        yb = y[start : start + batch_size]
        loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
        predicted.append(logits.argmax(dim=1))
        correct.append(predicted[-1] == yb)
    model.train(was_training)
    n = len(x)
    corr = torch.cat(correct) if correct else torch.zeros(0, dtype=torch.bool)
    return EvalResult(
        loss=loss_sum / n if n else float("nan"),
        accuracy=float(corr.double().mean()) if n else float("nan"),
        correct=corr,
        num_samples=n,
        top_class_share=float(torch.bincount(torch.cat(predicted)).max()) / n if n else float("nan"),
    )
