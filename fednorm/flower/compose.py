"""What :class:`~fednorm.flower.method_strategy.MethodStrategy` and
:class:`~fednorm.flower.method_client.MethodClient` agree on: message fields and the method.

These are the pieces for a Flower app of your own (your ``ServerApp``, ``ClientApp``, model and
data), as opposed to the app ``fednorm flower-app`` writes. The messages follow the conventions of
Flower's Message-API strategies (``flwr.serverapp.strategy.FedAvg``):

- server → node (``"train"``, ``"evaluate"``, ``"query.fednorm"``): one ArrayRecord (``"arrays"``:
  the tensors the method broadcasts; a node's first message also holds the initial values of the
  tensors it keeps) and one ConfigRecord (``"config"``: your train/evaluate config plus
  ``server-round``, ``fednorm.method``, ``fednorm.method-args`` and, for queries, ``fednorm.query``);
- node → server, ``"train"``: one ArrayRecord (the method's shared tensors plus its uploads under
  ``upload/<name>``, e.g. HBN's statistics) and one MetricRecord with ``num-examples``;
- node → server, ``"query.fednorm"``: one ArrayRecord (``"answers"``).

A method's local tensors (FedBN's BatchNorm tensors, HBN's mixing logits) never travel upward;
the node keeps them, with the method's other per-client state, in ``context.state["fednorm.local"]``.
"""

from __future__ import annotations

import json
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message

from ..errors import ConfigError
from ..methods.base import Method
from ..methods.registry import get_method
from .appdir import check_round_based

__all__ = [
    "METHOD_KEY", "METHOD_ARGS_KEY", "QUERY_KEY", "QUERY_ACTION", "QUERY_TYPE", "UPLOAD_PREFIX", "STATE_KEY",
    "resolve_method", "method_config", "message_arrays", "message_config",
]

METHOD_KEY = "fednorm.method"
METHOD_ARGS_KEY = "fednorm.method-args"  # JSON of the method's options; absent when built from an instance
QUERY_KEY = "fednorm.query"  # the method's query name (HBN's "statistics")
QUERY_ACTION = "fednorm"
QUERY_TYPE = f"query.{QUERY_ACTION}"  # register it with @app.query("fednorm")
UPLOAD_PREFIX = "upload/"  # a method's uploads besides the shared tensors, in the train reply's ArrayRecord
STATE_KEY = "fednorm.local"  # the node's local tensors and method state, in context.state


def resolve_method(method: str | Method, method_args: dict[str, Any] | None = None) -> tuple[Method, str | None]:
    """The method object and the JSON of its options (``None`` when ``method`` is an instance, whose
    options the other side cannot rebuild). Lockstep methods (FedTAN) are refused."""
    if isinstance(method, Method):
        if method_args:
            raise ConfigError("give either a Method instance or a method name with method_args, not both")
        built, args_json = method, None
    elif isinstance(method, str):
        args = dict(method_args or {})
        built = get_method(method, **args)
        args_json = json.dumps(args, sort_keys=True)
    else:
        raise ConfigError(f"method must be a fednorm method name (e.g. 'fedbn') or a Method, got {type(method).__name__}")
    check_round_based(built.name, built.requires_lockstep)
    if built.has_client_gradient:
        raise ConfigError(f"method '{built.name}' replaces the gradients of every local step, which a ClientApp's own "
                          "training loop does not call; run it with `fednorm run` or `fednorm flower-app`")
    return built, args_json


def method_config(method: Method, args_json: str | None) -> dict[str, str]:
    """The ConfigRecord fields that name the method for the nodes."""
    out = {METHOD_KEY: method.name}
    if args_json is not None:
        out[METHOD_ARGS_KEY] = args_json
    return out


def message_arrays(msg: Message) -> tuple[str, ArrayRecord]:
    """The one ArrayRecord of a message, with its key."""
    records = list(msg.content.array_records.items())
    if len(records) != 1:
        raise ConfigError(f"a fednorm message holds exactly one ArrayRecord, this '{msg.metadata.message_type}' "
                          f"message holds {len(records)}; send it with fednorm.flower.MethodStrategy")
    return records[0]


def message_config(msg: Message) -> ConfigRecord:
    """The ConfigRecord that names the method (``fednorm.method``)."""
    for record in msg.content.config_records.values():
        if METHOD_KEY in record:
            return record
    raise ConfigError(f"this '{msg.metadata.message_type}' message names no fednorm method; the ServerApp must send it "
                      "with fednorm.flower.MethodStrategy")
