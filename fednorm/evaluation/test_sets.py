"""A run's latest model on another test set, with a binomial interval.

The CIFAR-10 test set every committed figure used is decoded from JPEG copies (lossy; its README
expects 2–3 points lower accuracy than the original set). ``fednorm evaluate RUN --test-file F``
scores the run's latest checkpoint, as the run itself evaluates it (HBN's statistics re-synced,
the global model), on the images of ``F`` (an ``.npz`` with uint8 ``x`` N×H×W×C and int64 ``y``,
e.g. the 1,000 lossless test images), normalised as the run's inputs were, and reports the
accuracy with its 95% Wilson interval beside the run's own test set. Results go to
``RUN/evaluation.json``, one entry per file.
"""

from __future__ import annotations

import hashlib
import json
import math
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..engine.runlock import holding_run_lock
from ..errors import ConfigError, DatasetError

__all__ = ["evaluate_run", "evaluate_run_on", "wilson_interval", "EVALUATION_FILE"]

EVALUATION_FILE = "evaluation.json"


def wilson_interval(correct: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% by default): unlike the normal
    approximation it stays inside [0, 1] and is honest for 1,000 images."""
    if n <= 0:
        return (math.nan, math.nan)
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def _load_test_file(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path) as f:
            x, y = f["x"], f["y"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:  # a truncated copy raises the last two
        raise DatasetError(f"{path} is not an .npz with arrays x (N×H×W×C uint8) and y (N labels): {exc}") from None
    if x.ndim != 4 or y.ndim != 1 or len(x) != len(y):
        raise DatasetError(f"{path} holds x of shape {x.shape} and y of shape {y.shape}; expected N×H×W×C and N")
    return x, y.astype(np.int64)


def evaluate_run(run_dir: str | Path, *, model: Any = None, data: Any = None, data_dir: str | None = None,
                 device: str | None = None) -> dict[str, Any]:
    """Evaluate ``run_dir``'s latest checkpoint on its own test data exactly as the run evaluated
    its last round: the same method's evaluation state (HBN's statistics re-synced from that
    round's clients), each client's own model under a personalized method (FedBN), so the figures
    equal the run's last recorded ones. Reads the run; writes nothing.

    ``model``/``data``: a run of the user's own module or data takes them back
    (:func:`~fednorm.engine.reload.simulation_from_run`).

    Returns:
        ``round`` and the run's evaluation keys: ``test_accuracy``, ``test_loss``,
        ``mean_client_accuracy``, ``client_accuracies`` (one per client, ``None`` for a client
        without test data), and ``top_class_share`` or ``domain_accuracies`` where the run has them.
    """
    from ..engine.reload import simulation_from_run

    sim, checkpoint = simulation_from_run(run_dir, model=model, data=data, data_dir=data_dir, device=device, what="evaluate")
    r = sim.server_round
    if r >= 1:
        sim.method.configure_round(r, sim.sample_clients(r))  # the last round's clients, as the run evaluated
    return {"round": int(checkpoint.get("server_round", r)), **sim.evaluate()}


@holding_run_lock("evaluate", "it is still training: evaluate it once that run has finished")
def evaluate_run_on(run_dir: str | Path, test_file: str | Path, *, model: Any = None, data: Any = None,
                    data_dir: str | None = None, write: bool = True) -> dict[str, Any]:
    """Evaluate ``run_dir``'s latest checkpoint on ``test_file`` and on the run's own test set
    (on the run's device, or the CPU where that is a GPU this machine lacks); ``model``/``data``
    as :func:`evaluate_run` takes them."""
    from ..data.federated import input_norm_values
    from ..data.transforms import normalize
    from ..engine.reload import simulation_from_run

    run_dir, test_file = Path(run_dir), Path(test_file)
    sim, checkpoint = simulation_from_run(run_dir, model=model, data=data, data_dir=data_dir, what="evaluate")
    cfg = sim.config
    if sim.method.personalized:
        raise ConfigError(f"method '{cfg.method}' evaluates each client with its own model: there is no one global model "
                          "to score on another test set")
    x, y = _load_test_file(test_file)
    info = sim.data.info
    if tuple(x.shape[1:3]) != tuple(info.image_size) or x.shape[3] != info.in_channels:
        raise DatasetError(f"{test_file} holds {x.shape[1]}×{x.shape[2]}×{x.shape[3]} images; the run trained on "
                           f"{info.image_size[0]}×{info.image_size[1]}×{info.in_channels}")
    mean, std = input_norm_values(cfg.input_norm, info)
    state = sim.method.evaluation_state(sim)  # HBN re-syncs its statistics, as the run's evaluations do
    own_acc, own_loss, _ = sim.evaluate_global(state)
    sim.data.test_x = normalize(x, mean, std).to(device=sim.device, dtype=sim.dtype)
    sim.data.test_y = torch.from_numpy(y).to(sim.device)
    sim.data.client_test = [torch.empty(0, dtype=torch.int64, device=sim.device) for _ in sim.data.client_test]
    acc, loss, _ = sim.evaluate_global(state)
    correct = int(round(acc * len(y)))
    low, high = wilson_interval(correct, len(y))
    entry = {"test_file": str(test_file), "sha256": hashlib.sha256(test_file.read_bytes()).hexdigest(),
             "round": int(checkpoint.get("server_round", 0)), "n": len(y), "correct": correct, "accuracy": acc,
             "loss": loss, "interval95": [low, high], "own_test_accuracy": own_acc, "own_test_loss": own_loss}
    if write:
        path = run_dir / EVALUATION_FILE
        try:
            existing = json.loads(path.read_text()) if path.is_file() else {}
        except ValueError:
            existing = {}
        existing[test_file.name] = entry
        tmp = run_dir / f".{EVALUATION_FILE}.tmp"
        tmp.write_text(json.dumps(existing, indent=2) + "\n")
        tmp.replace(path)
    return entry
