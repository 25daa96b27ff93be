"""Per-domain accuracy of a feature-shift run, as the FedBN paper reports it (one column per domain).

When every client holds one data source (the ``domains`` partition), a domain's accuracy is the
mean of its clients' accuracies on their own test splits, the same figure that
:func:`fednorm.seeds.summarize_seeds` aggregates over seeds. A run records it per evaluation
(``metrics.jsonl``: ``domain_accuracies``) and at the end (``summary.json``:
``final_domain_accuracies``); ``fednorm run`` prints it and ``fednorm compare`` adds one column
per domain to its table and CSV.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence

__all__ = ["domain_accuracies", "format_domain_accuracies", "domain_columns", "domain_names_of"]


def domain_accuracies(sources: Sequence[str] | None, client_accuracies: Sequence[float | None] | None) -> dict[str, float] | None:
    """``{domain: mean accuracy of its clients}`` in first-client order, or None without sources."""
    if not sources or not client_accuracies:
        return None
    groups: dict[str, list[float]] = {}
    for src, acc in zip(sources, client_accuracies):
        groups.setdefault(src, [])
        if acc is not None:
            groups[src].append(float(acc))
    return {src: statistics.fmean(v) if v else float("nan") for src, v in groups.items()}


def format_domain_accuracies(accs: Mapping[str, float] | None) -> str:
    """``"per domain: mnist 91.20%, usps 88.00%"`` (empty without domains)."""
    if not accs:
        return ""
    return "per domain: " + ", ".join(f"{d} {100 * a:.2f}%" for d, a in accs.items())


def domain_names_of(summaries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The domains of several runs' summaries, in first-seen order."""
    names: list[str] = []
    for s in summaries:
        for d in s.get("final_domain_accuracies") or {}:
            if d not in names:
                names.append(d)
    return names


def domain_columns(summary: Mapping[str, Any], names: Sequence[str]) -> dict[str, float | None]:
    """``{"acc[<domain>]": value}`` for a table row (None where the run lacks the domain)."""
    accs = summary.get("final_domain_accuracies") or {}
    return {f"acc[{d}]": accs.get(d) for d in names}
