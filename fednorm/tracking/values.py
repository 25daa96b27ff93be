"""What the loggers record, computed once for all of them: the round's scalars, each client's
accuracy, the normalization layers' running statistics and HBN's mixing weights, and the
config flattened into parameters."""

from __future__ import annotations

import importlib
import json
import math
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError

__all__ = ["round_scalars", "client_scalars", "norm_tensors", "flat_params", "summary_scalars", "require"]

# Per-evaluation metrics logged as scalars (besides train_loss and lr, logged every round).
EVAL_SCALARS = ("test_accuracy", "test_loss", "mean_client_accuracy", "wall_seconds", "uplink_bytes", "downlink_bytes",
                "comm_rounds", "samples_trained")
# Namespaces of flat numeric metrics logged whole: the normalization diagnostics
# (fednorm.diagnostics, ``--diagnostics``) and the privacy accounting (fednorm.privacy, ``--dp-noise``).
SCALAR_NAMESPACES = ("diag/", "dp/")


def require(module: str, logger: str, extra: str) -> Any:
    """Import an optional package, or raise a :class:`ConfigError` that says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"--log {logger} needs the '{module.split('.')[0]}' package, which is not installed ({exc}); "
            f"install it with: pip install 'fednorm[{extra}]'"
        ) from None


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def round_scalars(record: Any) -> dict[str, float]:
    """``train_loss`` and ``lr`` of every round, and on an evaluation round the metrics of
    :data:`EVAL_SCALARS` and every ``diag/`` and ``dp/`` metric (a NaN or missing one is left out)."""
    out = {"train_loss": record.train_loss, "lr": record.lr}
    for name in EVAL_SCALARS:
        out[name] = record.metrics.get(name)
    out.update({k: v for k, v in record.metrics.items() if k.startswith(SCALAR_NAMESPACES)})
    return {k: float(v) for k, v in out.items() if _finite(v)}


def client_scalars(record: Any) -> dict[str, float]:
    """Each client's accuracy on its own test split (evaluation rounds): ``client_accuracy/<id>``."""
    accs = record.metrics.get("client_accuracies") or []
    return {f"client_accuracy/{cid}": float(a) for cid, a in enumerate(accs) if _finite(a)}


def norm_tensors(sim: Any) -> dict[str, torch.Tensor]:
    """The tensors worth a histogram: every BatchNorm-type layer's running mean and variance
    (the global ones where they are shared, all clients' concatenated where they stay local, as
    in FedBN) and HBN's per-channel weight on the batch statistics, ``sigmoid(-alpha)``, over
    all clients (``alpha`` is client-local)."""
    from ..nn.hbn import HybridBatchNorm

    out: dict[str, torch.Tensor] = {}
    shared = set(sim.method.shared_keys)
    bank: dict[int, dict[str, torch.Tensor]] | None = None

    def local_values(key: str) -> torch.Tensor | None:
        nonlocal bank
        if bank is None:
            bank = sim.collect_bank()
        rows = [s[key].detach().flatten().cpu() for _, s in sorted(bank.items()) if key in s]
        return torch.cat(rows) if rows else None

    for name, module in sim.model.named_modules():
        if not isinstance(module, nn.modules.batchnorm._BatchNorm):
            continue
        for buf in ("running_mean", "running_var"):
            key = f"{name}.{buf}"
            if key in shared and key in sim.global_state:
                out[f"norm/{key}"] = sim.global_state[key].detach().flatten().cpu()
            elif getattr(module, buf, None) is not None:
                values = local_values(key)
                if values is not None:
                    out[f"norm_local/{key}"] = values
        if isinstance(module, HybridBatchNorm):
            values = local_values(f"{name}.alpha")
            if values is not None:
                out[f"hbn_batch_weight/{name}"] = torch.sigmoid(-values.double())
    return {k: v.double() for k, v in out.items() if v.numel()}


def flat_params(config: Any) -> dict[str, str]:
    """The config as flat string parameters (``norm_args.num_groups``), for MLflow and W&B."""
    data = config.recorded() if hasattr(config, "recorded") else config.model_dump(mode="json")
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = value if isinstance(value, str) else json.dumps(value)

    walk("", data)
    return out


SUMMARY_SCALARS = ("final_test_accuracy", "best_test_accuracy", "last10_mean_test_accuracy", "final_mean_client_accuracy",
                   "final_test_loss", "wall_seconds", "uplink_bytes")


def summary_scalars(summary: dict[str, Any]) -> dict[str, float]:
    """The run's summary figures (``summary.json``) that are numbers."""
    return {k: float(summary[k]) for k in SUMMARY_SCALARS if _finite(summary.get(k))}
