"""Best-validation model selection: the validation split scored at every evaluation, and the round it selects.

With ``validation_fraction > 0`` each client holds a validation split carved out of its training
data (:func:`fednorm.data.validation.hold_out_validation`). At every evaluation
:func:`validation_record` scores it as the test splits are scored: a personalized method's clients
(FedBN) each with their own model, through ``sim.query_clients(..., "validate")`` so that a runtime
hosting the clients elsewhere answers where they live; a method with one global model with that
model. ``metrics.jsonl`` then holds ``client_val_accuracies`` and ``val_accuracy``, their unweighted
mean over the clients with validation data, which FedBN's released code selects on
(``np.mean(val_acc_list)`` in ``federated/fed_office.py``; Li et al., ICLR 2021), and ``val_loss`` (per validation sample).

:func:`selection_fields` gives ``summary.json`` the selected round, the first evaluation with the
highest ``val_accuracy`` (the code's strict ``>`` keeps the first), and the test accuracies recorded
there: one round for every client, as FedBN's code reports Table 1. For a personalized method it also
records each client's own selection (the round of its best validation accuracy and its test accuracy
there), which its own model makes possible. Selection is over the evaluated rounds (``eval_every``).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch

from .evaluation import evaluate

__all__ = ["VALIDATION_QUERY", "EVALUATION_QUERIES", "validation_record", "best_index", "client_selection", "selection_fields"]

#: The client query that scores a client's validation split with its model (``Simulation.client_query``).
VALIDATION_QUERY = "validate"
#: Client queries that score a model, not a method's statistics: never privatised, never stacked.
EVALUATION_QUERIES = ("evaluate", VALIDATION_QUERY)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def validation_record(sim: Any, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """This evaluation's validation scores (empty without a validation split): ``val_accuracy``,
    the unweighted mean over the clients with validation samples, ``val_loss``, the mean loss per
    validation sample, and ``client_val_accuracies`` (None for a client without any)."""
    data = sim.data
    if data.client_val is None:
        return {}
    with_val = [cid for cid in range(data.num_clients) if len(data.client_val[cid])]
    accs: list[float | None] = [None] * data.num_clients
    loss_sum = total = 0.0
    if sim.method.personalized:
        answers = sim.query_clients(with_val, VALIDATION_QUERY, state)
        for cid in with_val:  # in client order, so the sums do not depend on where clients ran
            a = answers[cid]
            accs[cid] = float(a["correct"]) / float(a["num"])
            loss_sum += float(a["loss_sum"])
            total += float(a["num"])
    elif with_val:
        ix = torch.cat([data.client_val[cid] for cid in with_val])
        res = evaluate(sim.global_model(state), data.train_x[ix], data.train_y[ix], batch_size=sim.config.eval_batch_size,
                       channels_last=sim.spec.channels_last)
        start = 0
        for cid in with_val:  # slices of the one pass's predictions, as the test splits' accuracies are
            n = len(data.client_val[cid])
            accs[cid] = float(res.correct[start:start + n].double().mean())
            start += n
        loss_sum, total = res.loss * res.num_samples, float(res.num_samples)
    valid = [a for a in accs if a is not None]
    return {
        "val_accuracy": sum(valid) / len(valid) if valid else math.nan,
        "val_loss": loss_sum / total if total else math.nan,
        "client_val_accuracies": accs,
    }


def best_index(values: Sequence[Any]) -> int | None:
    """The index of the first largest finite value (None when there is none)."""
    best = None
    for i, v in enumerate(values):
        if _finite(v) and (best is None or v > values[best]):
            best = i
    return best


def client_selection(history: Sequence[Mapping[str, Any]]) -> list[tuple[int | None, float | None]]:
    """Each client's own selection: ``(round, test accuracy)`` at the evaluation with its highest
    validation accuracy (the first of equal ones), ``(None, None)`` for a client never validated.
    FedBN's SingleSet baseline selects so: each domain is trained, validated and tested alone."""
    num_clients = max((len(h.get("client_val_accuracies") or []) for h in history), default=0)
    out: list[tuple[int | None, float | None]] = []
    for cid in range(num_clients):
        own = [(h.get("client_val_accuracies") or [None] * num_clients)[cid] for h in history]
        j = best_index(own)
        out.append((None, None) if j is None else
                   (history[j].get("round"), (history[j].get("client_accuracies") or [None] * num_clients)[cid]))
    return out


def selection_fields(history: Sequence[Mapping[str, Any]], personalized: bool) -> dict[str, Any]:
    """``summary.json``'s best-validation fields from a run's evaluations (empty when the run
    recorded no validation accuracy).

    ``best_val_round``: the evaluated round with the highest ``val_accuracy`` (the first of equal
    ones); ``best_val_accuracy`` that accuracy; ``best_val_test_accuracy``,
    ``best_val_mean_client_accuracy``, ``best_val_client_accuracies`` and
    ``best_val_domain_accuracies``: the test figures recorded at that round. A personalized
    method also gets ``client_best_val_rounds`` (each client's own best validation round),
    ``client_best_val_test_accuracies`` (its test accuracy there) and their unweighted mean
    ``client_best_val_mean_accuracy``."""
    if not any("val_accuracy" in h for h in history):
        return {}
    i = best_index([h.get("val_accuracy") for h in history])
    chosen = history[i] if i is not None else {}
    out: dict[str, Any] = {
        "best_val_round": chosen.get("round"),
        "best_val_accuracy": chosen.get("val_accuracy"),
        "best_val_test_accuracy": chosen.get("test_accuracy"),
        "best_val_mean_client_accuracy": chosen.get("mean_client_accuracy"),
        "best_val_client_accuracies": chosen.get("client_accuracies"),
        "best_val_domain_accuracies": chosen.get("domain_accuracies"),
    }
    if personalized:
        chosen_per_client = client_selection(history)
        rounds = [r for r, _ in chosen_per_client]
        tests = [t for _, t in chosen_per_client]
        scored = [t for t in tests if _finite(t)]
        out.update(client_best_val_rounds=rounds, client_best_val_test_accuracies=tests,
                   client_best_val_mean_accuracy=sum(scored) / len(scored) if scored else None)
    return out
