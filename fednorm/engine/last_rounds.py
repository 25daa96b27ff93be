"""What "last-10" means everywhere in fednorm: the mean test accuracy over the last 10 *rounds*.

For an R-round run it is the mean over rounds R−9 to R (rounds 1 to R when R < 10), and it is
``None`` (shown as n/a) unless the run evaluated every one of those rounds: the same span of
training in every table, whatever the evaluation cadence. The mean of the last 10 *evaluations*,
which ``summary.json`` held before (issue 50), spans rounds 5 to 15 of a 15-round run evaluated
every 5 rounds, or 1,000 rounds of a run evaluated every 100; it is gone.

``summary.json`` records the figure as ``last10_mean_test_accuracy`` with the rounds it covers,
``last10_rounds: [R−9, R]``. A ``summary.json`` written before (no ``last10_rounds``) is read with
its figure recomputed from the run's evaluations (:func:`upgrade_summary`), so an old run and a
new one mean the same thing in a table. Pure Python: the report and the seeds tables read it
without torch.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["LAST_ROUNDS", "last_rounds_mean", "last10_fields", "upgrade_summary", "last10_note"]

LAST_ROUNDS = 10


def last_rounds_mean(curve: Iterable[tuple[int, float]], final_round: int, n: int = LAST_ROUNDS) -> float | None:
    """The mean of ``curve``'s values (``(round, value)`` pairs) over rounds ``final_round − n + 1``
    to ``final_round``, or None unless every one of them is in ``curve`` with a value."""
    rounds = range(max(1, int(final_round) - n + 1), int(final_round) + 1)
    at = {int(r): v for r, v in curve}
    values = [at.get(r) for r in rounds]
    if not rounds or any(v is None for v in values):
        return None
    return math.fsum(values) / len(values)  # type: ignore[arg-type]


def last10_fields(history: Sequence[Mapping[str, Any]], rounds: int, metric: str = "test_accuracy") -> dict[str, Any]:
    """``summary.json``'s ``last10_mean_test_accuracy`` (None unless each of the last 10 rounds
    was evaluated) and ``last10_rounds`` (the first and last round it covers; None before round 1)."""
    curve = [(h["round"], h.get(metric)) for h in history if "round" in h]
    return {"last10_mean_test_accuracy": last_rounds_mean(curve, rounds) if rounds >= 1 else None,
            "last10_rounds": [max(1, rounds - LAST_ROUNDS + 1), rounds] if rounds >= 1 else None}


def upgrade_summary(summary: dict[str, Any], history: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    """``summary`` as this version writes it: a summary written before ``last10_rounds`` existed
    held the mean of the last 10 evaluations; it is recomputed from ``history`` (the run's
    ``metrics.jsonl``), or set to None without one. ``summary`` is changed in place and returned."""
    if not isinstance(summary, dict) or "last10_rounds" in summary or "last10_mean_test_accuracy" not in summary:
        return summary
    rounds = summary.get("rounds")
    if history is None or not isinstance(rounds, int):
        summary["last10_mean_test_accuracy"] = None
        return summary
    summary.update(last10_fields(history, rounds))
    return summary


def last10_note(rows: Iterable[tuple[Mapping[str, Any], Mapping[str, Any] | None]]) -> str:
    """A line under a table whose last-10 column has an n/a: which rounds were not all evaluated
    and the option that evaluates them. ``rows``: ``(summary, config)`` per run."""
    for summary, config in rows:
        if summary.get("last10_mean_test_accuracy") is None and summary.get("last10_rounds"):
            first, last = summary["last10_rounds"]
            every = (config or {}).get("eval_every")
            how = f" (evaluated every {every} rounds)" if isinstance(every, int) and every > 1 else ""
            return (f"last-10 rounds: the mean test accuracy over the last 10 rounds; n/a where rounds {first}-{last} were "
                    f"not all evaluated{how}: pass --eval-last-rounds 10 to evaluate them.")
    return ""
