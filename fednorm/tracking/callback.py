"""The callback interface of the round loop, in the style of Keras and Lightning callbacks.

:func:`fednorm.api.run` calls every callback's hooks: :meth:`Callback.on_run_start` once the
simulation (and the run directory, if any) exists, :meth:`Callback.on_round_end` after every
round (``record.metrics`` is filled on evaluation rounds, empty otherwise), and
:meth:`Callback.on_run_end` after ``summary.json`` is written, also when the run stopped early
(``summary["status"]`` says how). Only the process that aggregates calls them (rank 0 of a
distributed run). The loggers of :mod:`fednorm.tracking` and the CLI's progress lines are
callbacks; a plain function ``f(record, sim)`` is one too (:func:`as_callback`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

__all__ = ["Callback", "FunctionCallback", "as_callback", "as_callbacks"]


class Callback:
    """Hooks on :func:`fednorm.api.run`'s round loop; every hook does nothing by default.

    ``sim`` is the running :class:`~fednorm.engine.simulator.Simulation` (its ``config``,
    ``global_state``, ``method``, ``history``); ``record`` a ``RoundRecord`` (``server_round``,
    ``train_loss``, ``lr``, ``seconds``, ``metrics``). A callback reads; it must not change them.
    """

    def on_run_start(self, sim: Any, run_dir: Path | None) -> None:
        """Before the first (or, when resuming, the next) round."""

    def on_round_end(self, record: Any, sim: Any) -> None:
        """After every round, once its evaluation (if due) is in ``record.metrics``."""

    def on_run_end(self, sim: Any, summary: dict[str, Any], run_dir: Path | None) -> None:
        """After the run directory's ``summary.json`` is written (every outcome: see ``summary["status"]``)."""

    def __call__(self, record: Any, sim: Any) -> None:  # the older ``on_round(record, sim)`` form
        self.on_round_end(record, sim)


class FunctionCallback(Callback):
    """A plain ``f(record, sim)`` called after every round (``fednorm.api.run(on_round=f)``)."""

    def __init__(self, fn: Callable[[Any, Any], None]) -> None:
        self.fn = fn

    def on_round_end(self, record: Any, sim: Any) -> None:
        self.fn(record, sim)


def as_callback(obj: Callback | Callable[[Any, Any], None]) -> Callback:
    """``obj`` itself if it is a :class:`Callback`, else a :class:`FunctionCallback` around it."""
    return obj if isinstance(obj, Callback) else FunctionCallback(obj)


def as_callbacks(*groups: Iterable[Any] | Callback | Callable[..., None] | None) -> list[Callback]:
    """Flatten callbacks, plain functions, lists of them and ``None`` into one list of callbacks."""
    out: list[Callback] = []
    for group in groups:
        if group is None:
            continue
        if isinstance(group, Callback) or callable(group):
            out.append(as_callback(group))  # type: ignore[arg-type]
        else:
            out.extend(as_callback(g) for g in group)
    return out


def call_all(callbacks: Sequence[Callback], hook: str, *args: Any) -> None:
    """Call ``hook`` on every callback, in order. ``on_round_end`` goes through ``cb(record, sim)``
    (which calls :meth:`Callback.on_round_end`), so a callback written in the older
    ``on_round(record, sim)`` form that overrides ``__call__`` keeps working."""
    for cb in callbacks:
        if hook == "on_round_end":
            cb(*args)
        else:
            getattr(cb, hook)(*args)
