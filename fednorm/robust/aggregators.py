"""Robust aggregators: reduce the rows of a ``[K, D]`` matrix (one row per client) to ``[D]``.

Used for model updates (FedAvg and every method built on it) and for BN statistics (robust
FBN, Guerraoui et al., 2024, Sec. 5). Definitions follow Yin et al. 2018 (arXiv:1803.01498) for the
coordinate-wise median and trimmed mean and Allouah et al. 2023 (arXiv:2302.01772) for
Nearest-Neighbour Mixing, with ByzFL's conventions:

* ``mean``: the (weighted) mean; the plain FedAvg rule.
* ``median``: coordinate-wise median; with an even K the mean of the two middle values
  (numpy's semantics; ``torch.median`` would return the lower one).
* ``trimmed_mean``: per coordinate, drop the f largest and f smallest values and average the
  remaining K − 2f.
* ``nnm`` (pre-aggregation): replace each row by the mean of its K − f nearest rows in
  Euclidean distance, itself included; then apply one of the above.

Robust rules ignore client weights (the paper's clients hold equal data); ``mean`` uses them.
All arithmetic is float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import ConfigError
from ..registry import Registry

__all__ = ["AGGREGATORS", "register_aggregator", "mean", "median", "trimmed_mean", "nnm", "Aggregator", "get_aggregator"]

AggregatorFn = Callable[..., torch.Tensor]
AGGREGATORS: Registry[AggregatorFn] = Registry("aggregator")
register_aggregator = AGGREGATORS.register


@register_aggregator("mean")
def mean(rows: torch.Tensor, *, weights: torch.Tensor | None = None, f: int = 0) -> torch.Tensor:
    """Weighted mean over rows (uniform without ``weights``); ``f`` is ignored."""
    rows = rows.double()
    if weights is None:
        return rows.mean(0)
    w = weights.double().reshape(-1, *([1] * (rows.dim() - 1)))
    return (w * rows).sum(0) / w.sum()


@register_aggregator("median")
def median(rows: torch.Tensor, *, weights: torch.Tensor | None = None, f: int = 0) -> torch.Tensor:
    """Coordinate-wise median; even K gives the mean of the two middle values (numpy's)."""
    rows = rows.double()
    k = rows.shape[0]
    s = rows.sort(dim=0).values
    if k % 2:
        return s[k // 2]
    return 0.5 * (s[k // 2 - 1] + s[k // 2])


@register_aggregator("trimmed_mean")
def trimmed_mean(rows: torch.Tensor, *, weights: torch.Tensor | None = None, f: int = 0) -> torch.Tensor:
    """Coordinate-wise trimmed mean: drop the f largest and f smallest values per coordinate.

    With fewer than 2f + 1 rows (e.g. clients dropped this round) it trims ``(K − 1) // 2`` from
    each side, which keeps at least one value (the median for odd K).
    """
    rows = rows.double()
    k = rows.shape[0]
    t = min(int(f), (k - 1) // 2)
    s = rows.sort(dim=0).values
    return s[t : k - t].mean(0)


def nnm(rows: torch.Tensor, f: int) -> torch.Tensor:
    """Nearest-Neighbour Mixing: each row becomes the mean of its K − f nearest rows (itself included).

    Distances are Euclidean over the whole row, so a client's statistics or update are compared
    as one vector (fednorm's reading of robust FBN, whose paper does not say). Ties are broken by
    row order (stable sort), so the result
    is deterministic; rows at equal distance are interchangeable only when they are equal.
    """
    rows = rows.double()
    k = rows.shape[0]
    m = max(k - int(f), 1)
    flat = rows.reshape(k, -1)
    dist = torch.cdist(flat, flat)
    dist.fill_diagonal_(-1.0)  # a row is always its own nearest neighbour
    nearest = dist.argsort(dim=1, stable=True)[:, :m]
    return flat[nearest].mean(1).reshape(rows.shape)


@dataclass(frozen=True)
class Aggregator:
    """A configured aggregation rule: ``rule`` after optional NNM, with the Byzantine bound ``f``.

    ``Aggregator()`` is the plain (weighted) mean, the FedAvg rule; :attr:`is_mean` says so, and
    methods then take their exact, non-robust path.

    Args:
        rule: a name in :data:`AGGREGATORS` (``mean``, ``median``, ``trimmed_mean``).
        f: the number of Byzantine clients the rule must tolerate (trimmed mean, NNM).
        nnm: apply Nearest-Neighbour Mixing first (the paper's "pre-processed with a layer of NNM").
    """

    rule: str = "mean"
    f: int = 0
    nnm: bool = False

    def __post_init__(self) -> None:
        try:
            AGGREGATORS.get_builder(self.rule)
        except ValueError as exc:
            raise ConfigError(f"aggregator: {exc}") from None
        if not isinstance(self.f, int) or self.f < 0:
            raise ConfigError(f"aggregator: f must be a non-negative integer, got {self.f!r}")

    @property
    def is_mean(self) -> bool:
        return AGGREGATORS.get_builder(self.rule) is mean and not self.nnm

    def __call__(self, rows: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        """Aggregate ``rows`` (``[K, *shape]``) into ``[*shape]`` (float64)."""
        if rows.shape[0] == 0:
            raise ValueError("cannot aggregate zero rows")
        if self.nnm:
            rows = nnm(rows, self.f)
        return AGGREGATORS.get_builder(self.rule)(rows, weights=weights if not self.nnm else None, f=self.f)

    def __str__(self) -> str:
        return ("nnm+" if self.nnm else "") + self.rule + (f"(f={self.f})" if self.f and not self.is_mean else "")


def get_aggregator(rule: str = "mean", *, f: int = 0, nnm: bool = False) -> Aggregator:
    """Build an :class:`Aggregator`; raises ConfigError for an unknown rule."""
    return Aggregator(rule, f, nnm)
