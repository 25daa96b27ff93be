"""fednorm's round data as Flower records, and back.

Flower messages carry only ``ArrayRecord`` (tensors), ``MetricRecord`` and ``ConfigRecord``
(scalars, strings, lists). Tensors go in ArrayRecords with their dtype kept (int64 counters
stay int64); bfloat16, which numpy cannot hold, travels as float32 under a key marked
``::bfloat16`` and is cast back exactly. Nested server state (a method's ``state_dict``: dicts
of tensors and numbers) is split into an ArrayRecord of its tensors and a JSON skeleton.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from flwr.app import Array, ArrayRecord

from ..methods.base import ClientUpdates

__all__ = [
    "tensors_to_record",
    "record_to_tensors",
    "pack_tree",
    "unpack_tree",
    "updates_to_record",
    "record_to_updates",
    "bank_to_record",
    "record_to_bank",
]

_BF16 = "::bfloat16"


def tensors_to_record(tensors: dict[str, torch.Tensor]) -> ArrayRecord:
    """An ArrayRecord of CPU copies of ``tensors`` (keys and dtypes kept)."""
    out = ArrayRecord()
    for key, t in tensors.items():
        t = t.detach().cpu()
        if t.dtype == torch.bfloat16:
            out[key + _BF16] = Array(t.to(torch.float32).contiguous())
        else:
            out[key] = Array(t.contiguous())
    return out


def record_to_tensors(record: ArrayRecord, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of an ArrayRecord written by :func:`tensors_to_record`."""
    out: dict[str, torch.Tensor] = {}
    for key, array in record.items():
        t = torch.from_numpy(array.numpy().copy())
        if key.endswith(_BF16):
            key, t = key[: -len(_BF16)], t.to(torch.bfloat16)
        out[key] = t.to(device)
    return out


def pack_tree(tree: Any) -> tuple[dict[str, torch.Tensor], str]:
    """Split nested dicts/lists of tensors and JSON values into (tensors, JSON skeleton).

    Dict keys may be str or int (a bank is keyed by client id); both survive the round trip.
    """
    tensors: dict[str, torch.Tensor] = {}

    def enc(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            key = f"t{len(tensors)}"
            tensors[key] = x
            return {"__tensor__": key}
        if isinstance(x, dict):
            return {"__dict__": [[k, enc(v)] for k, v in x.items()]}
        if isinstance(x, (list, tuple)):
            return [enc(v) for v in x]
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise TypeError(f"cannot send a {type(x).__name__} in a Flower message")

    return tensors, json.dumps(enc(tree))


def unpack_tree(tensors: dict[str, torch.Tensor], skeleton: str) -> Any:
    """The inverse of :func:`pack_tree`."""

    def dec(x: Any) -> Any:
        if isinstance(x, dict):
            if "__tensor__" in x:
                return tensors[x["__tensor__"]]
            return {k: dec(v) for k, v in x["__dict__"]}
        if isinstance(x, list):
            return [dec(v) for v in x]
        return x

    return dec(json.loads(skeleton))


def updates_to_record(updates: ClientUpdates) -> tuple[ArrayRecord, dict[str, Any]]:
    """A node's :class:`ClientUpdates` as an ArrayRecord (stacked rows) plus ConfigRecord values
    (client ids, failures)."""
    tensors = {f"state/{k}": v for k, v in updates.states.items()}
    tensors.update({f"extra/{k}": v for k, v in updates.extras.items()})
    tensors.update({"num_examples": updates.num_examples, "train_loss": updates.train_loss, "num_steps": updates.num_steps})
    if updates.seconds is not None:
        tensors["seconds"] = updates.seconds
    meta = {"client-ids": [int(c) for c in updates.client_ids], "failures": json.dumps({str(c): r for c, r in updates.failures.items()})}
    return tensors_to_record(tensors), meta


def record_to_updates(record: ArrayRecord, meta: Any) -> ClientUpdates:
    """The inverse of :func:`updates_to_record` (``meta`` is the ConfigRecord)."""
    t = record_to_tensors(record)
    return ClientUpdates(
        client_ids=[int(c) for c in meta["client-ids"]],
        states={k[len("state/"):]: v for k, v in t.items() if k.startswith("state/")},
        num_examples=t["num_examples"],
        train_loss=t["train_loss"],
        num_steps=t["num_steps"],
        extras={k[len("extra/"):]: v for k, v in t.items() if k.startswith("extra/")},
        failures={int(c): r for c, r in json.loads(meta["failures"]).items()},
        seconds=t.get("seconds"),
    )


def bank_to_record(bank: dict[int, dict[str, torch.Tensor]]) -> ArrayRecord:
    """Clients' local states (``{client: {name: tensor}}``) as one ArrayRecord, keys ``"<client>/<name>"``."""
    return tensors_to_record({f"{cid}/{name}": t for cid, state in bank.items() for name, t in state.items()})


def record_to_bank(record: ArrayRecord, device: torch.device | str = "cpu") -> dict[int, dict[str, torch.Tensor]]:
    """The inverse of :func:`bank_to_record`."""
    bank: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in record_to_tensors(record, device).items():
        cid, name = key.split("/", 1)
        bank.setdefault(int(cid), {})[name] = t
    return bank
