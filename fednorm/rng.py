"""Seeded random streams derived from (seed, purpose, round, client).

Every random choice of a run draws from its own stream, so results do not depend on the
order in which clients execute, on the executor, or on whether the run was resumed: the
batches of client 7 in round 12 are the same whatever happened before.

A neutral module, outside :mod:`fednorm.engine`: methods draw from these streams too, and a
method must not import the engine that runs it (the engine imports the methods).
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

__all__ = ["derive_seed", "torch_generator", "numpy_rng"]


def _as_int(key: int | str) -> int:
    if isinstance(key, str):
        return zlib.crc32(key.encode())
    if key < 0:
        raise ValueError(f"seed keys must be non-negative, got {key}")
    return int(key)


def derive_seed(seed: int, *keys: int | str) -> int:
    """A 63-bit seed that depends on ``seed`` and every key (strings name the purpose)."""
    ss = np.random.SeedSequence([_as_int(seed), *(_as_int(k) for k in keys)])
    return int(ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def torch_generator(seed: int, *keys: int | str, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch generator seeded with :func:`derive_seed` ``(seed, *keys)``."""
    g = torch.Generator(device=device)
    g.manual_seed(derive_seed(seed, *keys))
    return g


def numpy_rng(seed: int, *keys: int | str) -> np.random.Generator:
    """A numpy generator seeded with :func:`derive_seed` ``(seed, *keys)``."""
    return np.random.default_rng(derive_seed(seed, *keys))
