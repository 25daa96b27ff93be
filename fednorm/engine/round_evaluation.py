"""The evaluation phase of a round and the run's summary, for :class:`~fednorm.engine.simulator.Simulation`.

``Simulation.evaluate``, ``evaluate_global`` and ``summary`` call these. They reach the clients
only through ``sim.query_clients`` and the global model only through ``sim.evaluate_global``, so a
runtime that overrides those (:mod:`fednorm.distributed`, :mod:`fednorm.flower`) changes where the
work runs, not what it computes. ``sim`` is a ``Simulation``; it is typed ``Any`` because that
module imports this one.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from .evaluation import evaluate
from .last_rounds import last10_fields
from .personalized_eval import whole_test_scores
from .validation import selection_fields, validation_record

__all__ = ["evaluate_simulation", "evaluate_global_model", "domain_record", "test_domain_accuracies", "simulation_summary", "CLIENT_WEIGHTING"]

#: How the summary's accuracies weigh clients (``summary.json["client_weighting"]``).
CLIENT_WEIGHTING = ("mean_client_accuracy: unweighted mean over the clients with test data, each counting once whatever "
                    "its test size (as FedBN reports it); test_accuracy: pooled, each test sample counting once")


def evaluate_simulation(sim: Any, state: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """:meth:`Simulation.evaluate <fednorm.engine.simulator.Simulation.evaluate>`: the global
    model's test accuracy and loss (per client's own model for a personalized method) and each
    client's accuracy on its own test split.

    ``mean_client_accuracy`` is the unweighted mean of those accuracies over the clients with
    test data: each client counts once whatever its test size (a client with one test sample
    weighs as much as one with a thousand), as FedBN reports its per-client mean; the pooled
    ``test_accuracy`` counts each test sample once. :data:`CLIENT_WEIGHTING` says so in the summary.

    With ``personalized_test: whole`` a personalized method's ``test_accuracy`` and ``test_loss``
    are instead each client's model on the whole test set, averaged over the clients (FedTAN's
    Table 1; :mod:`~fednorm.engine.personalized_eval`), and ``client_accuracies_whole_test`` holds
    the per-client scores; ``client_accuracies`` and ``mean_client_accuracy`` stay the own splits'.

    With a validation split (``validation_fraction``) the same models also score it:
    ``val_accuracy``, ``val_loss`` and ``client_val_accuracies`` (:mod:`~fednorm.engine.validation`)."""
    data = sim.data
    start = time.perf_counter()
    if state is None:
        state = sim.method.evaluation_state(sim)
    client_acc: list[float | None]
    whole: dict[str, Any] | None = None
    if sim.method.personalized:
        with_test = [cid for cid in range(data.num_clients) if len(data.client_test[cid])]
        answers = sim.query_clients(with_test, "evaluate", state)
        client_acc = [None] * data.num_clients
        correct = total = 0.0
        loss_sum = 0.0
        for cid in with_test:  # in client order, so the sums do not depend on where clients ran
            a = answers[cid]
            client_acc[cid] = float(a["correct"]) / float(a["num"])
            correct += float(a["correct"])
            total += float(a["num"])
            loss_sum += float(a["loss_sum"])
        test_acc = correct / total if total else math.nan
        test_loss = loss_sum / total if total else math.nan
        if getattr(sim.config, "personalized_test", "own") == "whole":
            whole = whole_test_scores(sim, state)
            test_acc, test_loss = whole["test_accuracy"], whole["test_loss"]
    else:
        test_acc, test_loss, client_acc = sim.evaluate_global(state)
    valid = [a for a in client_acc if a is not None]
    share = {} if sim.method.personalized else {"top_class_share": getattr(sim, "top_class_share", None)}
    validation = validation_record(sim, state)  # empty without validation_fraction (fednorm.engine.validation)
    elapsed = time.perf_counter() - start
    sim.wall_seconds += elapsed
    sim.eval_seconds += elapsed
    return {
        "test_accuracy": test_acc,
        "test_loss": test_loss,
        "mean_client_accuracy": float(np.mean(valid)) if valid else math.nan,
        "client_accuracies": client_acc,
        **share,
        **({"client_accuracies_whole_test": whole["client_accuracies_whole_test"]} if whole else {}),
        **domain_record(sim.data, client_acc, None if sim.method.personalized else getattr(sim, "test_domain_accuracies", None)),
        **validation,
    }


def test_domain_accuracies(data: Any, correct: torch.Tensor) -> dict[str, float] | None:
    """One model's accuracy on each source's test samples, from its per-sample ``correct``, for
    clients that do not hold one source each (e.g. FedBN's centralized run pooling every source,
    ``partition_args: {pooled: true}``); ``None`` when the clients hold one source each (their
    own test splits give the per-domain accuracies) or the test set has no sources."""
    dom = getattr(data, "test_domain", None)
    if data.client_domain is not None or data.domain_names is None or dom is None or len(dom) != len(correct):
        return None
    dom = dom.to(correct.device)
    return {data.domain_names[d]: float(correct[dom == d].double().mean()) for d in torch.unique(dom).tolist()}


def domain_record(data: Any, client_acc: list[float | None], pooled: dict[str, float] | None = None) -> dict[str, Any]:
    """Feature shift: each domain's accuracy (fednorm/domain_results.py): with one source per
    client the mean of its clients' accuracies, else ``pooled``, one model's accuracy on each
    source's test samples (:func:`test_domain_accuracies`)."""
    if pooled is not None:
        return {"domain_accuracies": dict(pooled)}
    if data.client_domain is None or data.domain_names is None:
        return {}
    from ..domain_results import domain_accuracies

    return {"domain_accuracies": domain_accuracies([data.domain_names[d] for d in data.client_domain], client_acc)}


def evaluate_global_model(sim: Any, state: dict[str, torch.Tensor]) -> tuple[float, float, list[float | None]]:
    """:meth:`Simulation.evaluate_global <fednorm.engine.simulator.Simulation.evaluate_global>`:
    the global model on the whole test set, and each client's accuracy from the same predictions."""
    data = sim.data
    cfg = sim.config
    model = sim.global_model(state)
    start = time.perf_counter()
    res = evaluate(model, data.test_x, data.test_y, batch_size=cfg.eval_batch_size,
                   channels_last=sim.spec.channels_last, forward=sim._compiled_forward(), pad_last=cfg.eval_compile,
                   autocast=torch.bfloat16 if cfg.eval_autocast == "bfloat16" else None)
    if cfg.eval_compile and sim.eval_compile_seconds is None:
        sim.eval_compile_seconds = time.perf_counter() - start  # the first compiled evaluation: compiles
    client_acc = [float(res.correct[ix].double().mean()) if len(ix) else None for ix in data.client_test]
    sim.top_class_share = res.top_class_share
    sim.test_domain_accuracies = test_domain_accuracies(data, res.correct)
    return res.accuracy, res.loss, client_acc


def _fednorm_version() -> str:
    from ..version import __version__  # not the package's __init__, which imports this module

    return __version__


def simulation_summary(sim: Any) -> dict[str, Any]:
    """:meth:`Simulation.summary <fednorm.engine.simulator.Simulation.summary>`: what ``summary.json`` holds."""
    accs = [h["test_accuracy"] for h in sim.history]
    last = sim.history[-1] if sim.history else {}
    best_i = int(np.nanargmax(accs)) if accs and not all(math.isnan(a) for a in accs) else None
    cfg = sim.config
    return {
        "method": cfg.method,
        "norm": cfg.norm,
        "model": cfg.model,
        "dataset": cfg.dataset,
        "partition": cfg.partition,
        "num_clients": cfg.num_clients,
        "clients_per_round": cfg.sampled_per_round,
        "seed": cfg.seed,
        "rounds": sim.server_round,
        "final_test_accuracy": last.get("test_accuracy"),
        "final_test_loss": last.get("test_loss"),
        "best_test_accuracy": accs[best_i] if best_i is not None else None,
        "best_round": sim.history[best_i]["round"] if best_i is not None else None,
        # the mean over rounds R-9..R, None unless each was evaluated, and the rounds it covers (issue 50)
        **last10_fields(sim.history, sim.server_round),
        # validation_fraction > 0: the round of the best mean validation accuracy and the test figures there
        **selection_fields(sim.history, bool(sim.method.personalized)),
        "final_mean_client_accuracy": last.get("mean_client_accuracy"),
        "client_weighting": CLIENT_WEIGHTING,
        "final_client_accuracies": last.get("client_accuracies"),
        "final_domain_accuracies": last.get("domain_accuracies"),
        "client_sources": (  # feature shift: the data source of each client
            [sim.data.domain_names[d] for d in sim.data.client_domain]
            if sim.data.client_domain is not None and sim.data.domain_names is not None else None
        ),
        "wall_seconds": sim.wall_seconds,
        "samples_trained": sim.samples_trained,
        "samples_per_second": sim.samples_trained / sim.wall_seconds if sim.wall_seconds else None,
        "eval_seconds": sim.eval_seconds,
        "eval_fraction": sim.eval_seconds / sim.wall_seconds if sim.wall_seconds else None,
        "uplink_bytes": sim.uplink_bytes,
        "downlink_bytes": sim.downlink_bytes,
        "downlink_bytes_broadcast": sim.downlink_bytes_broadcast,
        "comm_rounds": sim.comm_rounds,
        "executor": sim.executor.name,
        "executor_note": sim.executor_note,
        "eval_compile_seconds": sim.eval_compile_seconds,
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "fednorm_version": _fednorm_version(),
        "code": list(sim.code),  # the commit of each start and resume, from the round it trained on
        "personalized": bool(sim.method.personalized),  # evaluated per client (FedBN): not one global model
        "method_summary": sim.method.summary(),
        "method_report": sim.method.report(sim),
        "dropped_clients": dict(sim.dropped),
    }
