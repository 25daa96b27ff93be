"""Secure aggregation of a round's updates and statistics with Flower's SecAgg+ (issue 22): the
server learns only weighted sums over the clients, never one SuperNode's values.

A secure round has two exchanges:

1. the ordinary ``"train"`` message, marked ``secure``: each node trains the round's clients it
   hosts, keeps its **node vector** ``x_n = Σ_i w_i (θ_i − θ) / W_n`` (``w_i`` the method's client
   weights, ``W_n = Σ_i w_i`` over its clients; the shared floating tensors, BN running statistics
   of FedAvg+BN included) in its ``context.state``, and replies with the clients' metadata only
   (ids, sample counts, losses, steps);
2. Flower's :class:`~flwr.server.workflow.SecAggPlusWorkflow` (setup, share keys, collect masked
   vectors, unmask) with ``secaggplus_mod`` on the ClientApp (:func:`secure_mod`): in its
   collect stage each node's train handler returns ``(W_n, x_n)`` as a FitRes; the server
   unmasks ``Σ_n W_n x_n / Σ_n W_n``, the method's weighted mean update, and nothing else.

The engine then sees every client's row equal to ``θ + mean update``, so the method's weighted
mean, the round's accounting and metrics run unchanged. Values are clipped to
``±clipping_range`` and quantized to ``quantization_range`` levels by the protocol: the aggregate
equals the plain one to ``2 · clipping_range / quantization_range`` per node (tested).

Statistics travel as sums appended to the node vector, linear in the clients' values: HBN's
``[Σ c·mean, Σ c·(var + mean²), Σ c] / W_n`` (:func:`statistics_sums`, decoded exactly by
:func:`pooled_from_sums`), FBN's per-step ``[Σ K·u, Σ K·v, Σ K·u²] / W_n`` (:func:`step_sums`,
turned into rows whose Eq. 9-10 are the clients' own by :func:`fbn_rows_from_sums`); each layer's
segment is scaled by a public ``ΣW / M`` before quantization (:func:`layer_scales`). Statistics
queries outside the round (initial passes, HBN's re-sync and round T+1) go the same way. Methods whose server step needs more than such sums are refused by
:func:`check_secure`, saying why. docs/privacy.md describes it.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError

__all__ = ["SECURE_STATE_KEY", "check_secure", "node_vector", "secure_mod", "secure_mean", "fit_reply"]

SECURE_STATE_KEY = "fednorm.secure"  # the node's vector and weight, between the two exchanges
CLIPPING_RANGE = 64.0  # |update entries| above this are clipped by the protocol
QUANTIZATION_RANGE = 2**22
MODULUS_RANGE = 2**32


def check_secure(method: Any, config: Any) -> None:
    """Refuse what secure aggregation cannot run: the server must see only a weighted sum."""
    inner = getattr(method, "inner", method)
    why = None
    if getattr(inner, "requires_lockstep", False):
        why = "its clients exchange BN statistics and their gradients layer by layer inside the local step (FedTAN)"
    elif method.robust or config.attack != "none":
        why = (f"the aggregator '{config.aggregator}' (or nnm) needs each client's update, and secure aggregation "
               "reveals only their sum")
    elif inner.name == "fbn" and (inner.mode != "exact" or secure_steps(config) == 0):
        why = ("FBN's per-step statistics need the same number of steps on every SuperNode and the exact mode "
               "(set local_steps or dsgd; mode exact)")
    elif getattr(config, "dp_clip", None) is not None:
        why = "the differential-privacy mechanism runs in the in-process simulator only"
    if why is not None:
        raise ConfigError(f"secure aggregation does not work with method '{inner.name}': {why}")


def statistics_layers(keys: Any) -> list[str]:
    """The prefixes ``P`` of uploaded statistics ``P.count``, ``P.mean``, ``P.var`` (HBN's), sorted."""
    keys = set(keys)
    return sorted(k[: -len(".count")] for k in keys if k.endswith(".count") and f"{k[:-6]}.mean" in keys and f"{k[:-6]}.var" in keys)


def statistics_sums(rows: list[dict[str, torch.Tensor]], layers: list[str], total: float) -> torch.Tensor:
    """Per layer ``[Σ c·mean, Σ c·(var + mean²), Σ c] / total`` over ``rows`` (each a client's
    ``P.count``, ``P.mean``, biased ``P.var``): linear in the clients' values, so their secure
    sum gives the exact pooled statistics (HBN's Eq. 8) back (:func:`pooled_from_sums`)."""
    parts = []
    for p in layers:
        c = torch.stack([r[f"{p}.count"].double().reshape(()) for r in rows])
        m = torch.stack([r[f"{p}.mean"].double() for r in rows])
        v = torch.stack([r[f"{p}.var"].double() for r in rows])
        parts += [(c.unsqueeze(-1) * m).sum(0) / total, (c.unsqueeze(-1) * (v + m * m)).sum(0) / total,
                  c.sum().reshape(1) / total]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def step_sums(count: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, steps: int, total: float) -> torch.Tensor:
    """Per local step ``e`` ``[Σ_i K·u, Σ_i K·v, Σ_i K·u²] / total`` of FBN's one-step copies
    (``count [K, E']``, ``mean``/``var [K, E', C]``; steps beyond E' count 0), padded to ``steps``:
    what Eq. 9-10 need besides the public counts (:func:`fbn_rows_from_sums`)."""
    k, e_have, c = mean.shape
    out = torch.zeros(steps, 3, c, dtype=torch.float64)
    e = min(e_have, steps)
    w = count[:, :e].double().unsqueeze(-1)
    u, v = mean[:, :e].double(), var[:, :e].double()
    out[:e, 0] = (w * u).sum(0)
    out[:e, 1] = (w * v).sum(0)
    out[:e, 2] = (w * u * u).sum(0)
    return (out / total).reshape(-1)


def secure_layout(uploads: Any, steps: int = 0) -> str:
    """The statistics layers of an upload as JSON ``{prefix: [channels, steps]}``: steps 0 for
    pooled statistics (HBN's, the statistics queries), the local steps for FBN's per-step copies."""
    layers = statistics_layers(uploads)
    return json.dumps({p: [int(uploads[f"{p}.mean"].shape[-1]), steps if steps and uploads[f"{p}.count"].dim() == 2 else 0]
                       for p in layers})


def secure_steps(config: Any) -> int:
    """The local steps every client takes (FBN's per-step statistics need one length on every node)."""
    return 1 if config.dsgd else int(config.local_steps or 0)


def layer_scales(layout: dict[str, list[int]], counts: dict[str, torch.Tensor], weight: float) -> list[float]:
    """The public scale of each statistics layer's segment: ``ΣW / M``, M its smallest nonzero step
    count (pooled layers: its total count), so the scaled sums are of the statistics' magnitude."""
    out = []
    for p in layout:
        c = counts[p].double()
        per_step = c.sum(0).reshape(-1) if c.dim() else c.reshape(-1)
        nonzero = per_step[per_step > 0]
        out.append(weight / float(nonzero.min()) if len(nonzero) else 1.0)
    return out


def unscale(rest: torch.Tensor, layout: dict[str, list[int]], scales: list[float]) -> torch.Tensor:
    """:func:`layer_scales` undone on the aggregated statistics part."""
    out, start = rest.clone(), 0
    for (n, steps), s in zip(layout.values(), scales):
        size = steps * 3 * n if steps else 2 * n + 1
        out[start:start + size] /= s
        start += size
    return out


def pooled_from_sums(flat: torch.Tensor, layout: dict[str, list[int]], total: float) -> dict[str, tuple[float, torch.Tensor, torch.Tensor]]:
    """``{P: (count, mean, biased var)}`` of the union from the aggregated :func:`statistics_sums`
    (``total``: the weight they were divided by, summed over nodes); per-step layers are skipped."""
    out, start = {}, 0
    for p, (n, steps) in layout.items():
        if steps:
            start += steps * 3 * n
            continue
        s1, s2, c = flat[start:start + n] * total, flat[start + n:start + 2 * n] * total, float(flat[start + 2 * n]) * total
        start += 2 * n + 1
        mean = s1 / c
        out[p] = (c, mean, (s2 / c - mean * mean).clamp_min(0))
    return out


def fbn_rows_from_sums(flat: torch.Tensor, layout: dict[str, list[int]], total: float, counts: dict[str, torch.Tensor],
                       momenta: dict[str, float]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """For each per-step layer, every client's ``(mean, var) [K, E, C]`` rows such that FBN's
    Eq. 9-10 over them equal Eq. 9-10 over the clients' own copies: mean ``ū = ΣKu/M`` and
    variance ``ΣKv/M + (ΣKu²/M − ū²)/β`` (the between-client term moved into the variance; M the
    step's count, β the layer's momentum)."""
    out, start = {}, 0
    for p, (n, steps) in layout.items():
        if not steps:
            start += 2 * n + 1
            continue
        sums = flat[start:start + steps * 3 * n].reshape(steps, 3, n) * total
        start += steps * 3 * n
        k = counts[p].shape[0]
        m = counts[p].double().sum(0)  # [E]
        safe = m.clamp_min(1e-300).unsqueeze(-1)
        mean = sums[:, 0] / safe
        var = sums[:, 1] / safe + (sums[:, 2] / safe - mean * mean) / momenta[p]
        out[p] = (mean.unsqueeze(0).expand(k, -1, -1).clone(), var.unsqueeze(0).expand(k, -1, -1).clone())
    return out


def node_vector(method: Any, updates: Any, global_state: dict[str, torch.Tensor], steps: int = 0) -> tuple[np.ndarray, float, list[int]]:
    """``(x_n, W_n, segments)``: the node's weighted mean update over the shared floating tensors (in
    ``method.shared_keys`` order), then its clients' statistics as sums (pooled:
    :func:`statistics_sums`; FBN's per-step copies: :func:`step_sums` over ``steps`` steps), and
    its total weight, and the lengths of its segments (the update, then each statistics layer's).
    Refuses other uploads (e.g. SCAFFOLD's control variates)."""
    layers = statistics_layers(updates.extras)
    other = set(updates.extras) - {f"{p}.{s}" for p in layers for s in ("count", "mean", "var")}
    if other:
        raise ConfigError(f"secure aggregation covers model updates and statistics; this run also uploads {sorted(other)[:3]}")
    w = method.client_weights(updates).to(torch.float64)
    total = max(float(w.sum()), 1e-300)
    parts = []
    for k in method.shared_keys:
        if not global_state[k].is_floating_point():
            continue
        delta = updates.states[k].double() - global_state[k].double()
        parts.append(torch.tensordot(w, delta, dims=1).reshape(-1) / total)
    ex = updates.extras
    segments = [int(sum(t.numel() for t in parts))]  # the update, then one segment per statistics layer
    for p in layers:
        if steps and ex[f"{p}.count"].dim() == 2:
            parts.append(step_sums(ex[f"{p}.count"], ex[f"{p}.mean"], ex[f"{p}.var"], steps, total))
        else:
            rows = [{f"{p}.{s}": ex[f"{p}.{s}"][i] for s in ("count", "mean", "var")} for i in range(len(updates))]
            parts.append(statistics_sums(rows, [p], total))
        segments.append(int(parts[-1].numel()))
    return torch.cat(parts).numpy(), float(w.sum()), segments


def apply_mean(method: Any, global_state: dict[str, torch.Tensor], mean: np.ndarray) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``θ + mean update`` for the shared tensors (integer ones keep the global value), and the
    rest of the aggregated vector (the statistics sums)."""
    out, start = {}, 0
    flat = torch.from_numpy(np.asarray(mean, dtype=np.float64))
    for k in method.shared_keys:
        g = global_state[k]
        if not g.is_floating_point():
            out[k] = g.clone()
            continue
        n = g.numel()
        out[k] = (g.double() + flat[start:start + n].reshape(g.shape).to(g.device)).to(g.dtype)
        start += n
    return out, flat[start:]


# -- the ClientApp side ---------------------------------------------------------------------
def secure_mod(msg: Any, ctxt: Any, call_next: Any) -> Any:
    """``secaggplus_mod`` for the messages of the SecAgg+ workflow; fednorm's own ``"train"``
    messages pass through untouched (the mod would otherwise expect its configs in them)."""
    from flwr.client.mod import secaggplus_mod
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

    if RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, ctxt, call_next)
    return call_next(msg, ctxt)


def fit_reply(state: Any, content: Any) -> Any:
    """The collect stage's FitRes content: the node vector and weight kept by the train exchange,
    each statistics layer's segment multiplied by the server's public scale for it (``stats-scales``
    in the FitIns), which brings sums divided by the sample weights back to the statistics' own
    magnitude before quantization."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
    from flwr.compat.common import recorddict_compat as compat

    if SECURE_STATE_KEY not in state.array_records:
        raise ConfigError("secure aggregation: this node holds no vector for the round (its train message failed?)")
    record = state.array_records[SECURE_STATE_KEY]
    vector = record["vector"].numpy().copy()
    weight = float(record["weight"].numpy()[0])
    segments = [int(n) for n in record["segments"].numpy()]
    scales = json.loads(str(compat.recorddict_to_fitins(content, keep_input=True).config.get("stats-scales", "[]")))
    start = segments[0]
    for n, scale in zip(segments[1:], scales):  # one public scale per statistics layer
        vector[start:start + n] *= float(scale)
        start += n
    del state.array_records[SECURE_STATE_KEY]
    res = FitRes(Status(Code.OK, "fednorm"), ndarrays_to_parameters([vector]), int(round(weight)), {})
    return compat.fitres_to_recorddict(res, keep_input=True)


def keep_vector(state: Any, vector: np.ndarray, weight: float, segments: list[int]) -> None:
    """Keep the node vector, its weight and its segments' lengths until the collect stage."""
    from flwr.app import Array, ArrayRecord

    state.array_records[SECURE_STATE_KEY] = ArrayRecord({"vector": Array(np.ascontiguousarray(vector, dtype=np.float64)),
                                                         "weight": Array(np.array([weight], dtype=np.float64)),
                                                         "segments": Array(np.array(segments, dtype=np.int64))})


# -- the ServerApp side ---------------------------------------------------------------------
def secure_mean(grid: Any, nodes: list[int], server_round: int, max_weight: float, timeout: float | None,
                stats_scales: list[float] | None = None) -> np.ndarray:
    """Run SecAgg+ over ``nodes`` (at least 2) and return ``Σ_n W_n x_n / Σ_n W_n`` (each
    statistics layer's segment multiplied by its ``stats_scales`` entry, which every node applies;
    see :func:`fit_reply`)."""
    from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
    from flwr.common import FitIns, Parameters, parameters_to_ndarrays
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.strategy import Strategy
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key

    if len(nodes) < 2:
        raise ConfigError(f"secure aggregation needs at least 2 SuperNodes with clients in the round, got {len(nodes)}")
    captured: list[np.ndarray] = []

    class _Proxy:
        def __init__(self, node_id: int) -> None:
            self.node_id = node_id
            self.cid = str(node_id)

    class _Shim(Strategy):  # the workflow's legacy seams: which nodes, and where the sum goes
        def initialize_parameters(self, client_manager: Any) -> None:
            return None

        def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> list:
            return [(_Proxy(n), FitIns(Parameters(tensors=[], tensor_type="numpy.ndarray"), {"stats-scales": json.dumps([float(x) for x in (stats_scales or [])])}))
                    for n in nodes]

        def aggregate_fit(self, server_round: int, results: list, failures: list) -> tuple:
            if failures or not results:
                raise ConfigError(f"secure aggregation of round {server_round} failed on {len(failures)} node(s)")
            captured.append(parameters_to_ndarrays(results[0][1].parameters)[0])
            return results[0][1].parameters, {}

        def configure_evaluate(self, *args: Any) -> list:
            return []

        def aggregate_evaluate(self, *args: Any) -> tuple:
            return None, {}

        def evaluate(self, *args: Any) -> None:
            return None

    state = RecordDict({MAIN_CONFIGS_RECORD: ConfigRecord({Key.CURRENT_ROUND: server_round}),
                        MAIN_PARAMS_RECORD: ArrayRecord()})
    context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=state, run_config={}), strategy=_Shim())
    workflow = SecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=1.0, max_weight=max_weight,  # all nodes
                                  clipping_range=CLIPPING_RANGE, quantization_range=QUANTIZATION_RANGE,
                                  modulus_range=MODULUS_RANGE, timeout=timeout)
    workflow(grid, context)
    if not captured:
        raise ConfigError(f"secure aggregation of round {server_round} halted (a SuperNode dropped out; see Flower's log)")
    return captured[0]
