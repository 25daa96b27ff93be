"""fednorm's Flower ClientApp: every handler runs ``fednorm.flower.node.handle``.

Message types: ``"train"`` (local training of the node's clients of the round),
``"evaluate"`` (personalised evaluation), ``"query"`` (a method's client query, e.g. HBN's
statistics pass) and ``"query.bank"`` (the clients' local state, for checkpoints).
"""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from . import protocol
from .node import handle
from .secure import fit_reply, secure_mod

__all__ = ["app"]

app = ClientApp()


def _reply(msg: Message, context: Context) -> Message:
    content = handle(msg.metadata.message_type, msg.content, context.state, context.node_config)
    return Message(content, reply_to=msg)


@app.train(mods=[secure_mod])
def train(msg: Message, context: Context) -> Message:
    if "fednorm" not in msg.content.config_records:  # SecAgg+'s collect stage (fednorm.flower.secure)
        return Message(fit_reply(context.state, msg.content), reply_to=msg)
    return _reply(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return _reply(msg, context)


@app.query()
def query(msg: Message, context: Context) -> Message:
    return _reply(msg, context)


@app.query(protocol.BANK.split(".", 1)[1])
def bank(msg: Message, context: Context) -> Message:
    return _reply(msg, context)
