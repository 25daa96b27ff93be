"""``fednorm diagnose RUN_DIR``: is a run's accuracy lost in its weights or in its statistics?

A normalisation layer evaluates with statistics that the federation estimated (averaged running
buffers, HBN's pooled client statistics, FBN's corrected ones). This rebuilds a run from its
``config.yaml`` and latest checkpoint and evaluates the *same weights* with each statistics the run
could have used:

* ``as_evaluated``: what the run's evaluations used (``Method.evaluation_state``): the global
  buffers for FedAvg and most methods; for HBN the statistics of the last round's clients
  recomputed under the final weights, the paper's protocol;
* ``deployed``: the state a method deploys after training, where it has one (HBN's round T+1);
* ``global_buffers``: the global model's statistics buffers as stored;
* ``exact``: the exact statistics of the union of the clients' training data (one pass, earlier
  layers normalised with the union's): what BatchNorm trained centrally would hold, and an upper
  reference that needs no further training.

For a method that re-estimates its statistics from a sample of clients (HBN), ``--resample K``
repeats that protocol with K other seeded samples of the same size: the spread of those accuracies
is how much an evaluation depends on which clients answered. The per-layer statistics mismatch and
HBN's learnt batch weights are the per-round diagnostics' figures (:mod:`fednorm.diagnostics.runner`)
at the checkpoint's round. Personalized methods (FedBN, SiloBN) have no global statistics: only their
accuracy and the spread of their local statistics are reported.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..engine.runlock import holding_run_lock
from ..errors import ConfigError
from ..rng import numpy_rng
from .runner import Diagnostics
from .statistics import norm_layers

__all__ = ["diagnose_run", "format_diagnosis", "DIAGNOSIS_FILE"]

#: Written into the run directory.
DIAGNOSIS_FILE = "diagnosis.json"


def _load(run_dir: Path, data_dir: str | None, device: str | None, model: Any = None, data: Any = None) -> Any:
    from ..engine.reload import simulation_from_run

    return simulation_from_run(run_dir, model=model, data=data, data_dir=data_dir, device=device, what="diagnose")[0]


def _resampled(sim: Any, k: int) -> dict[str, Any] | None:
    """The method's re-sync protocol (``synced_state``) with ``k`` seeded client samples of the
    round's size; ``None`` for methods without one."""
    method = sim.method
    if k <= 0 or not hasattr(method, "synced_state"):
        return None
    n, m = sim.config.num_clients, min(sim.config.sampled_per_round, sim.config.num_clients)
    values = []
    for i in range(k):
        clients = sorted(int(c) for c in numpy_rng(sim.config.seed, "diagnose-resample", i).choice(n, size=m, replace=False))
        values.append(sim.evaluate_global(method.synced_state(sim, clients))[0])
    arr = np.asarray(values)
    return {"samples": k, "clients_per_sample": m, "accuracies": values, "mean": float(arr.mean()),
            "std": float(arr.std(ddof=1)) if k > 1 else 0.0, "min": float(arr.min()), "max": float(arr.max())}


def _subsample(sim: Any, max_samples: int | None) -> tuple[list[Any], int, int]:
    """Each client's training inputs, or a seeded share of each (proportional to its size, at
    least one from a non-empty client) when the union holds more than ``max_samples``."""
    import torch

    data = sim.data
    sizes = [len(ix) for ix in data.client_train]
    total = sum(sizes)
    if max_samples is None or max_samples >= total:
        return [data.train_x[ix] for ix in data.client_train], total, total
    keep = []
    for cid, ix in enumerate(data.client_train):
        k = min(len(ix), max(1 if len(ix) else 0, round(max_samples * len(ix) / total)))
        order = torch.as_tensor(numpy_rng(sim.config.seed, "diagnose-subsample", cid).permutation(len(ix))[:k],
                                device=ix.device)
        keep.append(data.train_x[ix[order]])
    return keep, sum(len(x) for x in keep), total


def _by_layer(figures: dict[str, float], strip: str = "") -> dict[str, dict[str, float]]:
    """``diag/<group>/<stat>/<layer>`` metrics -> ``{layer: {stat: value}}``."""
    out: dict[str, dict[str, float]] = {}
    for key, value in figures.items():
        _, _, stat, layer = key.split("/", 3)
        out.setdefault(layer, {})[stat.removeprefix(strip)] = value
    return out


@holding_run_lock("diagnose", "it is still training: diagnose it once that run has finished", unless="write")
def diagnose_run(
    run_dir: str | Path,
    *,
    model: Any = None,
    data: Any = None,
    resample: int = 0,
    max_samples: int | None = None,
    data_dir: str | None = None,
    device: str | None = None,
    batch_size: int = 512,
    write: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Evaluate a run's latest weights under each statistics it could use (module docstring).

    Args:
        run_dir: a run directory (``config.yaml`` + a checkpoint).
        model: a run of the user's own ``nn.Module`` (``fednorm.run(model=...)``) takes the same
            module (or factory) back; its weights come from the checkpoint (default: None, a
            registry model built from the config).
        data: a run of the user's own data (``fednorm.run(data=...)``) takes the same
            ``FederatedData`` back, checked against the fingerprint the run recorded (default:
            None, built from the config).
        resample: for methods that re-estimate statistics from sampled clients (HBN), repeat the
            protocol with this many other seeded samples (default: 0, none).
        max_samples: compute the "exact" statistics (and the clients' mismatch) on a seeded share
            of each client's data, this many in all (default: every training sample). The
            statistics pass costs about half a forward pass per normalisation layer over the union.
        data_dir: the dataset folder, if not the one the run recorded.
        device: torch device (default: the run's; the CPU for a GPU run where there is no GPU).
        batch_size: chunk size of the exact statistics pass.
        write: write ``RUN_DIR/diagnosis.json``.
        progress: called with a line on each stage (the CLI prints them).

    Returns:
        ``round``, ``method``, ``norm``, ``accuracy`` (name -> accuracy in [0, 1]), ``resampled``
        (or ``None``), ``layers`` (per normalisation layer: the mismatch figures), ``hbn_batch_weight``
        (per layer: mean and quantiles of ``sigmoid(-alpha)``), ``local_spread`` and ``seconds``.
    """
    start = time.perf_counter()
    say = progress or (lambda line: None)
    run_dir = Path(run_dir)
    say(f"loading {run_dir} (config, data, checkpoint)")
    sim = _load(run_dir, data_dir, device, model, data)
    method = sim.method
    r = sim.server_round
    if r < 1:
        raise ConfigError(f"cannot diagnose {run_dir}: its checkpoint is from before the first round")
    method.configure_round(r, sim.sample_clients(r))  # the last round's clients, as the run evaluated
    diag = Diagnostics(1, batch_size=batch_size)
    say(f"round {r}: evaluating as the run evaluated")
    accuracy: dict[str, float] = {"as_evaluated": float(sim.evaluate()["test_accuracy"])}
    layers: dict[str, dict[str, float]] = {}
    exact_samples = train_samples = None
    if not method.personalized and norm_layers(sim.model):
        deployed = method.final_state(sim)
        if deployed is not None:
            say("evaluating the deployed state")
            accuracy["deployed"] = float(sim.evaluate_global(deployed)[0])
        client_x, exact_samples, train_samples = _subsample(sim, max_samples)
        say(f"exact statistics of {exact_samples} training samples, one pass per normalisation layer")
        figures = diag.statistics(sim, client_x, progress=lambda k, n, name: say(f"  layer {k}/{n} ({name})"))
        accuracy["global_buffers"] = figures.pop("diag/acc/aggregated")
        accuracy["exact"] = figures.pop("diag/acc/recalibrated")
        figures.pop("diag/acc/gap")
        layers = _by_layer(figures)
    weights = _by_layer(diag.hbn_batch_weights(sim), strip="batch_weight_")
    spread = _by_layer(diag.local_spread(sim))
    if resample > 0 and hasattr(method, "synced_state"):
        say(f"the method's re-sync with {resample} other client samples")
    result = {
        "run_dir": str(run_dir), "round": r, "method": sim.config.method, "norm": sim.config.norm,
        "personalized": bool(method.personalized), "accuracy": accuracy, "exact_samples": exact_samples, "train_samples": train_samples,
        "resampled": _resampled(sim, resample),
        "layers": layers, "hbn_batch_weight": weights, "local_spread": spread,
        "seconds": time.perf_counter() - start,
    }
    if write:
        (run_dir / DIAGNOSIS_FILE).write_text(json.dumps(result, indent=2) + "\n")
    return result


_LABELS = {
    "as_evaluated": "as the run evaluated",
    "deployed": "deployed (the method's last exchange)",
    "global_buffers": "the global model's statistics buffers",
    "exact": "exact statistics of the clients' union",
}


def _label(key: str, result: dict[str, Any]) -> str:
    if key == "exact" and (result.get("exact_samples") or 0) < (result.get("train_samples") or 0):
        return f"exact statistics of {result['exact_samples']} of {result['train_samples']}"
    return _LABELS[key]


def format_diagnosis(result: dict[str, Any]) -> str:
    """A short text report of :func:`diagnose_run`'s result."""
    lines = [f"{result['method']}+{result['norm']} at round {result['round']}: test accuracy of the same weights with"]
    acc = result["accuracy"]
    for key in _LABELS:
        if key in acc:
            lines.append(f"  {_label(key, result):<40} {100 * acc[key]:6.2f}%")
    res = result.get("resampled")
    if res:
        lines.append(f"  {'the same protocol, other client samples':<40} {100 * res['mean']:6.2f}% ± {100 * res['std']:.2f} "
                     f"(min {100 * res['min']:.2f}, max {100 * res['max']:.2f}; {res['samples']} samples of "
                     f"{res['clients_per_sample']} clients)")
    if "exact" in acc:
        gap = acc["exact"] - acc["as_evaluated"]
        why = ("lost to the statistics, not the weights" if gap > 0 else
               "the weights fit the statistics they were evaluated with; the exact ones do not help them")
        lines.append(f"  exact - as evaluated: {100 * gap:+.2f} points ({why})")
    if result["layers"]:
        lines.append("  per layer: aggregated mean shift |mu_g - mu*| / sigma*, |log var ratio|; clients' mean shift (max)")
        for name, f in result["layers"].items():
            lines.append(f"    {name:<20} {f.get('agg_mean_shift', float('nan')):7.3f} {f.get('agg_var_logratio', float('nan')):7.3f}   "
                         f"{f.get('client_mean_shift', float('nan')):7.3f} ({f.get('client_mean_shift_max', float('nan')):.3f})")
    if result["hbn_batch_weight"]:
        lines.append("  HBN batch weight sigmoid(-alpha) over clients x channels: mean (p10, p50, p90)")
        for name, f in result["hbn_batch_weight"].items():
            lines.append(f"    {name:<20} {f['mean']:.3f} ({f['p10']:.3f}, {f['p50']:.3f}, {f['p90']:.3f})")
    if result["local_spread"]:
        lines.append("  local statistics' spread across clients: means (std / pooled sigma), log variances (std)")
        for name, f in result["local_spread"].items():
            lines.append(f"    {name:<20} {f.get('mean_spread', float('nan')):.3f} {f.get('logvar_spread', float('nan')):.3f}")
    return "\n".join(lines)
