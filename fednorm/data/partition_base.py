"""What every partitioner shares: the registry, the argument checks and the sampling helpers.

The partitioners (:mod:`~fednorm.data.partition_label`, :mod:`~fednorm.data.partition_domain`)
register themselves here with :func:`register_partition` and validate their arguments with the
checks below, which raise :class:`~fednorm.errors.PartitionError` naming the argument, the bad
value and what was expected. :mod:`fednorm.data.partition` (dispatch and reports) imports the
partitioners; nothing here imports either, so the import graph stays acyclic.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import PartitionError
from ..registry import Registry

__all__ = ["PARTITIONS", "Partitioner", "register_partition"]

Partitioner = Callable[..., "list[np.ndarray]"]

PARTITIONS: Registry[Partitioner] = Registry("partition")
register_partition = PARTITIONS.register


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def _check_labels(labels: Any, arg: str = "labels") -> np.ndarray:
    """Validate and return ``labels`` as a 1-D int64 array."""
    try:
        arr = np.asarray(labels)
    except Exception as exc:  # e.g. a ragged list or a CUDA tensor
        raise PartitionError(f"{arg} must be a 1-D array of non-negative integers; could not convert it ({exc})") from None
    if arr.ndim != 1:
        raise PartitionError(f"{arg} must be 1-D (one label per sample), got shape {tuple(arr.shape)}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise PartitionError(
            f"{arg} must hold integers, got dtype {arr.dtype}; convert class labels with .astype(np.int64)"
        )
    arr = arr.astype(np.int64, copy=False)
    if arr.size and arr.min() < 0:
        raise PartitionError(f"{arg} must be non-negative class ids, got minimum {int(arr.min())}")
    return arr


def _check_num_clients(num_clients: Any, num_samples: int) -> int:
    if not _is_int(num_clients):
        raise PartitionError(f"num_clients must be an integer, got {num_clients!r} ({type(num_clients).__name__})")
    if num_clients <= 0:
        raise PartitionError(f"num_clients must be > 0, got {num_clients}")
    if num_clients > num_samples:
        raise PartitionError(
            f"num_clients must be <= the number of samples ({num_samples}), got {num_clients}; "
            "every client needs at least one sample to be possible"
        )
    return int(num_clients)


def _check_seed(seed: Any) -> int:
    if not _is_int(seed) or seed < 0:
        raise PartitionError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


# Below this, log(U)/alpha overflows float64 and the Dirichlet draw is meaningless; any alpha
# this small already gives every class (or all data) to one client.
_MIN_ALPHA = 1e-100


def _check_alpha(alpha: Any, arg: str = "alpha") -> float:
    if not _is_real(alpha) or not np.isfinite(alpha) or alpha <= 0:
        raise PartitionError(f"{arg} must be a finite real number > 0 (Dirichlet concentration), got {alpha!r}")
    if alpha < _MIN_ALPHA:
        raise PartitionError(f"{arg}={alpha!r} is too small to sample; use {arg} >= {_MIN_ALPHA:g} (already maximal skew)")
    return float(alpha)


def _check_nonneg_int(value: Any, arg: str) -> int:
    if not _is_int(value) or value < 0:
        raise PartitionError(f"{arg} must be a non-negative integer, got {value!r}")
    return int(value)


def _check_min_size(min_size: Any, num_clients: int, num_samples: int) -> int:
    min_size = _check_nonneg_int(min_size, "min_size")
    if min_size * num_clients > num_samples:
        raise PartitionError(
            f"min_size={min_size} is impossible with num_clients={num_clients}: it needs "
            f"{min_size * num_clients} samples but labels has {num_samples}; lower min_size or num_clients"
        )
    return min_size


# --------------------------------------------------------------------------------------------
# Sampling helpers
# --------------------------------------------------------------------------------------------


def _finish(parts: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Sorted int64 copies of the client index arrays."""
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _class_indices(labels: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Present classes (sorted) and, for each, its sample indices in dataset order."""
    order = np.argsort(labels, kind="stable")
    present, starts = np.unique(labels[order], return_index=True)
    return present, np.split(order, starts[1:])


def _sample_dirichlet(rng: np.random.Generator, alpha: float | np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Rows ~ Dir(alpha·1), computed in log space so that tiny ``alpha`` never underflows.

    ``alpha`` may also be an array of one concentration per column (rows ~ Dir(alpha)), as the
    per-client draw Dir(alpha·p) of :func:`~fednorm.data.partition_label.dirichlet_client` needs.

    A Gamma(alpha) variate is Gamma(alpha + 1)·U^(1/alpha) with U ~ U(0, 1] independent
    (Marsaglia & Tsang 2000, §3), so log G = log Gamma(alpha + 1) + log(U)/alpha is finite for any
    alpha > 0. Normalising with a max-shifted softmax gives an exact Dirichlet draw without the
    all-zero rows (and NaN proportions) that ``rng.dirichlet`` / ``rng.gamma`` produce at
    alpha ≈ 1e-4 in float64.
    """
    log_g = np.log(np.maximum(rng.gamma(alpha + 1.0, size=size), np.finfo(float).tiny))
    log_g += np.log(1.0 - rng.random(size)) / alpha  # 1 - U lies in (0, 1]: log is finite
    log_g -= log_g.max(axis=-1, keepdims=True)
    p = np.exp(log_g)
    return p / p.sum(axis=-1, keepdims=True)


def _apportion(total: int, weights: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
    """Largest-remainder rounding: non-negative ints summing to ``total``, proportional to ``weights``.

    Integer weights are handled in exact integer arithmetic. Ties between equal remainders are
    broken at random with ``rng`` (so no client is favoured systematically), else by index.
    """
    weights = np.asarray(weights)
    if np.issubdtype(weights.dtype, np.integer):
        w = weights.astype(np.int64)
        wsum = int(w.sum())
        base = (w * total) // wsum
        rem = (w * total) % wsum  # exact remainders, comparable as integers
    else:
        quota = weights / weights.sum() * total
        base = np.floor(quota).astype(np.int64)
        rem = quota - base
    short = total - int(base.sum())
    if short > 0:
        if rng is not None:
            order = np.lexsort((rng.random(len(rem)), -rem))  # by remainder, ties at random
        else:
            order = np.argsort(-rem, kind="stable")
        base[order[:short]] += 1
    return base
