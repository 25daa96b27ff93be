"""Each client's training samples, gathered only when a method asks for them.

The vectorized executor hands a chunk's methods every client's samples
(:attr:`~fednorm.methods.base.StackedClientContext.x`). Copying them all each round cost 41% of
a CIFAR-10 round at B = 4 (586 MiB copied to train 800 images) and made a 10-client run need more
memory than a 1,000-client one; most methods never read them. :class:`ClientRows` is the same
sequence, gathered per client on first access and kept for the round; :class:`LazyClientContext`
does the same for the sequential executor's one client.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence, overload

import torch

from ..methods.base import ClientContext

__all__ = ["ClientRows", "LazyClientContext"]


class ClientRows(Sequence[torch.Tensor]):
    """``[source.index_select(0, ix) for ix in indices]``, each element computed when first read."""

    def __init__(self, source: torch.Tensor, indices: Sequence[torch.Tensor]) -> None:
        self._source = source
        self._indices = list(indices)
        self._cache: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self._indices)

    @overload
    def __getitem__(self, i: int) -> torch.Tensor: ...

    @overload
    def __getitem__(self, i: slice) -> list[torch.Tensor]: ...

    def __getitem__(self, i: int | slice) -> torch.Tensor | list[torch.Tensor]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"client position {i} out of range for {len(self)} clients")
        if i not in self._cache:
            self._cache[i] = self._source.index_select(0, self._indices[i])
        return self._cache[i]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (self[i] for i in range(len(self)))


class LazyClientContext(ClientContext):
    """A :class:`~fednorm.methods.base.ClientContext` whose ``x`` and ``y`` are gathered from the
    dataset the first time a method reads them (the sequential executor trains from the dataset
    itself, so a method that never reads them copies nothing)."""

    def __init__(self, source_x: torch.Tensor, source_y: torch.Tensor, rows: torch.Tensor, **kwargs: Any) -> None:
        self._source = (source_x, source_y)
        self._rows = rows
        self._xy: list[torch.Tensor | None] = [None, None]
        super().__init__(x=None, y=None, **kwargs)  # type: ignore[arg-type]

    def _get(self, i: int) -> torch.Tensor:
        if self._xy[i] is None:
            self._xy[i] = self._source[i].index_select(0, self._rows)
        return self._xy[i]  # type: ignore[return-value]

    def _set(self, i: int, value: torch.Tensor | None) -> None:
        if value is not None:
            self._xy[i] = value

    x = property(lambda self: self._get(0), lambda self, v: self._set(0, v))  # type: ignore[assignment]
    y = property(lambda self: self._get(1), lambda self, v: self._set(1, v))  # type: ignore[assignment]

    @property
    def num_examples(self) -> int:
        return len(self._rows)
