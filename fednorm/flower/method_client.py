"""The client side of a fednorm method inside your own Flower ClientApp.

:class:`MethodClient` wraps your training loop: :meth:`MethodClient.begin` loads your model with
the broadcast tensors and this node's own local ones (kept in ``context.state``) and runs the
method's code before training (HBN's statistics pass under the downloaded weights, HBN Eq. 7;
FBN's recorders of each step's batch statistics, FBN Algorithm 2); :meth:`ClientRound.reply`
runs its code after training (FBN's local copies of the running statistics, Algorithm 2 steps
5-7), keeps the local tensors on the node and replies with the shared ones and the method's
uploads. :meth:`MethodClient.answer` answers the server's statistics queries (HBN's re-sync and
round T+1, the initial passes of HBN and FBN).

For methods that run no code on the client (FedBN, SiloBN, FedAvg), :func:`keep_local_mod` turns
an unchanged Flower handler (``ArrayRecord(model.state_dict())`` in, the same out) into the
method's client: a Flower mod that puts this node's local tensors into each message before your
handler and takes them out of its reply.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from torch import nn

from ..errors import ConfigError
from ..methods.base import ClientContext, Method
from .compose import (
    METHOD_ARGS_KEY,
    METHOD_KEY,
    QUERY_KEY,
    STATE_KEY,
    UPLOAD_PREFIX,
    message_arrays,
    message_config,
    resolve_method,
)
from .records import record_to_tensors, tensors_to_record

__all__ = ["MethodClient", "ClientRound", "keep_local_mod"]


def _load_local(context: Context) -> dict[str, torch.Tensor] | None:
    return record_to_tensors(context.state[STATE_KEY]) if STATE_KEY in context.state else None


def _save_local(context: Context, local: dict[str, torch.Tensor]) -> None:
    context.state[STATE_KEY] = tensors_to_record(local)


def _client_id(context: Context) -> int:
    """The node's partition-id where it has one (stable across runs; it seeds a method's sampling), else its node id."""
    try:
        return int(context.node_config["partition-id"])
    except (KeyError, TypeError, ValueError):
        return int(context.node_id)


def _model_device(model: nn.Module) -> torch.device:
    tensor = next(iter(model.state_dict().values()), None)
    return tensor.device if tensor is not None else torch.device("cpu")


def _local_state(method: Method, received: dict[str, torch.Tensor], context: Context) -> dict[str, torch.Tensor]:
    """This node's local state: from ``context.state``, or on its first message the initial values
    the server sends with it (then stored)."""
    stored = _load_local(context)
    if stored is not None:
        return {k: v.to(_model_device_of(received)) for k, v in stored.items()}
    missing = sorted(method.local_keys - set(received))
    if missing:
        raise ConfigError(
            f"this node holds no local state for method '{method.name}' and the message carries no initial value "
            f"of {missing[:3]}: the node lost its context.state (a SuperNode restart or a new run), or the ServerApp "
            "does not use fednorm.flower.MethodStrategy")
    local = method.initial_client_state(_client_id(context), received)
    if local:
        _save_local(context, local)
    return local


def _model_device_of(tensors: dict[str, torch.Tensor]) -> torch.device:
    return next(iter(tensors.values())).device if tensors else torch.device("cpu")


class _NodeContext(ClientContext):
    """A :class:`ClientContext` whose data is optional: a method that needs it (HBN) says so."""

    def __init__(self, x: torch.Tensor | None, y: torch.Tensor | None, count: int | None, **kwargs: Any) -> None:
        self._xy = [x, y]
        self._count = count
        super().__init__(x=x, y=y, **kwargs)  # type: ignore[arg-type]

    def _get(self, i: int) -> torch.Tensor:
        value = self._xy[i]
        if value is None:
            raise ConfigError("this method reads the client's training data: pass x (and y) to MethodClient.begin / answer")
        return value

    def _set(self, i: int, value: torch.Tensor | None) -> None:
        self._xy[i] = value

    x = property(lambda self: self._get(0), lambda self, v: self._set(0, v))  # type: ignore[assignment]
    y = property(lambda self: self._get(1), lambda self, v: self._set(1, v))  # type: ignore[assignment]

    @property
    def num_examples(self) -> int:
        if self._xy[0] is not None:
            return len(self._xy[0])
        if self._count is not None:
            return self._count
        return len(self.x)  # raises the error above


class ClientRound:
    """One round of local training on a node, from :meth:`MethodClient.begin` to :meth:`reply`.

    Attributes:
        model: your model, loaded with the round's tensors.
        method: the fednorm method.
        context: the method's view of the round (``uploads``, ``local_state``, ...).
    """

    def __init__(self, msg: Message, node: Context, method: Method, context: ClientContext) -> None:
        self.msg, self.node, self.method, self.context = msg, node, method, context
        self.model = context.model
        self._steps = 0
        self._hook = self.model.register_forward_pre_hook(self._count_step)
        self._done = False

    def _count_step(self, module: nn.Module, args: Any) -> None:
        if module.training and torch.is_grad_enabled():
            self._steps += 1

    def loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to minimise given your data loss: the method's client loss (e.g. a proximal
        term), ``loss`` itself for FedBN, SiloBN, HBN and FBN."""
        return self.method.client_loss(self.context, self.model, loss)

    def reply(self, *, num_examples: int | None = None, num_steps: int | None = None,
              metrics: dict[str, int | float] | None = None) -> Message:
        """The train reply: the method's code after training (FBN's local copies), the local
        tensors kept in ``context.state``, the shared ones and the uploads sent.

        Args:
            num_examples: the weight of this node's update (default: ``len(x)`` given to ``begin``).
            num_steps: local steps taken (default: the model's training-mode forward passes with
                gradients since ``begin``).
            metrics: more MetricRecord entries (e.g. ``{"train-loss": 0.3}``; the same keys on every node).
        """
        if self._done:
            raise RuntimeError("ClientRound.reply() was already called for this round")
        self._done = True
        self._hook.remove()
        method, ctx = self.method, self.context
        method.client_end(ctx)
        state = self.model.state_dict()
        ctx.local_state.update({k: state[k].detach().clone() for k in method.local_keys})
        if ctx.local_state:
            _save_local(self.node, ctx.local_state)
        sent = {k: state[k] for k in method.shared_keys}
        sent.update({UPLOAD_PREFIX + k: v for k, v in ctx.uploads.items()})
        count = ctx.num_examples if num_examples is None else int(num_examples)
        values: dict[str, Any] = {"num-examples": count, "num-steps": self._steps if num_steps is None else int(num_steps)}
        values.update(metrics or {})
        return Message(RecordDict({"arrays": tensors_to_record(sent), "metrics": MetricRecord(values)}), reply_to=self.msg)


class MethodClient:
    """The client side of a fednorm method for your ClientApp's handlers.

    Args:
        method: the method, as given to the server's ``MethodStrategy`` (a name, with its options
            as keyword arguments, or a :class:`~fednorm.methods.Method`); ``None`` (the default)
            builds, per message, the method the server names with its options.

    Examples::

        client = MethodClient()

        @app.train()
        def train(msg, context):
            model, (x, y) = Net(), load_data(context)
            round = client.begin(msg, context, model, x, y)   # your model, ready to train
            my_training_loop(model, x, y)
            return round.reply()

        @app.evaluate()
        def evaluate(msg, context):
            model = client.load(msg, context, Net())           # this node's model to evaluate
            ...

        @app.query("fednorm")                                   # HBN's and FBN's statistics queries
        def query(msg, context):
            return client.answer(msg, context, Net(), *load_data(context))
    """

    def __init__(self, method: str | Method | None = None, **method_args: Any) -> None:
        self._given = None if method is None else resolve_method(method, method_args or None)

    @staticmethod
    def method_name(msg: Message) -> str:
        """The name of the method the server runs (to build the model it needs, e.g. HBN's layers)."""
        return str(message_config(msg)[METHOD_KEY])

    def method(self, msg: Message, model: nn.Module) -> Method:
        """The method of ``msg``, set up for ``model`` (its shared/local split)."""
        config = message_config(msg)
        name = str(config[METHOD_KEY])
        server_args = str(config[METHOD_ARGS_KEY]) if METHOD_ARGS_KEY in config else None
        if self._given is not None:
            method, args = self._given
            if method.name != name:
                raise ConfigError(f"the server runs method '{name}' and this ClientApp '{method.name}': build MethodClient "
                                  f"with '{name}' (or with no method, to take the server's)")
            if server_args is not None and args is not None and json.loads(server_args) != json.loads(args):
                raise ConfigError(f"method '{name}' runs with options {server_args} on the server and {args} here: give "
                                  "MethodClient the server's options (or no method, to take the server's)")
        elif server_args is None:
            raise ConfigError(f"the server's MethodStrategy was given a '{name}' Method instance, whose options cannot "
                              "travel: give MethodClient the same method")
        else:
            method, _ = resolve_method(name, json.loads(server_args))
        method.setup(model)
        return method

    def _prepare(self, msg: Message, context: Context, model: nn.Module) -> tuple[Method, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Load ``model`` with the message's tensors and this node's local ones."""
        method = self.method(msg, model)
        received = record_to_tensors(message_arrays(msg)[1], _model_device(model))
        local = _local_state(method, received, context)
        global_state = {k: v for k, v in received.items() if k not in method.local_keys}
        state = {**global_state, **{k: local[k] for k in method.local_keys}}
        missing = sorted(set(method.state_keys) - set(state))
        if missing:
            raise ConfigError(f"the message lacks {missing[:3]} of your model's state: the model here must be the "
                              "one given to MethodStrategy")
        model.load_state_dict({k: state[k] for k in method.state_keys})
        return method, global_state, local

    def load(self, msg: Message, context: Context, model: nn.Module) -> nn.Module:
        """``model`` loaded with the message's tensors and this node's own local ones: the model
        this node evaluates (FedBN: the shared weights with its own BatchNorm)."""
        self._prepare(msg, context, model)
        return model

    def begin(self, msg: Message, context: Context, model: nn.Module, x: torch.Tensor | None = None,
              y: torch.Tensor | None = None, *, num_examples: int | None = None) -> ClientRound:
        """Start a train round: load ``model`` (as :meth:`load`) and run the method's code before
        training (HBN's statistics pass over ``x``, FBN's recorders). Then train ``model`` with your
        own loop and return :meth:`ClientRound.reply`.

        ``x``, ``y``: this node's training data, read by HBN's statistics pass (``y`` only by its
        ``stats_samples="first_by_class"``); FedBN, SiloBN and FBN need neither, but then give
        ``num_examples`` (to ``begin`` or ``reply``), the weight of this node's update.
        """
        method, global_state, local = self._prepare(msg, context, model)
        config = message_config(msg)
        ctx = _NodeContext(x, y, num_examples, server_round=int(config.get("server-round", 0)),  # type: ignore[call-overload]
                           client_id=_client_id(context), model=model, global_state=global_state, local_state=local,
                           lr=float(config.get("lr", 0.0)))  # type: ignore[arg-type]
        method.client_begin(ctx)
        return ClientRound(msg, context, method, ctx)

    def answer(self, msg: Message, context: Context, model: nn.Module, x: torch.Tensor | None = None,
               y: torch.Tensor | None = None) -> Message:
        """The reply to the server's ``"query.fednorm"`` message: the method's client query (HBN's
        and FBN's ``"statistics"``: per layer, the exact count, mean and biased variance of its input
        over ``x``) on ``model`` loaded with the message's tensors and this node's local ones."""
        method, global_state, local = self._prepare(msg, context, model)
        config = message_config(msg)
        if QUERY_KEY not in config:
            raise ConfigError("this query message names no fednorm query (fednorm.query); send it with MethodStrategy")
        ctx = _NodeContext(x, y, None, server_round=int(config.get("server-round", 0)),  # type: ignore[call-overload]
                           client_id=_client_id(context), model=model, global_state=global_state, local_state=local)
        answers = method.client_query(str(config[QUERY_KEY]), ctx)
        return Message(RecordDict({"answers": tensors_to_record(answers)}), reply_to=msg)


_CLIENT_HOOKS = ("client_begin", "client_end", "client_loss", "client_query")


def keep_local_mod(method: str | Method, model: nn.Module, **method_args: Any) -> Callable[[Message, Context, Any], Message]:
    """A Flower mod that makes an unchanged handler the client of a method without client code.

    Your ``train``/``evaluate`` handlers keep loading ``msg.content["arrays"]`` into the model and
    (train) replying ``ArrayRecord(model.state_dict())``. Before a handler runs, the mod puts this
    node's local tensors (FedBN: every BatchNorm tensor, Li et al. 2021; SiloBN: the BatchNorm
    statistics, Andreux et al. 2020) into the message's ArrayRecord, from ``context.state`` (on
    the node's first message: the initial values the server sends); after a train handler, it
    keeps them from the reply's ArrayRecord and removes them, so they never reach the server.

    Args:
        method: ``"fedbn"``, ``"silobn"``, ``"fedavg"`` (or such a Method), as on the server.
        model: your model (its structure decides the local tensors).
        **method_args: the method's options with a name.

    Methods that run code on the client (HBN's statistics pass, FBN's statistics, ...) need
    :class:`MethodClient` and are refused.

    Examples::

        app = ClientApp(mods=[keep_local_mod("fedbn", Net())])
    """
    built, _ = resolve_method(method, method_args or None)
    built.setup(model)
    hooks = [h for h in _CLIENT_HOOKS if getattr(type(built), h) is not getattr(Method, h)]
    if hooks or built.dropped_keys:
        what = ", ".join(hooks) if hooks else f"server-computed tensors ({built.dropped_keys[:2]})"
        raise ConfigError(f"method '{built.name}' runs code on the client ({what}), which a mod cannot: call "
                          "fednorm.flower.MethodClient in your handlers instead")
    local_keys = set(built.local_keys)

    def mod(msg: Message, context: Context, call_next: Any) -> Message:
        kind = msg.metadata.message_type.split(".", 1)[0]
        if kind not in ("train", "evaluate") or not local_keys or msg.has_error():
            return call_next(msg, context)
        config = next((r for r in msg.content.config_records.values() if METHOD_KEY in r), None)
        if config is not None and str(config[METHOD_KEY]) != built.name:
            raise ConfigError(f"the server runs method '{config[METHOD_KEY]}' and this ClientApp's keep_local_mod "
                              f"'{built.name}': use the same method on both sides")
        key, record = message_arrays(msg)
        received = record_to_tensors(record)
        local = _local_state(built, received, context)
        msg.content[key] = tensors_to_record({**received, **{k: local[k] for k in local_keys}})
        reply = call_next(msg, context)
        if kind == "train" and not reply.has_error():
            reply_key, reply_record = message_arrays(reply)
            sent = record_to_tensors(reply_record)
            local.update({k: sent[k] for k in local_keys if k in sent})
            _save_local(context, local)
            reply.content[reply_key] = tensors_to_record({k: v for k, v in sent.items() if k not in local_keys})
        return reply

    return mod
