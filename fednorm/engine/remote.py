"""Helpers for runtimes whose clients live elsewhere (torch.distributed ranks, Flower nodes)."""

from __future__ import annotations

import torch

from .. import errors
from ..methods.base import ClientUpdates, stack_rows

__all__ = ["merge_updates", "host_of", "describe_error", "rebuild_error"]

# Errors a remote client or server step may raise that the whole run must raise the same way.
_RAISED_AS_IS = (errors.FednormError, errors.DivergenceError, errors.RoundFailedError, errors.DatasetError)


def describe_error(exc: BaseException) -> tuple[str, str]:
    """An exception as (class name, message), to send to the other processes."""
    name = type(exc).__name__
    return (name, str(exc)) if isinstance(exc, _RAISED_AS_IS) else (name, f"{name}: {exc}")


def rebuild_error(name: str, message: str) -> BaseException:
    """The exception :func:`describe_error` described: fednorm's own class, else a RuntimeError."""
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, _RAISED_AS_IS):
        return cls(message)
    return RuntimeError(message)


def host_of(client_id: int, num_hosts: int) -> int:
    """The host (rank, Flower node partition) of a client: round robin, so every host gets a
    share of each round's sample."""
    return client_id % num_hosts


def merge_updates(parts: list[ClientUpdates | None], order: list[int]) -> ClientUpdates | None:
    """One :class:`ClientUpdates` from the parts that hosts sent back, rows in ``order`` (the
    round's sampled clients), so the server's aggregation sees the in-process row order."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    failures: dict[int, str] = {}
    rows: dict[int, tuple[ClientUpdates, int]] = {}
    for p in present:
        failures.update(p.failures)
        for i, cid in enumerate(p.client_ids):
            rows[cid] = (p, i)
    ids = [c for c in order if c in rows]
    if not ids:
        empty = present[0].subset([])
        empty.failures = failures
        return empty

    def stack(get) -> torch.Tensor:
        return torch.stack([get(rows[c][0])[rows[c][1]] for c in ids])

    first = present[0]
    timed = all(p.seconds is not None for p in present)
    return ClientUpdates(
        client_ids=ids,
        states={k: stack(lambda p, k=k: p.states[k]) for k in first.states},
        num_examples=stack(lambda p: p.num_examples),
        train_loss=stack(lambda p: p.train_loss),
        num_steps=stack(lambda p: p.num_steps),
        extras={k: stack_rows([rows[c][0].extras[k][rows[c][1]] for c in ids]) for k in first.extras},
        failures=failures,
        seconds=stack(lambda p: p.seconds) if timed else None,
    )
