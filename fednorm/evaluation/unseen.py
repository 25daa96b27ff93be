"""A finished run scored on a client that never trained, holding another dataset (FedBN App. G, Table 17).

FedBN's Appendix G trains on the digits task, then treats Morpho-global and Morpho-local
(Morpho-MNIST, :mod:`fednorm.data.morpho_mnist`) as two *new* clients: each uses the clients'
averaged trainable BN parameters and computes the BN (mean, variance) on its own data
(:func:`fednorm.engine.adapt.adapted_model`, the recipe ``fednorm adapt`` runs on a domain of the
run's own dataset). Here the new client's data is any registered dataset: its images are fitted
to the run's input (size and channels, as the run's dataset fitted its domains: Digits-5 makes
every domain 28×28×3 with grey replicated) and normalised as the run's inputs were; the BN
statistics come from ``num_samples`` of its training images (a draw seeded by the run's seed) and
the accuracy from all of its test images. The classes must be the run's (digits 0-9 for both).

Results go to ``RUN/unseen.json``, one entry per name, so a table's ``unseen:<name>`` column
(:mod:`fednorm.reproduce.suite`) reads them like ``evaluation.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..engine.adapt import AdaptResult, adapted_model
from ..engine.runlock import holding_run_lock
from ..errors import ConfigError

__all__ = ["adapt_run_to_dataset", "read_unseen", "UNSEEN_FILE"]

UNSEEN_FILE = "unseen.json"


def _inputs(ds: Any, info: Any, mean: Any, std: Any) -> Any:
    from ..data.readers import fit_images
    from ..data.transforms import normalize

    return normalize(fit_images(ds.data, tuple(info.image_size), info.in_channels), mean, std)


@holding_run_lock("adapt", "it is still training: score it once that run has finished", unless="write")
def adapt_run_to_dataset(run_dir: str | Path, dataset: str, *, dataset_args: Mapping[str, Any] | None = None,
                         name: str | None = None, num_samples: int | None = None, data_dir: str | None = None,
                         batch_size: int = 1024, write: bool = True) -> AdaptResult:
    """Score ``run_dir``'s latest checkpoint on ``dataset`` as a new client (module docstring).

    Args:
        run_dir: a finished run directory.
        dataset: a registered dataset name (``morpho_mnist``); ``dataset_args`` its options
            (``{variant: global}``).
        name: the entry's key in ``unseen.json`` (default: ``dataset``).
        num_samples: training images the statistics are computed on (a seeded draw; default all).
        data_dir: where the dataset is (default: the run's data folder).
        batch_size: batch size of the statistics and evaluation passes.
        write: record the result in ``RUN/unseen.json``.

    Returns:
        :class:`~fednorm.engine.adapt.AdaptResult` with ``source`` ``dataset:<name>``.

    Raises:
        ConfigError: a dataset with other classes than the run's, or too few samples.
        DatasetError: the dataset's files are not found.
    """
    from ..data.datasets import load_dataset
    from ..data.federated import input_norm_values
    from ..engine.reload import simulation_from_run

    run_dir = Path(run_dir)
    sim, checkpoint = simulation_from_run(run_dir, data_dir=data_dir, what="adapt")
    cfg, info = sim.config, sim.data.info
    args = dict(dataset_args or {})
    folder = data_dir if data_dir is not None else cfg.data_dir
    train = load_dataset(dataset, folder, train=True, **args)
    test = load_dataset(dataset, folder, train=False, **args)
    if train.info.num_classes != info.num_classes:
        raise ConfigError(f"dataset '{dataset}' has {train.info.num_classes} classes and the run in {run_dir} "
                          f"{info.num_classes}: a new client must share the run's classes")
    index = np.arange(len(train.targets))
    if num_samples is not None and num_samples < len(index):
        index = np.sort(np.random.default_rng(cfg.seed).choice(len(index), size=num_samples, replace=False))
    train.data = train.data[index]
    mean, std = input_norm_values(cfg.input_norm, info)
    x, xt = _inputs(train, info, mean, std), _inputs(test, info, mean, std)
    import torch

    yt = torch.from_numpy(np.asarray(test.targets, dtype=np.int64))
    model, before, after, stats = adapted_model(sim, x, xt, yt, batch_size=batch_size)
    key = name or dataset
    result = AdaptResult(
        accuracy=after, accuracy_averaged_stats=before, num_stat_samples=len(x), num_test=len(xt),
        source=f"dataset:{key}", method=cfg.method, statistics=stats,
        state={k: v.detach().clone() for k, v in model.state_dict().items()},
    )
    if write:
        entry = {**result.summary(), "round": int(checkpoint.get("server_round", sim.server_round)), "dataset": dataset,
                 "dataset_args": args, "num_samples": num_samples}
        path = run_dir / UNSEEN_FILE
        existing = read_unseen(run_dir)
        existing[key] = entry
        tmp = run_dir / f".{UNSEEN_FILE}.tmp"
        tmp.write_text(json.dumps(existing, indent=2) + "\n")
        tmp.replace(path)
    return result


def read_unseen(run_dir: str | Path) -> dict[str, Any]:
    """``RUN/unseen.json`` as a mapping (empty when absent or unreadable)."""
    path = Path(run_dir) / UNSEEN_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
